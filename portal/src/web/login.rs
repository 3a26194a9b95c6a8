//! Logging in and out: campus SSO (OpenID Connect, see `auth::oidc`) and, only behind
//! `--insecure-dev-login`, a development login that says so on every page.
//!
//! A refused SSO callback (forged or missing state, replayed code, bad ID token) shows a
//! clear page, is logged, and creates no session.

use super::Banner;
use crate::auth::oidc::PendingLogin;
use crate::auth::{log_in, log_out, CsrfForm, NoFields};
use crate::db::models::User;
use crate::error::{AppError, WebError};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

const SESSION_PENDING: &str = "oidc_pending";
const SESSION_ID_TOKEN: &str = "id_token";
/// A local path to go back to once signed in (kept by pages that need a login).
const SESSION_AFTER_LOGIN: &str = "after_login";

/// Sends the browser back to `path` (a local path) after the next login.
pub(super) fn return_after_login(session: &Session, path: &str) {
    let _ = session.insert(SESSION_AFTER_LOGIN, path);
}

/// Where to go after a login: the path kept by [`return_after_login`] (only a local one:
/// `/x`, never `//host` or a URL), else the home page. Read before `log_in`, which clears the
/// session. The home page is the campus overview.
fn after_login(session: &Session) -> String {
    session
        .remove_as::<String>(SESSION_AFTER_LOGIN)
        .and_then(Result::ok)
        .filter(|p| p.starts_with('/') && !p.starts_with("//") && !p.contains('\\'))
        .unwrap_or_else(|| "/".to_string())
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/login", web::get().to(page))
        .route("/login", web::post().to(dev_login))
        .route("/auth/login", web::get().to(sso_start))
        .route("/auth/callback", web::get().to(sso_callback))
        .route("/logout", web::post().to(logout));
}

#[derive(Template, WebTemplate)]
#[template(path = "login.html")]
struct LoginPage {
    banner: Banner,
    sso: bool,
    users: Vec<User>,
    error: Option<String>,
}

async fn login_page(
    state: &AppState,
    session: &Session,
    error: Option<String>,
) -> Result<LoginPage, WebError> {
    let users = if state.config.insecure_dev_login {
        crate::service::identity::dev_login_users(state).await?
    } else {
        Vec::new()
    };
    Ok(LoginPage {
        banner: Banner::new(state, session, None),
        sso: state.oidc.is_some(),
        users,
        error,
    })
}

async fn page(state: web::Data<AppState>, session: Session) -> Result<LoginPage, WebError> {
    login_page(&state, &session, None).await
}

/// Shows the login page with why the login failed (HTTP 401).
async fn refused(
    state: &AppState,
    session: &Session,
    e: AppError,
) -> Result<HttpResponse, WebError> {
    tracing::warn!("login refused: {e}");
    let page = login_page(state, session, Some(e.to_string())).await?;
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::Unauthorized()
        .content_type("text/html; charset=utf-8")
        .body(body))
}

async fn sso_start(state: web::Data<AppState>, session: Session) -> Result<HttpResponse, WebError> {
    let oidc = state
        .oidc
        .as_ref()
        .ok_or(AppError::NotFound("campus login"))?;
    let (url, pending) = oidc.begin().await?;
    session
        .insert(SESSION_PENDING, &pending)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("session: {e}")))?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", url))
        .finish())
}

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

async fn sso_callback(
    state: web::Data<AppState>,
    session: Session,
    query: web::Query<Callback>,
) -> Result<HttpResponse, WebError> {
    let oidc = state
        .oidc
        .clone()
        .ok_or(AppError::NotFound("campus login"))?;
    // Whatever happens next, this login attempt is spent.
    let pending: Option<PendingLogin> = session.remove_as(SESSION_PENDING).and_then(Result::ok);
    let q = query.into_inner();
    if let Some(err) = q.error {
        let why = q.error_description.unwrap_or(err);
        return refused(
            &state,
            &session,
            AppError::Unauthenticated(format!("the campus login service said: {why}")),
        )
        .await;
    }
    let (Some(code), Some(st)) = (q.code, q.state) else {
        return refused(
            &state,
            &session,
            AppError::Unauthenticated("the login answer lacks its code or state".into()),
        )
        .await;
    };
    let identity = match oidc.finish(pending, &code, &st).await {
        Ok(i) => i,
        Err(e) => return refused(&state, &session, e).await,
    };
    let rules = state.config.oidc.groups.clone();
    let user = crate::service::identity::signed_in(&state, identity.clone(), rules).await?;
    let to = after_login(&session);
    log_in(&session, user.id)?;
    // Kept for RP-initiated logout, if it fits the cookie.
    if identity.id_token.len() < 2048 {
        let _ = session.insert(SESSION_ID_TOKEN, &identity.id_token);
    }
    tracing::info!(user = %user.username, groups = ?identity.groups, "logged in through campus SSO");
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", to))
        .finish())
}

#[derive(Deserialize)]
struct LoginForm {
    username: String,
}

async fn dev_login(
    state: web::Data<AppState>,
    session: Session,
    form: CsrfForm<LoginForm>,
) -> Result<HttpResponse, WebError> {
    if !state.config.insecure_dev_login {
        return Err(AppError::Forbidden(
            "the development login is off; log in with campus SSO".into(),
        )
        .into());
    }
    let name = form.0.username.trim().to_string();
    let user = crate::service::identity::dev_login_user(&state, name).await?;
    let Some(user) = user else {
        return Err(AppError::invalid("username", "no such user").into());
    };
    let to = after_login(&session);
    log_in(&session, user.id)?;
    tracing::warn!(user = %user.username, "logged in through the INSECURE development login");
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", to))
        .finish())
}

async fn logout(
    state: web::Data<AppState>,
    session: Session,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let id_token: Option<String> = session.get(SESSION_ID_TOKEN).ok().flatten();
    log_out(&session);
    // RP-initiated logout: end the provider's session too, when it offers that.
    let mut to = "/login".to_string();
    if let (Some(oidc), Some(public)) = (&state.oidc, &state.config.public_url) {
        let after = format!("{}/login", public.trim_end_matches('/'));
        if let Some(url) = oidc.logout_url(id_token.as_deref(), &after).await {
            to = url;
        }
    }
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", to))
        .finish())
}
