//! Who is asking: [`CurrentUser`] is the typed extractor every user-facing handler takes,
//! so no handler can forget to authenticate. API clients send a personal access token
//! (`Authorization: Bearer ...`); browsers carry a session cookie. Forms carry a CSRF
//! token bound to the session ([`csrf_token`], [`check_csrf`]).

pub mod oidc;
pub mod rules;

use crate::db::models::{Lab, Role, User};
use crate::error::AppError;
use crate::state::AppState;
use actix_session::{Session, SessionExt};
use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use std::future::Future;
use std::pin::Pin;

const SESSION_USER: &str = "uid";
const SESSION_CSRF: &str = "csrf";
const SESSION_LOGIN_AT: &str = "login_at";

#[derive(Debug, Clone)]
pub struct CurrentUser {
    pub user: User,
    pub labs: Vec<(Lab, Role)>,
}

impl CurrentUser {
    /// May this user administer `lab` (its lab admin, or an operator)?
    pub fn admin_of(&self, lab: i64) -> bool {
        self.user.is_operator
            || self
                .labs
                .iter()
                .any(|(l, r)| l.id == lab && *r == crate::db::models::Role::Admin)
    }

    /// Refuses unless the user administers `lab`.
    pub fn require_admin_of(&self, lab: i64) -> Result<(), AppError> {
        if self.admin_of(lab) {
            Ok(())
        } else {
            Err(AppError::Forbidden(
                "only the lab's admins (or operators) may do this".into(),
            ))
        }
    }

    /// Refuses unless the user is an operator.
    pub fn require_operator(&self) -> Result<(), AppError> {
        if self.user.is_operator {
            Ok(())
        } else {
            Err(AppError::Forbidden("only operators may do this".into()))
        }
    }

    /// (slug, id) of the user's labs, for validation.
    pub fn lab_ids(&self) -> Vec<(String, i64)> {
        self.labs
            .iter()
            .map(|(l, _)| (l.slug.clone(), l.id))
            .collect()
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
        Box::pin(async move {
            let state = state.ok_or_else(|| AppError::Internal(anyhow::anyhow!("no state")));
            let state = match state {
                Ok(s) => s,
                Err(e) => return Err(as_response(api, e)),
            };
            let uid = if token.is_none() {
                let login_at = session
                    .get::<i64>(SESSION_LOGIN_AT)
                    .ok()
                    .flatten()
                    .unwrap_or(0);
                let max_age = state.config.session_absolute_hours as i64 * 3600;
                if chrono::Utc::now().timestamp() - login_at > max_age {
                    // Absolute expiry: however active, a session ends this long after login.
                    session.purge();
                    None
                } else {
                    session.get::<i64>(SESSION_USER).ok().flatten()
                }
            } else {
                None
            };
            state
                .db
                .run(move |c| {
                    let user = match (token, uid) {
                        (Some(t), _) => {
                            crate::db::users::user_by_token(c, &t)?.ok_or_else(|| {
                                AppError::Unauthenticated(
                                    "the access token is unknown, expired or revoked".into(),
                                )
                            })?
                        }
                        (None, Some(id)) => crate::db::users::user_by_id(c, id)
                            .map_err(|_| AppError::Unauthenticated("please log in".into()))?,
                        (None, None) => {
                            return Err(AppError::Unauthenticated("please log in".into()))
                        }
                    };
                    let labs = crate::db::users::labs_of(c, user.id)?;
                    Ok(CurrentUser { user, labs })
                })
                .await
                .map_err(|e| as_response(api, e))
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
    // A new session id at login: a session fixed before login is worth nothing after.
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
pub fn check_csrf(session: &Session, provided: &str) -> Result<(), AppError> {
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
