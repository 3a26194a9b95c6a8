//! Lab membership by hand: lab admins add people (by username or e-mail), remove them,
//! and change their role. Memberships made here are `manual`: SSO logins never change
//! them. A role change keeps the member's own quota. Every change is written to the
//! audit log in the same transaction.

use super::Ctx;
use super::{lab_admin, Actor};
use crate::db::models::{Role, User};
use crate::db::{self, users, DbConn};
use crate::domain::MembershipSource;
use crate::error::AppError;

fn find_person(c: &mut DbConn, who: &str) -> Result<User, AppError> {
    let who = who.trim();
    if who.is_empty() {
        return Err(AppError::invalid(
            "member",
            "give a username or an e-mail address",
        ));
    }
    if let Some(u) = users::user_by_name(c, who)? {
        return Ok(u);
    }
    users::user_by_email(c, who)?.ok_or_else(|| {
        AppError::invalid(
            "member",
            format!("nobody called {who:?} has logged in yet; they must log in once first"),
        )
    })
}

/// Adds a person to a lab, or changes their role; the membership becomes manual and
/// keeps its quota.
pub async fn set_member(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    who: String,
    role: Role,
) -> Result<(), AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab().id;
            let person = find_person(c, &who)?;
            db::transaction(c, |c| {
                let before =
                    users::membership(c, lab, person.id)?.map_or("none", |m| m.role.as_str());
                users::upsert_membership(c, person.id, lab, role, MembershipSource::Manual)?;
                Ok(db::audit::record(
                    c,
                    admin.user(),
                    Some(lab),
                    "set_member",
                    &format!("member {}", person.username),
                    before,
                    role.as_str(),
                )?)
            })
        })
        .await
}

/// Removes a person from a lab.
pub async fn remove_member(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    username: String,
) -> Result<(), AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab().id;
            let person = users::user_by_name(c, &username)?.ok_or(AppError::NotFound("member"))?;
            let before =
                users::membership(c, lab, person.id)?.ok_or(AppError::NotFound("member"))?;
            db::transaction(c, |c| {
                users::remove_membership(c, person.id, lab)?;
                Ok(db::audit::record(
                    c,
                    admin.user(),
                    Some(lab),
                    "remove_member",
                    &format!("member {username}"),
                    before.role.as_str(),
                    "none",
                )?)
            })
        })
        .await
}
