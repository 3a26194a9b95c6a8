//! Signing in the `commons` CLI through the browser, by the OAuth 2.0 device
//! authorization grant (RFC 8628) with the portal as the authorization server. It works
//! with any campus SSO (the user signs in to the portal as usual) and on machines without
//! a browser (a cluster's login node): the code is typed or opened anywhere.
//!
//! 1. The CLI asks for a sign-in (`POST /api/v1/cli/device`, no login needed) and gets a
//!    secret device code, a short user code and the page to confirm it on.
//! 2. The user opens the page, signs in to the portal if needed (campus SSO), sees the
//!    code and the name of the computer asking, and approves or denies (CSRF-protected
//!    form; audited).
//! 3. The CLI polls (`POST /api/v1/cli/token`); once approved, the poll is answered with
//!    a new personal access token (expiring after [`TOKEN_DAYS`]), once: the grant is
//!    redeemed in the same statement that checks it.

use super::{Actor, Ctx};
use crate::db::{self, cli_logins::Poll};
use crate::error::AppError;
use diesel::Connection;
use serde::{Deserialize, Serialize};

/// How long a token made by a browser sign-in is valid.
pub const TOKEN_DAYS: i64 = 90;
/// Seconds the CLI waits between polls.
pub const POLL_INTERVAL_S: i64 = 2;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The computer asking, shown on the approval page ("laptop of alice").
    #[serde(default)]
    pub client_name: Option<String>,
}

/// RFC 8628's device authorization response.
#[derive(Debug, Serialize)]
pub struct StartResponse {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    pub verification_uri_complete: String,
    pub expires_in: i64,
    pub interval: i64,
}

/// Starts a sign-in; `base` is the portal's public URL (no trailing slash).
pub async fn start(ctx: &Ctx, req: StartRequest, base: String) -> Result<StartResponse, AppError> {
    let name = req.client_name.unwrap_or_default();
    let name = name.trim();
    if name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "client_name",
            "at most 100 characters, no control characters",
        ));
    }
    let name = if name.is_empty() {
        "an unnamed computer".to_string()
    } else {
        name.to_string()
    };
    let (device_code, user_code, _) = ctx.db.run(move |c| db::cli_logins::start(c, &name)).await?;
    let verification_uri = format!("{base}/cli/device");
    Ok(StartResponse {
        verification_uri_complete: format!("{verification_uri}?code={user_code}"),
        verification_uri,
        device_code,
        user_code,
        expires_in: db::cli_logins::TTL_S,
        interval: POLL_INTERVAL_S,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub device_code: String,
}

#[derive(Debug, Serialize)]
pub struct TokenResponse {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_at: chrono::NaiveDateTime,
    pub username: String,
}

/// Why a poll got no token, as RFC 8628 names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotYet {
    Pending,
    Denied,
    Expired,
    Invalid,
}

impl NotYet {
    pub fn code(self) -> &'static str {
        match self {
            NotYet::Pending => "authorization_pending",
            NotYet::Denied => "access_denied",
            NotYet::Expired => "expired_token",
            NotYet::Invalid => "invalid_grant",
        }
    }
    pub fn message(self) -> &'static str {
        match self {
            NotYet::Pending => "waiting for the user to approve the sign-in in the browser",
            NotYet::Denied => "the sign-in was denied in the browser",
            NotYet::Expired => "the sign-in expired before it was approved; start again",
            NotYet::Invalid => "unknown or already used device code; start again",
        }
    }
}

/// Polls a sign-in: a token once it is approved (this once), else why not.
pub async fn token(
    ctx: &Ctx,
    req: TokenRequest,
) -> Result<Result<TokenResponse, NotYet>, AppError> {
    ctx.db
        .run(move |c| {
            c.transaction(|c| {
                let (user, client) = match db::cli_logins::poll(c, &req.device_code)? {
                    Poll::Approved(u, client) => (u, client),
                    Poll::Pending => return Ok(Err(NotYet::Pending)),
                    Poll::Denied => return Ok(Err(NotYet::Denied)),
                    Poll::Expired => return Ok(Err(NotYet::Expired)),
                    Poll::Unknown | Poll::Spent => return Ok(Err(NotYet::Invalid)),
                };
                let user = db::users::user_by_id(c, user)?;
                let expires_at = db::now() + chrono::Duration::days(TOKEN_DAYS);
                let name: String = format!("commons CLI on {client}")
                    .chars()
                    .take(100)
                    .collect();
                let access_token =
                    db::users::create_api_token_until(c, user.id, &name, Some(expires_at))?;
                Ok(Ok(TokenResponse {
                    access_token,
                    token_type: "Bearer",
                    expires_at,
                    username: user.username,
                }))
            })
        })
        .await
}

/// What the approval page shows of a pending sign-in.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: i64,
    pub user_code: String,
    pub client_name: String,
    pub created_at: chrono::NaiveDateTime,
    pub decided: bool,
}

/// The sign-in a typed user code names, if it is still open to a decision.
pub async fn find(ctx: &Ctx, typed: String) -> Result<Option<Pending>, AppError> {
    let row = ctx
        .db
        .run(move |c| db::cli_logins::by_user_code(c, &typed))
        .await?;
    Ok(row.map(|r| Pending {
        decided: r.decided(),
        id: r.id,
        user_code: r.user_code,
        client_name: r.client_name,
        created_at: r.created_at,
    }))
}

/// Approves or denies the sign-in that `typed` names, for `actor` (audited).
pub async fn decide(
    ctx: &Ctx,
    actor: &Actor,
    typed: String,
    approve: bool,
) -> Result<(), AppError> {
    let user = actor.user.clone();
    ctx.db
        .run(move |c| {
            c.transaction(|c| {
                let row = db::cli_logins::by_user_code(c, &typed)?.ok_or_else(|| {
                    AppError::invalid(
                        "user_code",
                        "no sign-in waits with this code (mistyped, or expired after 10 minutes)",
                    )
                })?;
                if !db::cli_logins::decide(c, row.id, user.id, approve)? {
                    return Err(AppError::conflict(
                        "already_decided",
                        "this sign-in was already approved or denied",
                    ));
                }
                let action = if approve {
                    "cli.login"
                } else {
                    "cli.login_denied"
                };
                db::audit::record(c, &user, None, action, &row.client_name, "", &row.user_code)
            })
        })
        .await
}
