//! Lab membership by hand: lab admins add people (by username or e-mail), remove them,
//! and make them admins. Memberships made here are `manual`: SSO logins never change
//! them. Every change is written to the audit log in the same transaction.

use crate::auth::CurrentUser;
use crate::db::models::{Role, User};
use crate::db::schema::{memberships, users as users_t};
use crate::db::{audit, users, DbConn};
use crate::error::AppError;
use crate::state::AppState;
use diesel::prelude::*;

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
    users_t::table
        .filter(users_t::email.eq(who))
        .select(User::as_select())
        .first(c)
        .optional()?
        .ok_or_else(|| {
            AppError::invalid(
                "member",
                format!("nobody called {who:?} has logged in yet; they must log in once first"),
            )
        })
}

fn role_of(c: &mut DbConn, lab: i64, user: i64) -> Result<Option<String>, AppError> {
    Ok(memberships::table
        .filter(memberships::lab_id.eq(lab))
        .filter(memberships::user_id.eq(user))
        .select(memberships::role)
        .first(c)
        .optional()?)
}

/// Adds a person to a lab, or changes their role; the membership becomes manual.
pub async fn set_member(
    state: &AppState,
    actor: CurrentUser,
    slug: String,
    who: String,
    role: Role,
) -> Result<(), AppError> {
    state
        .db
        .run(move |c| {
            let lab = users::lab_by_slug(c, &slug).map_err(|_| AppError::NotFound("lab"))?;
            actor.require_admin_of(lab.id)?;
            let person = find_person(c, &who)?;
            c.transaction(|c| {
                let before = role_of(c, lab.id, person.id)?.unwrap_or_else(|| "none".into());
                diesel::delete(
                    memberships::table
                        .filter(memberships::lab_id.eq(lab.id))
                        .filter(memberships::user_id.eq(person.id)),
                )
                .execute(c)?;
                diesel::insert_into(memberships::table)
                    .values((
                        memberships::user_id.eq(person.id),
                        memberships::lab_id.eq(lab.id),
                        memberships::role.eq(role.as_str()),
                        memberships::source.eq("manual"),
                    ))
                    .execute(c)?;
                audit::record(
                    c,
                    &actor.user,
                    Some(lab.id),
                    "set_member",
                    &format!("member {}", person.username),
                    &before,
                    role.as_str(),
                )
            })
        })
        .await
}

/// Removes a person from a lab.
pub async fn remove_member(
    state: &AppState,
    actor: CurrentUser,
    slug: String,
    username: String,
) -> Result<(), AppError> {
    state
        .db
        .run(move |c| {
            let lab = users::lab_by_slug(c, &slug).map_err(|_| AppError::NotFound("lab"))?;
            actor.require_admin_of(lab.id)?;
            let person = users::user_by_name(c, &username)?.ok_or(AppError::NotFound("member"))?;
            let before = role_of(c, lab.id, person.id)?.ok_or(AppError::NotFound("member"))?;
            c.transaction(|c| {
                diesel::delete(
                    memberships::table
                        .filter(memberships::lab_id.eq(lab.id))
                        .filter(memberships::user_id.eq(person.id)),
                )
                .execute(c)?;
                audit::record(
                    c,
                    &actor.user,
                    Some(lab.id),
                    "remove_member",
                    &format!("member {username}"),
                    &before,
                    "none",
                )
            })
        })
        .await
}
