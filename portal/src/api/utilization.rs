//! `GET /api/v1/jobs/{id}/utilization`: the job's GPU utilisation over time, per attempt,
//! from the agents' heartbeats (who may see the job may read it; others get 404).

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::utilization;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::utilization::Utilization;
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs/{id}/utilization", web::get().to(get));
}

/// The job's GPU utilisation over time, per attempt (who may see the job may read it).
#[utoipa::path(get, path = "/api/v1/jobs/{id}/utilization", tag = "jobs", operation_id = "job_utilization",
    params(("id" = i64, Path, description = "The job's id")),
    responses(
        (status = 200, description = "Samples by attempt, and their summary", body = Utilization),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let config = &state.config.utilization;
    let view = utilization::of_job(&state, &user, id.into_inner(), config).await?;
    Ok(HttpResponse::Ok().json(view))
}
