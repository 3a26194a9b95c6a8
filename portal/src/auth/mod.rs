//! Who is asking: [`CurrentUser`] is the typed extractor every user-facing handler takes,
//! so no handler can forget to authenticate. API clients send a personal access token
//! (`Authorization: Bearer ...`); browsers carry a session cookie.
//!
//! Adding a way in (an SSH key, a token, approving a CLI sign-in) takes
//! [`CredentialsManager`] instead: a browser session, or a token made with that right (a
//! browser sign-in of `commons login` has it only when the user ticked it).
//!
//! Forms: every state-changing form is read through [`CsrfForm`], which refuses a body
//! whose CSRF token is missing or not the session's before the handler runs. The plain
//! `web::Form` is a disallowed type (clippy.toml), so a handler cannot read a form
//! without the check.

pub mod oidc;
pub mod store;

use crate::error::{AppError, WebError};
use crate::service::Actor;
use crate::state::AppState;
use actix_session::{Session, SessionExt};
use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::future::Future;
use std::pin::Pin;

pub(crate) const SESSION_USER: &str = "uid";
const SESSION_CSRF: &str = "csrf";
const SESSION_LOGIN_AT: &str = "login_at";

/// The signed-in user making this request (an [`Actor`] for the service layer), and how
/// they proved it.
#[derive(Debug, Clone)]
pub struct CurrentUser(pub Actor, pub Credential);

/// How a request was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// A browser session (a login through the campus SSO or the development login).
    Session,
    /// A personal access token; `can_add_credentials`: it may add SSH keys and tokens.
    Token { can_add_credentials: bool },
}

/// A [`CurrentUser`] who may add ways in: SSH keys, access tokens, CLI sign-ins. Refused
/// with 403 for a token made without that right.
#[derive(Debug, Clone)]
pub struct CredentialsManager(pub CurrentUser);

impl std::ops::Deref for CredentialsManager {
    type Target = CurrentUser;
    fn deref(&self) -> &CurrentUser {
        &self.0
    }
}

/// Why a token cannot add keys or tokens, in words for its user.
pub const NO_CREDENTIALS_RIGHT: &str = "this access token may not add SSH keys or access \
    tokens (a browser sign-in of `commons login` gets that right only when it is ticked on \
    the approval page): add them on the portal's pages, or run `commons login` again and \
    tick it";

impl FromRequest for CredentialsManager {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, actix_web::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let api = req.path().starts_with("/api/");
        let user = CurrentUser::from_request(req, payload);
        Box::pin(async move {
            let user = user.await?;
            match user.1 {
                Credential::Session
                | Credential::Token {
                    can_add_credentials: true,
                } => Ok(CredentialsManager(user)),
                Credential::Token {
                    can_add_credentials: false,
                } => Err(as_response(
                    api,
                    AppError::Forbidden(NO_CREDENTIALS_RIGHT.into()),
                )),
            }
        })
    }
}

impl std::ops::Deref for CurrentUser {
    type Target = Actor;
    fn deref(&self) -> &Actor {
        &self.0
    }
}

fn bearer(req: &HttpRequest) -> Option<String> {
    let h = req.headers().get("authorization")?.to_str().ok()?;
    h.strip_prefix("Bearer ").map(|t| t.trim().to_string())
}

impl FromRequest for CurrentUser {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, actix_web::Error>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let token = bearer(req);
        let session = req.get_session();
        let api = req.path().starts_with("/api/");
        // A browser's cookie on a state-changing API call must come with the session's
        // CSRF token in `X-CSRF-Token`: a page on another site cannot set that header
        // (the portal allows no cross-origin requests), so it cannot ride the cookie.
        let unsafe_method = !matches!(
            *req.method(),
            actix_web::http::Method::GET
                | actix_web::http::Method::HEAD
                | actix_web::http::Method::OPTIONS
        );
        let csrf_header = req
            .headers()
            .get("x-csrf-token")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        Box::pin(async move {
            let state = state.ok_or_else(|| AppError::Internal(anyhow::anyhow!("no state")));
            let state = match state {
                Ok(s) => s,
                Err(e) => return Err(as_response(api, e)),
            };
            let uid = match token {
                Some(_) => None,
                None => session.get::<i64>(SESSION_USER).ok().flatten(),
            };
            if api && unsafe_method && uid.is_some() {
                let expected = session.get::<String>(SESSION_CSRF).ok().flatten();
                let ok = matches!((&expected, &csrf_header), (Some(e), Some(h)) if !e.is_empty() && e == h);
                if !ok {
                    return Err(as_response(
                        api,
                        AppError::Forbidden(
                            "a browser session's API call needs its CSRF token in X-CSRF-Token \
                             (scripts: use a personal access token)"
                                .into(),
                        ),
                    ));
                }
            }
            let uid = uid.filter(|_| {
                let login_at = session
                    .get::<i64>(SESSION_LOGIN_AT)
                    .ok()
                    .flatten()
                    .unwrap_or(0);
                let max_age = state.config.session_absolute_hours as i64 * 3600;
                let expired =
                    past_absolute_expiry(login_at, chrono::Utc::now().timestamp(), max_age);
                if expired {
                    // Absolute expiry: however active, a session ends this long after login.
                    session.purge();
                }
                !expired
            });
            let (actor, token) = crate::service::identity::caller(&state, token, uid)
                .await
                .map_err(|e| as_response(api, e))?;
            let how = match token {
                Some(can_add_credentials) => Credential::Token {
                    can_add_credentials,
                },
                None => Credential::Session,
            };
            Ok(CurrentUser(actor, how))
        })
    }
}

/// However active, a session ends `max_age_s` after its login (a session without a
/// login time is treated as ancient).
pub fn past_absolute_expiry(login_at: i64, now: i64, max_age_s: i64) -> bool {
    now.saturating_sub(login_at) > max_age_s
}

/// API errors render as JSON, UI errors as a page (or a redirect to the login).
fn as_response(api: bool, e: AppError) -> actix_web::Error {
    if api {
        crate::error::ApiError(e).into()
    } else {
        crate::error::WebError(e).into()
    }
}

pub fn log_in(session: &Session, user: i64) -> Result<(), AppError> {
    // A fresh session at login: nothing from before it (a CSRF token an attacker may
    // have planted or read) carries over, and the session id changes.
    session.clear();
    session.renew();
    session
        .insert(SESSION_USER, user)
        .and_then(|_| session.insert(SESSION_LOGIN_AT, chrono::Utc::now().timestamp()))
        .map_err(|e| AppError::Internal(anyhow::anyhow!("session: {e}")))
}

pub fn log_out(session: &Session) {
    session.purge();
}

/// The session's CSRF token, made on first use.
pub fn csrf_token(session: &Session) -> String {
    if let Ok(Some(t)) = session.get::<String>(SESSION_CSRF) {
        return t;
    }
    let t = hex::encode(rand::random::<[u8; 16]>());
    let _ = session.insert(SESSION_CSRF, &t);
    t
}

/// Refuses a state-changing form whose token is missing or not this session's.
fn check_csrf(session: &Session, provided: &str) -> Result<(), AppError> {
    match session.get::<String>(SESSION_CSRF) {
        Ok(Some(t))
            if !provided.is_empty() && constant_time_eq(t.as_bytes(), provided.as_bytes()) =>
        {
            Ok(())
        }
        _ => Err(AppError::Forbidden(
            "the form's security token is missing or stale; reload the page and try again".into(),
        )),
    }
}

/// A form body that passed the CSRF check; the form's own fields are in `.0`.
/// Refused with 403 (an HTML page) when the token is missing or stale.
pub struct CsrfForm<T>(pub T);

#[derive(Deserialize)]
struct WithCsrf<T> {
    #[serde(default)]
    csrf: String,
    #[serde(flatten)]
    form: T,
}

impl<T: DeserializeOwned + 'static> FromRequest for CsrfForm<T> {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, actix_web::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let session = req.get_session();
        #[allow(clippy::disallowed_types)] // the one place that reads a raw form
        let form = web::Form::<WithCsrf<T>>::from_request(req, payload);
        Box::pin(async move {
            // The token first: a forged request learns nothing from a parse error.
            let body = form.await;
            let provided = body.as_ref().map(|b| b.csrf.as_str()).unwrap_or_default();
            check_csrf(&session, provided).map_err(WebError)?;
            let body = body.map_err(|e| {
                WebError(AppError::BadRequest(format!(
                    "the form could not be read: {e}"
                )))
            })?;
            Ok(CsrfForm(body.into_inner().form))
        })
    }
}

/// A form that carries nothing but its CSRF token (cancel, revoke, remove, ...).
#[derive(Deserialize)]
pub struct NoFields {}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_expiry() {
        assert!(!past_absolute_expiry(1_000, 1_000 + 3600, 3600));
        assert!(past_absolute_expiry(1_000, 1_000 + 3601, 3600));
        assert!(
            past_absolute_expiry(0, 1_700_000_000, 7 * 24 * 3600),
            "no login time: expired"
        );
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
