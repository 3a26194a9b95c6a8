//! Labs, users, memberships, and the secrets that stand for them: personal access
//! tokens and agent enrolment tokens. Secrets are random, shown once, stored as SHA-256.

use super::models::{Lab, Role, User};
use super::schema::*;
use super::types::Json;
use super::DbError;
use super::{now, DbConn};
use crate::domain::MembershipSource;
use crate::insert_returning_id;
use commons_sched::Quota;
use diesel::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// A fresh secret with a recognisable prefix (so leaked ones are easy to grep for).
pub fn new_secret(prefix: &str) -> String {
    format!("{prefix}_{}", hex::encode(rand::random::<[u8; 24]>()))
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

pub fn create_lab(c: &mut DbConn, slug: &str, name: &str) -> Result<Lab, DbError> {
    commons_api::rules::slug("slug", slug)?;
    if name.trim().is_empty() || name.len() > 200 {
        return Err(DbError::invalid(
            "name",
            "a lab needs a name of 1 to 200 characters",
        ));
    }
    let exists: i64 = labs::table
        .filter(labs::slug.eq(slug))
        .count()
        .get_result(c)?;
    if exists > 0 {
        return Err(DbError::conflict(
            "lab_exists",
            format!("lab {slug:?} exists already"),
        ));
    }
    let id = insert_returning_id!(
        c,
        diesel::insert_into(labs::table).values((
            labs::slug.eq(slug),
            labs::name.eq(name.trim()),
            labs::created_at.eq(now()),
        )),
        labs::id
    )?;
    Ok(labs::table.find(id).select(Lab::as_select()).first(c)?)
}

/// The lab `slug`, or an error naming the field `lab` (for operator commands).
pub fn lab_by_slug(c: &mut DbConn, slug: &str) -> Result<Lab, DbError> {
    find_lab(c, slug)?.ok_or_else(|| DbError::invalid("lab", format!("no lab {slug:?}")))
}

pub fn find_lab(c: &mut DbConn, slug: &str) -> Result<Option<Lab>, DbError> {
    Ok(labs::table
        .filter(labs::slug.eq(slug))
        .select(Lab::as_select())
        .first(c)
        .optional()?)
}

pub fn lab_by_id(c: &mut DbConn, id: i64) -> Result<Lab, DbError> {
    labs::table
        .find(id)
        .select(Lab::as_select())
        .first(c)
        .optional()?
        .ok_or(DbError::NotFound("lab"))
}

/// Slugs of the labs `ids` (one query).
pub fn lab_slugs(c: &mut DbConn, ids: &[i64]) -> Result<BTreeMap<i64, String>, DbError> {
    Ok(labs::table
        .filter(labs::id.eq_any(ids))
        .select((labs::id, labs::slug))
        .load::<(i64, String)>(c)?
        .into_iter()
        .collect())
}

/// Every lab's (id, slug).
pub fn all_lab_slugs(c: &mut DbConn) -> Result<Vec<(i64, String)>, DbError> {
    Ok(labs::table
        .order(labs::id)
        .select((labs::id, labs::slug))
        .load(c)?)
}

/// Replaces the lab's borrowing quota (`borrowing`) or its members' default quota.
pub fn set_lab_quota(c: &mut DbConn, lab: i64, borrowing: bool, json: &str) -> Result<(), DbError> {
    let row = diesel::update(labs::table.find(lab));
    if borrowing {
        row.set(labs::quota.eq(json)).execute(c)?;
    } else {
        row.set(labs::member_quota.eq(json)).execute(c)?;
    }
    Ok(())
}

/// Turns the lab's priority boost for interactive jobs on or off.
pub fn set_interactive_boost(c: &mut DbConn, lab: i64, on: bool) -> Result<(), DbError> {
    diesel::update(labs::table.find(lab))
        .set(labs::interactive_boost.eq(on))
        .execute(c)?;
    Ok(())
}

/// One person's membership of one lab.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = memberships)]
pub struct Membership {
    pub user_id: i64,
    pub lab_id: i64,
    pub role: Role,
    pub quota: Json<Quota>,
    pub source: MembershipSource,
}

pub fn membership(c: &mut DbConn, lab: i64, user: i64) -> Result<Option<Membership>, DbError> {
    Ok(memberships::table
        .filter(memberships::lab_id.eq(lab))
        .filter(memberships::user_id.eq(user))
        .select(Membership::as_select())
        .first(c)
        .optional()?)
}

/// A lab's members with their usernames, by username.
pub fn members_of(c: &mut DbConn, lab: i64) -> Result<Vec<(String, Membership)>, DbError> {
    Ok(memberships::table
        .inner_join(users::table)
        .filter(memberships::lab_id.eq(lab))
        .order(users::username)
        .select((users::username, Membership::as_select()))
        .load(c)?)
}

/// A user's memberships, whatever their labs.
pub fn memberships_of(c: &mut DbConn, user: i64) -> Result<Vec<Membership>, DbError> {
    Ok(memberships::table
        .filter(memberships::user_id.eq(user))
        .select(Membership::as_select())
        .load(c)?)
}

/// Adds a membership, or changes its role and source; a member's own quota stays.
pub fn upsert_membership(
    c: &mut DbConn,
    user: i64,
    lab: i64,
    role: Role,
    source: MembershipSource,
) -> Result<(), DbError> {
    let changed = diesel::update(
        memberships::table
            .filter(memberships::user_id.eq(user))
            .filter(memberships::lab_id.eq(lab)),
    )
    .set((memberships::role.eq(role), memberships::source.eq(source)))
    .execute(c)?;
    if changed == 0 {
        diesel::insert_into(memberships::table)
            .values((
                memberships::user_id.eq(user),
                memberships::lab_id.eq(lab),
                memberships::role.eq(role),
                memberships::source.eq(source),
            ))
            .execute(c)?;
    }
    Ok(())
}

pub fn remove_membership(c: &mut DbConn, user: i64, lab: i64) -> Result<(), DbError> {
    diesel::delete(
        memberships::table
            .filter(memberships::user_id.eq(user))
            .filter(memberships::lab_id.eq(lab)),
    )
    .execute(c)?;
    Ok(())
}

pub fn set_member_quota(c: &mut DbConn, lab: i64, user: i64, json: &str) -> Result<(), DbError> {
    diesel::update(
        memberships::table
            .filter(memberships::lab_id.eq(lab))
            .filter(memberships::user_id.eq(user)),
    )
    .set(memberships::quota.eq(json))
    .execute(c)?;
    Ok(())
}

pub fn create_user(
    c: &mut DbConn,
    username: &str,
    email: &str,
    operator: bool,
) -> Result<User, DbError> {
    commons_api::rules::username(username)?;
    if !email.contains('@') || email.len() > 320 {
        return Err(DbError::invalid("email", "an e-mail address needs an @"));
    }
    let exists: i64 = users::table
        .filter(users::username.eq(username))
        .count()
        .get_result(c)?;
    if exists > 0 {
        return Err(DbError::conflict(
            "user_exists",
            format!("user {username:?} exists already"),
        ));
    }
    let id = insert_returning_id!(
        c,
        diesel::insert_into(users::table).values((
            users::username.eq(username),
            users::email.eq(email),
            users::display_name.eq(username),
            users::is_operator.eq(operator),
            users::operator_manual.eq(operator),
            users::created_at.eq(now()),
        )),
        users::id
    )?;
    user_by_id(c, id)
}

/// User names by id (one query).
pub fn usernames(c: &mut DbConn, ids: &[i64]) -> Result<BTreeMap<i64, String>, DbError> {
    Ok(users::table
        .filter(users::id.eq_any(ids))
        .select((users::id, users::username))
        .load::<(i64, String)>(c)?
        .into_iter()
        .collect())
}

pub fn user_by_id(c: &mut DbConn, id: i64) -> Result<User, DbError> {
    users::table
        .find(id)
        .select(User::as_select())
        .first(c)
        .optional()?
        .ok_or(DbError::NotFound("user"))
}

pub fn user_by_name(c: &mut DbConn, username: &str) -> Result<Option<User>, DbError> {
    Ok(users::table
        .filter(users::username.eq(username))
        .select(User::as_select())
        .first(c)
        .optional()?)
}

/// The user an SSO identity (issuer, subject) belongs to.
pub fn user_by_identity(
    c: &mut DbConn,
    issuer: &str,
    subject: &str,
) -> Result<Option<User>, DbError> {
    Ok(users::table
        .filter(users::oidc_issuer.eq(issuer))
        .filter(users::oidc_subject.eq(subject))
        .select(User::as_select())
        .first(c)
        .optional()?)
}

/// A user first seen through SSO; returns the id.
pub fn insert_sso_user(
    c: &mut DbConn,
    username: &str,
    email: &str,
    name: &str,
) -> Result<i64, DbError> {
    Ok(insert_returning_id!(
        c,
        diesel::insert_into(users::table).values((
            users::username.eq(username),
            users::email.eq(email),
            users::display_name.eq(name),
            users::is_operator.eq(false),
            users::created_at.eq(now()),
        )),
        users::id
    )?)
}

/// Binds a user to an SSO identity and refreshes the profile and operator flag.
pub fn set_identity(
    c: &mut DbConn,
    user: i64,
    id: &crate::domain::Identity,
    operator: bool,
) -> Result<(), DbError> {
    diesel::update(users::table.find(user))
        .set((
            users::oidc_issuer.eq(&id.issuer),
            users::oidc_subject.eq(&id.subject),
            users::email.eq(&id.email),
            users::display_name.eq(&id.name),
            users::is_operator.eq(operator),
        ))
        .execute(c)?;
    Ok(())
}

pub fn user_by_email(c: &mut DbConn, email: &str) -> Result<Option<User>, DbError> {
    Ok(users::table
        .filter(users::email.eq(email))
        .select(User::as_select())
        .first(c)
        .optional()?)
}

pub fn all_users(c: &mut DbConn) -> Result<Vec<User>, DbError> {
    Ok(users::table
        .order(users::username)
        .select(User::as_select())
        .load(c)?)
}

/// Adds or changes a membership by hand (operator commands, the demo).
pub fn set_membership(c: &mut DbConn, user: i64, lab: i64, role: Role) -> Result<(), DbError> {
    upsert_membership(c, user, lab, role, MembershipSource::Manual)
}

/// The labs a user belongs to, by slug.
pub fn labs_of(c: &mut DbConn, user: i64) -> Result<Vec<(Lab, Role)>, DbError> {
    Ok(memberships::table
        .inner_join(labs::table)
        .filter(memberships::user_id.eq(user))
        .order(labs::slug)
        .select((Lab::as_select(), memberships::role))
        .load(c)?)
}

/// Creates a personal access token that never expires; returns the secret (shown once).
pub fn create_api_token(c: &mut DbConn, user: i64, name: &str) -> Result<String, DbError> {
    create_api_token_until(c, user, name, None)
}

/// Creates a personal access token valid until `expires_at`, with every right; returns
/// the secret.
pub fn create_api_token_until(
    c: &mut DbConn,
    user: i64,
    name: &str,
    expires_at: Option<chrono::NaiveDateTime>,
) -> Result<String, DbError> {
    create_scoped_api_token(c, user, name, expires_at, true)
}

/// Creates a personal access token valid until `expires_at`; `can_add_credentials`: it may
/// add SSH keys and make more tokens. Returns the secret.
pub fn create_scoped_api_token(
    c: &mut DbConn,
    user: i64,
    name: &str,
    expires_at: Option<chrono::NaiveDateTime>,
    can_add_credentials: bool,
) -> Result<String, DbError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(DbError::invalid(
            "name",
            "name the token (1 to 100 characters), e.g. after the laptop that uses it",
        ));
    }
    let secret = new_secret("gcp");
    diesel::insert_into(api_tokens::table)
        .values((
            api_tokens::user_id.eq(user),
            api_tokens::name.eq(name),
            api_tokens::token_hash.eq(hash_secret(&secret)),
            api_tokens::created_at.eq(now()),
            api_tokens::expires_at.eq(expires_at),
            api_tokens::can_add_credentials.eq(can_add_credentials),
        ))
        .execute(c)?;
    Ok(secret)
}

/// A token as its owner sees it (never the secret).
#[derive(Debug, Clone, Queryable, serde::Serialize)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub created_at: chrono::NaiveDateTime,
    pub expires_at: Option<chrono::NaiveDateTime>,
    pub last_used_at: Option<chrono::NaiveDateTime>,
    pub revoked_at: Option<chrono::NaiveDateTime>,
}

pub fn tokens_of(c: &mut DbConn, user: i64) -> Result<Vec<TokenInfo>, DbError> {
    Ok(api_tokens::table
        .filter(api_tokens::user_id.eq(user))
        .order(api_tokens::id.desc())
        .select((
            api_tokens::id,
            api_tokens::name,
            api_tokens::created_at,
            api_tokens::expires_at,
            api_tokens::last_used_at,
            api_tokens::revoked_at,
        ))
        .load(c)?)
}

/// Revokes one of the user's own tokens.
pub fn revoke_token(c: &mut DbConn, user: i64, id: i64) -> Result<(), DbError> {
    let n = diesel::update(
        api_tokens::table
            .find(id)
            .filter(api_tokens::user_id.eq(user))
            .filter(api_tokens::revoked_at.is_null()),
    )
    .set(api_tokens::revoked_at.eq(now()))
    .execute(c)?;
    if n == 0 {
        return Err(DbError::NotFound("token"));
    }
    Ok(())
}

/// A user with their labs and their role in each.
pub type UserWithLabs = (User, Vec<(Lab, Role)>);

/// The user a personal access token belongs to, if it is valid, with their labs and
/// roles (one query); records its use when the last one recorded is over
/// [`TOKEN_USE_SLACK_S`] old.
pub fn user_by_token(c: &mut DbConn, secret: &str) -> Result<Option<UserWithLabs>, DbError> {
    Ok(token_holder(c, secret)?.map(|(user, labs, _)| (user, labs)))
}

/// A token's user, their labs and roles, and whether the token may add SSH keys and make
/// more tokens.
pub type TokenHolder = (User, Vec<(Lab, Role)>, bool);

/// [`user_by_token`], with the token's right to add credentials.
pub fn token_holder(c: &mut DbConn, secret: &str) -> Result<Option<TokenHolder>, DbError> {
    let t = now();
    type Row = (
        i64,
        Option<chrono::NaiveDateTime>,
        bool,
        User,
        Option<Lab>,
        Option<Role>,
    );
    let rows: Vec<Row> = api_tokens::table
        .inner_join(users::table.left_join(memberships::table.inner_join(labs::table)))
        .filter(api_tokens::token_hash.eq(hash_secret(secret)))
        .filter(api_tokens::revoked_at.is_null())
        .filter(
            api_tokens::expires_at
                .is_null()
                .or(api_tokens::expires_at.gt(t)),
        )
        .order(labs::slug)
        .select((
            api_tokens::id,
            api_tokens::last_used_at,
            api_tokens::can_add_credentials,
            User::as_select(),
            Option::<Lab>::as_select(),
            memberships::role.nullable(),
        ))
        .load(c)?;
    let Some((token_id, last_used, can_add_credentials, user, ..)) = rows.first().cloned() else {
        return Ok(None);
    };
    let labs = rows
        .into_iter()
        .filter_map(|(.., lab, role)| Some((lab?, role?)))
        .collect();
    // "Last used" is shown to the minute: a script's every call need not write (and wait
    // for a commit to reach the disk) to keep it so.
    let stale = t - chrono::Duration::seconds(TOKEN_USE_SLACK_S);
    if last_used.is_none_or(|u| u < stale) {
        diesel::update(api_tokens::table.find(token_id))
            .set(api_tokens::last_used_at.eq(t))
            .execute(c)?;
    }
    Ok(Some((user, labs, can_add_credentials)))
}

/// How far a token's recorded last use may lag behind its real last use.
pub const TOKEN_USE_SLACK_S: i64 = 60;

/// How long an enrolment token stays valid.
pub const ENROL_TOKEN_TTL_H: i64 = 24;

/// Creates a one-time enrolment token for a lab; returns the secret.
pub fn create_enrol_token(c: &mut DbConn, lab: i64) -> Result<String, DbError> {
    let secret = new_secret("gce");
    diesel::insert_into(enrol_tokens::table)
        .values((
            enrol_tokens::lab_id.eq(lab),
            enrol_tokens::token_hash.eq(hash_secret(&secret)),
            enrol_tokens::created_at.eq(now()),
            enrol_tokens::expires_at.eq(now() + chrono::Duration::hours(ENROL_TOKEN_TTL_H)),
        ))
        .execute(c)?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::sqlite;
    use diesel::connection::{Connection, InstrumentationEvent};
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_token_in_use_is_one_read_and_its_use_is_written_once_a_minute() {
        let (_d, mut c) = sqlite();
        let user = create_user(&mut c, "alice", "alice@x.test", false).unwrap();
        let secret = create_api_token(&mut c, user.id, "script").unwrap();
        // A user in no lab is found too, with no labs.
        assert!(user_by_token(&mut c, &secret)
            .unwrap()
            .unwrap()
            .1
            .is_empty());
        for (slug, role) in [("vision", Role::Member), ("physics", Role::Admin)] {
            let lab = create_lab(&mut c, slug, slug).unwrap();
            set_membership(&mut c, user.id, lab.id, role).unwrap();
        }
        diesel::update(api_tokens::table)
            .set(api_tokens::last_used_at.eq(None::<chrono::NaiveDateTime>))
            .execute(&mut c)
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = e {
                s.lock().unwrap().push(query.to_string());
            }
        });
        let last_used = |c: &mut DbConn| -> Option<chrono::NaiveDateTime> {
            api_tokens::table
                .select(api_tokens::last_used_at)
                .first(c)
                .unwrap()
        };
        // First use: the read and the write.
        assert_eq!(
            user_by_token(&mut c, &secret).unwrap().unwrap().0.id,
            user.id
        );
        assert_eq!(seen.lock().unwrap().len(), 2, "{:?}", seen.lock().unwrap());
        let first = last_used(&mut c).unwrap();
        // With the labs and roles that labs_of lists.
        let slugs = |labs: Vec<(Lab, Role)>| -> Vec<(String, Role)> {
            labs.into_iter().map(|(l, r)| (l.slug, r)).collect()
        };
        let (_, labs) = user_by_token(&mut c, &secret).unwrap().unwrap();
        assert_eq!(slugs(labs), slugs(labs_of(&mut c, user.id).unwrap()));
        assert_eq!(labs_of(&mut c, user.id).unwrap().len(), 2);
        // Within the minute: the read only.
        seen.lock().unwrap().clear();
        assert_eq!(
            user_by_token(&mut c, &secret).unwrap().unwrap().0.id,
            user.id
        );
        assert_eq!(seen.lock().unwrap().len(), 1, "{:?}", seen.lock().unwrap());
        // A minute later, written again.
        let old = first - chrono::Duration::seconds(TOKEN_USE_SLACK_S + 1);
        diesel::update(api_tokens::table)
            .set(api_tokens::last_used_at.eq(old))
            .execute(&mut c)
            .unwrap();
        assert!(user_by_token(&mut c, &secret).unwrap().is_some());
        assert!(last_used(&mut c).unwrap() > old);
        // Unknown and revoked tokens find no one.
        assert!(user_by_token(&mut c, "gct_nope").unwrap().is_none());
        diesel::update(api_tokens::table)
            .set(api_tokens::revoked_at.eq(now()))
            .execute(&mut c)
            .unwrap();
        assert!(user_by_token(&mut c, &secret).unwrap().is_none());
    }
}
