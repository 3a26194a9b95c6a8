//! `/cli/device`: where a signed-in user approves (or denies) a sign-in of the `commons`
//! CLI (the device authorization grant; see `service::cli_login`).
//!
//! Three steps, so that no link can approve: the page asks for the code (a `?code=` in
//! the link is ignored); the typed code (`POST /cli/device/check`) shows who asks, from
//! where and when; the decision (`POST /cli/device`) needs a session or a token that may
//! add credentials ([`CredentialsManager`]), so a restricted CLI token cannot approve a
//! fuller one. A visitor who is not signed in is sent to the login first and back here.

use super::Banner;
use crate::auth::{CredentialsManager, CsrfForm, CurrentUser};
use crate::error::{AppError, WebError};
use crate::service::cli_login::normalise_user_code;
use crate::service::cli_login::{self, Pending, CLIENT};
use crate::state::AppState;
use actix_session::Session;
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/cli/device", web::get().to(page))
        .route("/cli/device/check", web::post().to(check))
        .route("/cli/device", web::post().to(decide));
}

#[derive(Template)]
#[template(path = "cli_device.html")]
struct DevicePage {
    banner: Banner,
    pending: Option<Pending>,
    client: &'static str,
    token_days: u32,
    /// The link carried a code, which is not used.
    linked: bool,
    done: Option<String>,
    error: Option<String>,
}

impl DevicePage {
    fn new(state: &AppState, session: &Session, user: &CurrentUser) -> Self {
        DevicePage {
            banner: Banner::new(state, session, Some(user)),
            pending: None,
            client: CLIENT,
            token_days: state.config.cli_login.token_days,
            linked: false,
            done: None,
            error: None,
        }
    }

    /// When the request was made, as `<time datetime>` wants it.
    fn when_rfc3339(&self) -> String {
        self.pending
            .as_ref()
            .map(|p| {
                p.created_at
                    .and_utc()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            })
            .unwrap_or_default()
    }
}

fn html(status: StatusCode, page: &DevicePage) -> Result<HttpResponse, WebError> {
    super::html_page(status, page)
}

#[derive(Deserialize)]
struct CodeQuery {
    #[serde(default)]
    code: Option<String>,
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: Option<CurrentUser>,
    query: web::Query<CodeQuery>,
) -> Result<HttpResponse, WebError> {
    let Some(user) = user else {
        super::login::return_after_login(&session, "/cli/device");
        return Ok(HttpResponse::SeeOther()
            .insert_header(("location", "/login"))
            .finish());
    };
    let mut page = DevicePage::new(&state, &session, &user);
    page.linked = query.code.as_deref().is_some_and(|c| !c.is_empty());
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
struct Typed {
    user_code: String,
}

/// The code as the user typed it: the request it names, for a decision.
async fn check(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: CsrfForm<Typed>,
) -> Result<HttpResponse, WebError> {
    let typed = normalise_user_code(&form.0.user_code);
    let mut page = DevicePage::new(&state, &session, &user);
    let found = if typed.is_empty() {
        None
    } else {
        cli_login::find(&state, typed.clone()).await?
    };
    let status = match found {
        Some(p) if p.decided => {
            page.error = Some("this sign-in was already approved or denied".into());
            StatusCode::CONFLICT
        }
        Some(p) => {
            page.pending = Some(p);
            StatusCode::OK
        }
        None => {
            page.error = Some(format!(
                "no sign-in waits with the code {typed} (mistyped, or expired after 10 minutes)"
            ));
            StatusCode::BAD_REQUEST
        }
    };
    html(status, &page)
}

#[derive(Deserialize)]
struct Decision {
    user_code: String,
    decision: String,
    /// The box "may add SSH keys and access tokens": `on` when ticked.
    #[serde(default)]
    credentials: Option<String>,
}

async fn decide(
    state: web::Data<AppState>,
    session: Session,
    user: CredentialsManager,
    form: CsrfForm<Decision>,
) -> Result<HttpResponse, WebError> {
    let user = user.0;
    let form = form.0;
    let approve = match form.decision.as_str() {
        "approve" => Some(form.credentials.as_deref() == Some("on")),
        "deny" => None,
        _ => return Err(AppError::invalid("decision", "approve or deny").into()),
    };
    let result = cli_login::decide(&state, &user, form.user_code.clone(), approve).await;
    let mut page = DevicePage::new(&state, &session, &user);
    let status = match result {
        Ok(()) if approve.is_some() => {
            page.done =
                Some("Signed in: go back to your terminal. You can close this page.".into());
            StatusCode::OK
        }
        Ok(()) => {
            page.done = Some("Denied: the terminal that asked was not signed in.".into());
            StatusCode::OK
        }
        Err(e @ (AppError::Invalid { .. } | AppError::Conflict { .. })) => {
            page.error = Some(e.to_string());
            e.status()
        }
        Err(e) => return Err(e.into()),
    };
    html(status, &page)
}
