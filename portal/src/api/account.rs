//! `GET /api/v1/me` (who the caller is: labs, roles, quotas and use, as the scheduler
//! reads them) and `GET /api/v1/usage[?lab=SLUG]` (GPU-hours by week: the caller's, or
//! a lab's for its admins).

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::account;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::account::{Account, LabUsageView, SessionsEnded};
use commons_api::ErrorBody;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/me", web::get().to(me))
        .route("/usage", web::get().to(usage))
        .route("/users/{username}/sign-out", web::post().to(sign_out));
}

/// Who the caller is: labs, roles, and in each lab the quota that binds them and what
/// they use of it now.
#[utoipa::path(get, path = "/api/v1/me", tag = "account", operation_id = "me",
    responses(
        (status = 200, description = "The caller's account", body = Account),
        (status = "4XX", description = "Refused (401: no valid token)", body = ErrorBody),
    ))]
pub(crate) async fn me(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    let view = account::me(&state, &user, state.config.policy.clone()).await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageQuery {
    /// A lab's whole usage, by member (its admins), instead of the caller's own.
    lab: Option<String>,
}

/// GPU-hours by week (Monday, UTC), newest first: the caller's in each of their labs, or
/// with `?lab=SLUG` the lab's and its members' (its admins).
#[utoipa::path(get, path = "/api/v1/usage", tag = "account", operation_id = "usage",
    params(UsageQuery),
    responses(
        (status = 200, description = "One entry per lab", body = Vec<LabUsageView>),
        (status = "4XX", description = "Refused (403: not the lab's admin)", body = ErrorBody),
    ))]
pub(crate) async fn usage(
    state: web::Data<AppState>,
    user: CurrentUser,
    query: web::Query<UsageQuery>,
) -> Result<HttpResponse, ApiError> {
    let view = account::usage(&state, &user, query.into_inner().lab).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Ends every browser session of the user (the caller's own, or anyone's for an
/// operator).
#[utoipa::path(post, path = "/api/v1/users/{username}/sign-out", tag = "account",
    operation_id = "sign_out_everywhere",
    params(("username" = String, Path, description = "Whose sessions")),
    responses(
        (status = 200, description = "How many sessions ended", body = SessionsEnded),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn sign_out(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let n = crate::service::sessions::sign_out_everywhere(&state, &user, &path).await?;
    Ok(HttpResponse::Ok().json(SessionsEnded {
        sessions_ended: n as u64,
    }))
}
