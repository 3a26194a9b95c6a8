//! `/cli/device`: where a signed-in user approves (or denies) a sign-in of the `commons`
//! CLI by the code it shows (the device authorization grant; see `service::cli_login`).
//! A visitor who is not signed in is sent to the login first and brought back here with
//! the code.

use super::Banner;
use crate::auth::{CsrfForm, CurrentUser};
use crate::db::cli_logins::normalise_user_code;
use crate::error::{AppError, WebError};
use crate::service::cli_login::{self, Pending, TOKEN_DAYS};
use crate::state::AppState;
use actix_session::Session;
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/cli/device", web::get().to(page))
        .route("/cli/device", web::post().to(decide));
}

#[derive(Template)]
#[template(path = "cli_device.html")]
struct DevicePage {
    banner: Banner,
    pending: Option<Pending>,
    typed: String,
    token_days: i64,
    done: Option<String>,
    error: Option<String>,
}

fn html(status: StatusCode, page: &DevicePage) -> Result<HttpResponse, WebError> {
    super::html_page(status, page)
}

#[derive(Deserialize)]
struct CodeQuery {
    #[serde(default)]
    code: String,
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: Option<CurrentUser>,
    query: web::Query<CodeQuery>,
) -> Result<HttpResponse, WebError> {
    let typed = normalise_user_code(&query.code);
    let Some(user) = user else {
        // Only letters, digits and '-' reach the path kept for after the login.
        super::login::return_after_login(&session, &format!("/cli/device?code={typed}"));
        return Ok(HttpResponse::SeeOther()
            .insert_header(("location", "/login"))
            .finish());
    };
    let mut error = None;
    let pending = if typed.is_empty() {
        None
    } else {
        match cli_login::find(&state, typed.clone()).await? {
            Some(p) if p.decided => {
                error = Some("this sign-in was already approved or denied".to_string());
                None
            }
            Some(p) => Some(p),
            None => {
                error = Some(format!(
                    "no sign-in waits with the code {typed} (mistyped, or expired after 10 minutes)"
                ));
                None
            }
        }
    };
    let page = DevicePage {
        banner: Banner::new(&state, &session, Some(&user)),
        pending,
        typed,
        token_days: TOKEN_DAYS,
        done: None,
        error,
    };
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
struct Decision {
    user_code: String,
    decision: String,
}

async fn decide(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: CsrfForm<Decision>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let approve = match form.decision.as_str() {
        "approve" => true,
        "deny" => false,
        _ => return Err(AppError::invalid("decision", "approve or deny").into()),
    };
    let result = cli_login::decide(&state, &user, form.user_code.clone(), approve).await;
    let (status, done, error) = match result {
        Ok(()) if approve => (
            StatusCode::OK,
            Some("Signed in: go back to your terminal. You can close this page.".to_string()),
            None,
        ),
        Ok(()) => (
            StatusCode::OK,
            Some("Denied: the terminal that asked was not signed in.".to_string()),
            None,
        ),
        Err(e @ (AppError::Invalid { .. } | AppError::Conflict { .. })) => {
            (e.status(), None, Some(e.to_string()))
        }
        Err(e) => return Err(e.into()),
    };
    let page = DevicePage {
        banner: Banner::new(&state, &session, Some(&user)),
        pending: None,
        typed: normalise_user_code(&form.user_code),
        token_days: TOKEN_DAYS,
        done,
        error,
    };
    html(status, &page)
}
