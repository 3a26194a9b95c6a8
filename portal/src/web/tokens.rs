//! Personal access tokens for the API and the CLI: made and revoked in the browser,
//! shown once, stored hashed, with an expiry and the time of last use.

use super::{optional, Banner};
use crate::auth::{CredentialsManager, CsrfForm, CurrentUser, NoFields};
use crate::db::users::{self, TokenInfo};
use crate::error::{AppError, WebError};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/tokens", web::get().to(page))
        .route("/tokens", web::post().to(create))
        .route("/tokens/{id}/revoke", web::post().to(revoke))
        .route(
            "/sessions/sign-out-everywhere",
            web::post().to(sign_out_everywhere),
        );
}

#[derive(Template, WebTemplate)]
#[template(path = "tokens.html")]
struct TokensPage {
    banner: Banner,
    tokens: Vec<TokenInfo>,
    /// The user's live browser sessions (this one included).
    sessions: i64,
    /// A token just made: shown this once.
    new_secret: Option<String>,
    error: Option<String>,
}

async fn render(
    state: &AppState,
    session: &Session,
    user: CurrentUser,
    new_secret: Option<String>,
    error: Option<String>,
) -> Result<TokensPage, WebError> {
    let banner = Banner::new(state, session, Some(&user));
    let id = user.user.id;
    let (tokens, sessions) = state
        .db
        .run(move |c| {
            Ok::<_, AppError>((
                users::tokens_of(c, id)?,
                crate::db::web_sessions::count_for_user(c, id)?,
            ))
        })
        .await?;
    Ok(TokensPage {
        banner,
        tokens,
        sessions,
        new_secret,
        error,
    })
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<TokensPage, WebError> {
    render(&state, &session, user, None, None).await
}

#[derive(Deserialize)]
struct NewToken {
    name: String,
    /// Days until it expires; empty: never.
    #[serde(default)]
    expires_days: String,
}

async fn create(
    state: web::Data<AppState>,
    session: Session,
    user: CredentialsManager,
    form: CsrfForm<NewToken>,
) -> Result<HttpResponse, WebError> {
    let user = user.0;
    let id = user.user.id;
    let form = form.0;
    let result = match optional::<i64>("expires_days", &form.expires_days) {
        Ok(Some(d)) if !(1..=3650).contains(&d) => Err(AppError::invalid(
            "expires_days",
            "from 1 to 3650 days, or empty for never",
        )),
        Ok(days) => {
            let until = days.map(|d| crate::db::now() + chrono::Duration::days(d));
            state
                .db
                .run(move |c| users::create_api_token_until(c, id, &form.name, until))
                .await
                .map_err(AppError::from)
        }
        Err(e) => Err(e),
    };
    let (status, page) = match result {
        Ok(secret) => (
            actix_web::http::StatusCode::OK,
            render(&state, &session, user, Some(secret), None).await?,
        ),
        Err(e @ AppError::Invalid { .. }) => {
            let msg = format!("{}: {e}", e.field().unwrap_or_default());
            (
                actix_web::http::StatusCode::UNPROCESSABLE_ENTITY,
                render(&state, &session, user, None, Some(msg)).await?,
            )
        }
        Err(e) => return Err(e.into()),
    };
    super::html_page(status, &page)
}

async fn revoke(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let (uid, token) = (user.user.id, id.into_inner());
    state
        .db
        .run(move |c| users::revoke_token(c, uid, token))
        .await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/tokens"))
        .finish())
}

/// Ends every browser session of the user, this one included (a cookie copied from any
/// of them is worth nothing afterwards), and goes to the login page.
async fn sign_out_everywhere(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    crate::service::sessions::sign_out_everywhere(&state, &user, &user.user.username).await?;
    crate::auth::log_out(&session);
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/login"))
        .finish())
}
