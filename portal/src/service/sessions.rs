//! Ending browser sessions: "sign out everywhere", for oneself or, by an operator, for
//! anyone (a lost laptop, a departed member, a stolen cookie). Personal access tokens are
//! apart: they are revoked one by one on the tokens page.

use super::{Actor, Ctx};
use crate::db;
use crate::error::AppError;

/// Ends every browser session of `username` (the caller's own, or anyone's for an
/// operator), on every replica at once; audited. Returns how many were live.
pub async fn sign_out_everywhere(
    ctx: &Ctx,
    actor: &Actor,
    username: &str,
) -> Result<usize, AppError> {
    if actor.user.username != username {
        actor.require_operator()?;
    }
    let (actor_user, username) = (actor.user.clone(), username.to_string());
    ctx.db
        .run(move |c| {
            db::transaction(c, |c| {
                let user = db::users::user_by_name(c, &username)?
                    .ok_or_else(|| AppError::NotFound("no such user"))?;
                let n = db::web_sessions::delete_for_user(c, user.id)?;
                db::audit::record(
                    c,
                    &actor_user,
                    None,
                    "sign out everywhere",
                    &username,
                    "",
                    &format!("{n} sessions ended"),
                )?;
                Ok(n)
            })
        })
        .await
}
