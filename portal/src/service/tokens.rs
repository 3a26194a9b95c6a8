//! Personal access tokens for the API and the CLI, as the tokens page makes, lists and
//! revokes them: shown once, stored hashed, with an expiry and the time of last use.

use super::{Actor, Ctx};
use crate::db::{users, web_sessions};
use crate::error::AppError;

pub use crate::db::users::TokenInfo;

/// Longest life a token made on the page may have.
pub const MAX_DAYS: i64 = 3650;

/// The caller's tokens, and how many browser sessions they have live.
pub async fn list(ctx: &Ctx, actor: &Actor) -> Result<(Vec<TokenInfo>, i64), AppError> {
    let id = actor.user.id;
    ctx.db
        .run(move |c| {
            Ok((
                users::tokens_of(c, id)?,
                web_sessions::count_for_user(c, id)?,
            ))
        })
        .await
}

/// A new token named `name` for the caller, expiring after `days` (never: `None`); its
/// secret, which is shown this once.
pub async fn create(
    ctx: &Ctx,
    actor: &Actor,
    name: String,
    days: Option<i64>,
) -> Result<String, AppError> {
    if days.is_some_and(|d| !(1..=MAX_DAYS).contains(&d)) {
        return Err(AppError::invalid(
            "expires_days",
            format!("from 1 to {MAX_DAYS} days, or empty for never"),
        ));
    }
    let until = days.map(|d| crate::db::now() + chrono::Duration::days(d));
    let id = actor.user.id;
    ctx.db
        .run(move |c| users::create_api_token_until(c, id, &name, until))
        .await
        .map_err(AppError::from)
}

/// Revokes the caller's token `token` (another user's is "not found").
pub async fn revoke(ctx: &Ctx, actor: &Actor, token: i64) -> Result<(), AppError> {
    let uid = actor.user.id;
    ctx.db
        .run(move |c| users::revoke_token(c, uid, token))
        .await
        .map_err(AppError::from)
}
