//! Signing in with campus SSO: users keyed by (issuer, subject), and memberships kept in
//! step with the groups the provider sends.
//!
//! Memberships granted by group rules (`source = 'sso'`) are refreshed at every login:
//! added, changed, or removed when the group is gone. Memberships a lab admin granted
//! by hand (`source = 'manual'`) are never touched by a login. Each change a login makes
//! is in the lab's audit log (`sso_member`, `sso_remove_member`, by the user signing in).
//!
//! Linking: a first SSO login takes over an account the operators made by hand (same
//! name, same e-mail, no identity yet) only when the provider says the e-mail is
//! verified, and never an operator's account: claims alone must not make anyone an
//! operator. Otherwise the login gets an account of its own (`alice-2`).

use crate::db::models::User;
use crate::db::{self, users as accounts, DbConn};
use crate::domain::MembershipSource;
use crate::error::AppError;
use crate::identity::{grants, GroupRules, Identity};
use crate::service::Ctx;

/// A username for a new SSO user: the provider's, made safe, made unique.
fn free_username(c: &mut DbConn, wanted: &str) -> Result<String, AppError> {
    let base: String = wanted
        .chars()
        .filter(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(*ch))
        .take(56)
        .collect();
    let base = if base.is_empty() {
        "user".to_string()
    } else {
        base
    };
    let mut n = 1u64;
    loop {
        let candidate = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        if accounts::user_by_name(c, &candidate)?.is_none() {
            return Ok(candidate);
        }
        n += 1;
    }
}

/// May this first login take over the hand-made account `u`?
fn may_link(u: &User, id: &Identity) -> bool {
    u.oidc_issuer.is_none()
        && !u.operator_manual
        && !u.is_operator
        && id.email_verified
        && !id.email.is_empty()
        && u.email.eq_ignore_ascii_case(&id.email)
}

/// [`sign_in`] in one transaction of its own.
pub async fn signed_in(ctx: &Ctx, id: Identity, rules: GroupRules) -> Result<User, AppError> {
    ctx.db.run(move |c| sign_in(c, &id, &rules)).await
}

/// Finds or creates the user for `id`, refreshes profile, operator flag and group
/// memberships; returns the user.
pub fn sign_in(c: &mut DbConn, id: &Identity, rules: &GroupRules) -> Result<User, AppError> {
    db::transaction(c, |c| {
        let existing = accounts::user_by_identity(c, &id.issuer, &id.subject)?;
        let user_id = match existing {
            Some(u) => u.id,
            None => {
                // An account the operators made by hand for the same person (same name and
                // e-mail, no identity yet) is linked rather than duplicated.
                let manual = accounts::user_by_name(c, &id.username)?.filter(|u| may_link(u, id));
                match manual {
                    Some(u) => u.id,
                    None => {
                        let name = free_username(c, &id.username)?;
                        accounts::insert_sso_user(c, &name, &id.email, &id.name)?
                    }
                }
            }
        };
        let user = accounts::user_by_id(c, user_id)?;
        let granted = grants(rules, &id.groups);
        accounts::set_identity(c, user_id, id, user.operator_manual || granted.operator)?;

        let current = accounts::memberships_of(c, user_id)?;
        let mut wanted_labs = Vec::new();
        for (slug, role) in &granted.labs {
            let lab = match accounts::lab_by_slug(c, slug) {
                Ok(l) => l,
                Err(_) => accounts::create_lab(c, slug, slug)?,
            };
            wanted_labs.push(lab.id);
            match current.iter().find(|m| m.lab_id == lab.id) {
                Some(m) if m.source == MembershipSource::Manual => {}
                Some(m) if m.role == *role => {}
                other => {
                    accounts::upsert_membership(c, user_id, lab.id, *role, MembershipSource::Sso)?;
                    let before = other.map(|m| m.role.as_str()).unwrap_or("none");
                    let target = format!("member {}", user.username);
                    let after = role.as_str();
                    db::audit::record(
                        c,
                        &user,
                        Some(lab.id),
                        "sso_member",
                        &target,
                        before,
                        after,
                    )?;
                }
            }
        }
        for m in &current {
            if m.source == MembershipSource::Sso && !wanted_labs.contains(&m.lab_id) {
                accounts::remove_membership(c, user_id, m.lab_id)?;
                let target = format!("member {}", user.username);
                let before = m.role.as_str();
                db::audit::record(
                    c,
                    &user,
                    Some(m.lab_id),
                    "sso_remove_member",
                    &target,
                    before,
                    "none",
                )?;
            }
        }
        Ok(accounts::user_by_id(c, user_id)?)
    })
}

/// Everyone, for the development login's list (only ever offered when it is on).
pub async fn dev_login_users(ctx: &super::Ctx) -> Result<Vec<User>, AppError> {
    ctx.db
        .run(crate::db::users::all_users)
        .await
        .map_err(AppError::from)
}

/// The user the development login names, if any.
pub async fn dev_login_user(ctx: &super::Ctx, name: String) -> Result<Option<User>, AppError> {
    ctx.db
        .run(move |c| crate::db::users::user_by_name(c, &name))
        .await
        .map_err(AppError::from)
}

/// Who is calling: the holder of access token `token`, else the user of the browser
/// session `session_user`. With a token, also whether it may add SSH keys and tokens.
pub async fn caller(
    ctx: &super::Ctx,
    token: Option<String>,
    session_user: Option<i64>,
) -> Result<(super::Actor, Option<bool>), AppError> {
    ctx.db
        .run(move |c| match (token, session_user) {
            // The token's user and their labs in one query.
            (Some(t), _) => {
                let (user, labs, can_add_credentials) =
                    accounts::token_holder(c, &t)?.ok_or_else(|| {
                        AppError::Unauthenticated(
                            "the access token is unknown, expired or revoked".into(),
                        )
                    })?;
                Ok((super::Actor { user, labs }, Some(can_add_credentials)))
            }
            (None, Some(id)) => {
                let user = accounts::user_by_id(c, id)
                    .map_err(|_| AppError::Unauthenticated("please log in".into()))?;
                let labs = accounts::labs_of(c, user.id)?;
                Ok((super::Actor { user, labs }, None))
            }
            (None, None) => Err(AppError::Unauthenticated("please log in".into())),
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testkit;

    fn identity(username: &str, email: &str, verified: bool, groups: &[&str]) -> Identity {
        Identity {
            issuer: "https://sso.test".into(),
            subject: format!("sub-{username}"),
            username: username.into(),
            email: email.into(),
            email_verified: verified,
            name: username.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            id_token: String::new(),
        }
    }

    fn rules() -> GroupRules {
        GroupRules {
            lab_group_prefix: Some("lab-".into()),
            lab_admin_suffix: Some("-admins".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_hand_made_account_is_linked_only_on_a_verified_email() {
        let (_d, mut c) = testkit::sqlite();
        let manual = accounts::create_user(&mut c, "alice", "alice@uni.test", false).unwrap();
        let unverified = identity("alice", "alice@uni.test", false, &[]);
        let u = sign_in(&mut c, &unverified, &rules()).unwrap();
        assert_ne!(u.id, manual.id, "unverified e-mail: an account of its own");
        assert_eq!(u.username, "alice-2");
        assert!(accounts::user_by_id(&mut c, manual.id)
            .unwrap()
            .oidc_issuer
            .is_none());

        let (_d, mut c) = testkit::sqlite();
        let manual = accounts::create_user(&mut c, "alice", "alice@uni.test", false).unwrap();
        let verified = identity("alice", "ALICE@uni.test", true, &[]);
        let u = sign_in(&mut c, &verified, &rules()).unwrap();
        assert_eq!(u.id, manual.id, "verified e-mail: linked");
    }

    #[test]
    fn an_operators_account_is_never_linked_by_claims() {
        let (_d, mut c) = testkit::sqlite();
        let olga = accounts::create_user(&mut c, "olga", "olga@uni.test", true).unwrap();
        let claims = identity("olga", "olga@uni.test", true, &[]);
        let u = sign_in(&mut c, &claims, &rules()).unwrap();
        assert_ne!(u.id, olga.id);
        assert!(!u.is_operator, "the claims made no operator");
    }

    #[test]
    fn membership_changes_by_group_rules_are_audited() {
        let (_d, mut c) = testkit::sqlite();
        let log = |c: &mut DbConn| -> Vec<(String, String, String, String)> {
            let mut v: Vec<_> = db::audit::list(c, None, 50)
                .unwrap()
                .into_iter()
                .map(|e| (e.actor, e.action, e.before, e.after))
                .collect();
            v.reverse();
            v
        };
        sign_in(
            &mut c,
            &identity("dan", "dan@uni.test", true, &["lab-vision"]),
            &rules(),
        )
        .unwrap();
        let admins = identity("dan", "dan@uni.test", true, &["lab-vision-admins"]);
        sign_in(&mut c, &admins, &rules()).unwrap();
        sign_in(&mut c, &admins, &rules()).unwrap(); // nothing changes: nothing logged
        sign_in(
            &mut c,
            &identity("dan", "dan@uni.test", true, &[]),
            &rules(),
        )
        .unwrap();
        let s = |x: &str| x.to_string();
        assert_eq!(
            log(&mut c),
            vec![
                (s("dan"), s("sso_member"), s("none"), s("member")),
                (s("dan"), s("sso_member"), s("member"), s("admin")),
                (s("dan"), s("sso_remove_member"), s("admin"), s("none")),
            ]
        );
    }
}
