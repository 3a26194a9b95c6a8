//! Logging in and out. Until campus SSO is configured, the only way in is the development
//! login, which exists only behind `--insecure-dev-login` and says so on every page.

use super::Banner;
use crate::auth::{check_csrf, log_in, log_out};
use crate::db::models::User;
use crate::db::users;
use crate::error::{AppError, WebError};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/login", web::get().to(page))
        .route("/login", web::post().to(submit))
        .route("/logout", web::post().to(logout));
}

#[derive(Template, WebTemplate)]
#[template(path = "login.html")]
struct LoginPage {
    banner: Banner,
    users: Vec<User>,
    error: Option<String>,
}

async fn page(state: web::Data<AppState>, session: Session) -> Result<LoginPage, WebError> {
    let users = if state.config.insecure_dev_login {
        state.db.run(users::all_users).await?
    } else {
        Vec::new()
    };
    Ok(LoginPage {
        banner: Banner::new(&state, &session, None),
        users,
        error: None,
    })
}

#[derive(Deserialize)]
struct LoginForm {
    username: String,
    #[serde(default)]
    csrf: String,
}

async fn submit(
    state: web::Data<AppState>,
    session: Session,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, WebError> {
    if !state.config.insecure_dev_login {
        return Err(AppError::Forbidden(
            "the development login is off; log in with campus SSO".into(),
        )
        .into());
    }
    check_csrf(&session, &form.csrf)?;
    let name = form.username.trim().to_string();
    let user = state.db.run(move |c| users::user_by_name(c, &name)).await?;
    let Some(user) = user else {
        return Err(AppError::invalid("username", "no such user").into());
    };
    log_in(&session, user.id)?;
    tracing::warn!(user = %user.username, "logged in through the INSECURE development login");
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/jobs"))
        .finish())
}

#[derive(Deserialize)]
struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(session: Session, form: web::Form<LogoutForm>) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    log_out(&session);
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/login"))
        .finish())
}
