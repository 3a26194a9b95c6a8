//! Signing in the `commons` CLI through the browser, by the OAuth 2.0 device
//! authorization grant (RFC 8628) with the portal as the authorization server. It works
//! with any campus SSO (the user signs in to the portal as usual) and on machines without
//! a browser (a cluster's login node): the code is typed anywhere.
//!
//! 1. The CLI asks for a sign-in (`POST /api/v1/cli/device`, no login needed) and gets a
//!    secret device code, a short user code and the page to type it on. One address may
//!    start [`crate::config::CliLoginConfig::starts_per_address`] in 10 minutes.
//! 2. The user opens the page, signs in to the portal if needed (campus SSO), and types
//!    the code their terminal shows: no link fills it in, so nobody can send a link that
//!    approves with one click. The page then shows who asks (always "the commons
//!    command-line client": what a request calls itself is not shown as who it is), from
//!    which address and when; the user approves (ticking, or not, that the token may add
//!    SSH keys and tokens) or denies (CSRF-protected form; audited with the address).
//! 3. The CLI polls (`POST /api/v1/cli/token`) at the interval it was given; a poll that
//!    comes too early is answered `slow_down` and the interval grows by 5 s. Once
//!    approved, the poll is answered with a new personal access token (expiring after
//!    `token_days`, 30 by default), once: the grant is redeemed in the same statement
//!    that checks it.

use super::{Actor, Ctx};
use crate::db::{self, cli_logins::Poll};
use crate::error::AppError;

/// Who the approval page says is asking: fixed by the portal, whatever the request says.
pub const CLIENT: &str = "the commons command-line client";

pub use commons_api::cli_login::{DeviceRequest, DeviceStart, TokenGranted, TokenRequest};

/// Starts a sign-in from `client_addr`; `base` is the portal's public URL (no trailing
/// slash).
pub async fn start(
    ctx: &Ctx,
    req: DeviceRequest,
    base: String,
    client_addr: String,
    per_address: u32,
) -> Result<DeviceStart, AppError> {
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
    let (device_code, user_code, _) = ctx
        .db
        .run(move |c| db::cli_logins::start(c, &name, &client_addr, per_address))
        .await?;
    Ok(DeviceStart {
        verification_uri: format!("{base}/cli/device"),
        device_code,
        user_code,
        expires_in: db::cli_logins::TTL_S,
        interval: db::cli_logins::INTERVAL_S,
    })
}

/// Why a poll got no token, as RFC 8628 names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotYet {
    Pending,
    /// Too early: wait this many seconds between polls from now on.
    SlowDown(i64),
    Denied,
    Expired,
    Invalid,
}

impl NotYet {
    pub fn code(self) -> &'static str {
        match self {
            NotYet::Pending => "authorization_pending",
            NotYet::SlowDown(_) => "slow_down",
            NotYet::Denied => "access_denied",
            NotYet::Expired => "expired_token",
            NotYet::Invalid => "invalid_grant",
        }
    }
    pub fn message(self) -> String {
        match self {
            NotYet::Pending => "waiting for the user to approve the sign-in in the browser".into(),
            NotYet::SlowDown(s) => {
                format!("polled too soon after the previous poll: wait {s} s between polls")
            }
            NotYet::Denied => "the sign-in was denied in the browser".into(),
            NotYet::Expired => "the sign-in expired before it was approved; start again".into(),
            NotYet::Invalid => "unknown or already used device code; start again".into(),
        }
    }
}

/// Polls a sign-in: a token valid `token_days` once it is approved (this once), else why
/// not.
pub async fn token(
    ctx: &Ctx,
    req: TokenRequest,
    token_days: u32,
) -> Result<Result<TokenGranted, NotYet>, AppError> {
    let days = i64::from(token_days);
    ctx.db
        .run(move |c| {
            crate::db::transaction(c, |c| {
                let granted = match db::cli_logins::poll(c, &req.device_code)? {
                    Poll::Approved(a) => a,
                    Poll::Pending => return Ok(Err(NotYet::Pending)),
                    Poll::SlowDown(s) => return Ok(Err(NotYet::SlowDown(s))),
                    Poll::Denied => return Ok(Err(NotYet::Denied)),
                    Poll::Expired => return Ok(Err(NotYet::Expired)),
                    Poll::Unknown | Poll::Spent => return Ok(Err(NotYet::Invalid)),
                };
                let user = db::users::user_by_id(c, granted.user)?;
                let expires_at = db::now() + chrono::Duration::days(days);
                let name: String = format!(
                    "commons CLI on {} from {}",
                    granted.client_name, granted.client_addr
                )
                .chars()
                .take(100)
                .collect();
                let access_token = db::users::create_scoped_api_token(
                    c,
                    user.id,
                    &name,
                    Some(expires_at),
                    granted.can_add_credentials,
                )?;
                Ok(Ok(TokenGranted {
                    access_token,
                    token_type: "Bearer".into(),
                    expires_at,
                    username: user.username,
                    can_add_credentials: granted.can_add_credentials,
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
    /// Where the request came from.
    pub client_addr: String,
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
        client_addr: r.client_addr,
        created_at: r.created_at,
    }))
}

/// Approves (`Some(may add SSH keys and tokens)`) or denies (`None`) the sign-in that
/// `typed` names, for `actor` (audited, with the address it came from).
pub async fn decide(
    ctx: &Ctx,
    actor: &Actor,
    typed: String,
    approve: Option<bool>,
) -> Result<(), AppError> {
    let user = actor.user.clone();
    ctx.db
        .run(move |c| {
            crate::db::transaction(c, |c| {
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
                let (action, right) = match approve {
                    Some(true) => ("cli.login", ", may add SSH keys and tokens"),
                    Some(false) => ("cli.login", ""),
                    None => ("cli.login_denied", ""),
                };
                let after = format!("{} from {}{right}", row.user_code, row.client_addr);
                Ok(db::audit::record(
                    c,
                    &user,
                    None,
                    action,
                    &row.client_name,
                    "",
                    &after,
                )?)
            })
        })
        .await
}

pub use crate::db::cli_logins::normalise_user_code;
