//! `GET /api/v1/jobs/{id}/utilization`: the job's GPU utilisation over time, per attempt,
//! from the agents' heartbeats (who may see the job may read it; others get 404).

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::utilization;
use crate::state::AppState;
use actix_web::{web, HttpResponse};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs/{id}/utilization", web::get().to(get));
}

async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let config = &state.config.utilization;
    let view = utilization::of_job(&state, &user, id.into_inner(), config).await?;
    Ok(HttpResponse::Ok().json(view))
}
