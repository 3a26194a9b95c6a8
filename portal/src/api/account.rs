//! `GET /api/v1/me` (who the caller is: labs, roles, quotas and use, as the scheduler
//! reads them) and `GET /api/v1/usage[?lab=SLUG]` (GPU-hours by week: the caller's, or
//! a lab's for its admins).

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::account;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::account::SessionsEnded;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/me", web::get().to(me))
        .route("/usage", web::get().to(usage))
        .route("/users/{username}/sign-out", web::post().to(sign_out));
}

async fn me(state: web::Data<AppState>, user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let policy = state.config.policy.clone();
    let actor = user.0;
    let view = state
        .db
        .run(move |c| account::account(c, &actor, &policy))
        .await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    lab: Option<String>,
}

async fn usage(
    state: web::Data<AppState>,
    user: CurrentUser,
    query: web::Query<UsageQuery>,
) -> Result<HttpResponse, ApiError> {
    let view = account::usage(&state, &user, query.into_inner().lab).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// `POST /api/v1/users/{username}/sign-out`: ends every browser session of the user (the
/// caller's own, or anyone's for an operator) -> `{sessions_ended}`.
async fn sign_out(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let n = crate::service::sessions::sign_out_everywhere(&state, &user, &path).await?;
    Ok(HttpResponse::Ok().json(SessionsEnded {
        sessions_ended: n as u64,
    }))
}
