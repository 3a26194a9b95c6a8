//! `/api/v1/arrays`: an array of tasks (submitted with `array` on `POST /api/v1/jobs`),
//! its counts by state, and cancelling it whole. Each task is also a job of its own
//! (`/api/v1/jobs/{id}`, and `?array=ID` on the job list).

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::arrays;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::array::ArrayView;
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/arrays/{id}", web::get().to(get))
        .route("/arrays/{id}/cancel", web::post().to(cancel));
}

/// One array: its tasks' job ids and how many are in each state.
#[utoipa::path(get, path = "/api/v1/arrays/{id}", tag = "jobs", operation_id = "get_array",
    params(("id" = i64, Path, description = "The array's id (`COMMONS_ARRAY_ID`)")),
    responses(
        (status = 200, description = "The array", body = ArrayView),
        (status = "4XX", description = "Refused (404 for an array the caller may not see)", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = arrays::get(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Cancels every task of the array that has not ended (running ones are stopped on their
/// servers); ended tasks keep their state.
#[utoipa::path(post, path = "/api/v1/arrays/{id}/cancel", tag = "jobs", operation_id = "cancel_array",
    params(("id" = i64, Path, description = "The array's id")),
    responses(
        (status = 200, description = "The array, its unfinished tasks cancelled", body = ArrayView),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn cancel(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = arrays::cancel(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}
