//! `/api/v1/jobs`: submit, list, read, logs, history, cancel.

use super::views::{job_view, JobView};
use super::ApiJson;
use crate::auth::CurrentUser;
use crate::db::jobs;
use crate::error::ApiError;
use crate::service;
use crate::state::AppState;
use crate::validate::JobRequest;
use actix_web::{web, HttpResponse};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs", web::post().to(submit))
        .route("/jobs", web::get().to(list))
        .route("/jobs/{id}", web::get().to(get))
        .route("/jobs/{id}/logs", web::get().to(logs))
        .route("/jobs/{id}/events", web::get().to(events))
        .route("/jobs/{id}/cancel", web::post().to(cancel));
}

async fn submit(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<JobRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = service::submit(&state, user, body.0).await?;
    Ok(HttpResponse::Created().json(view))
}

async fn list(state: web::Data<AppState>, user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let views: Vec<JobView> = state
        .db
        .run(move |c| {
            jobs::list_for_user(c, user.user.id, 500)?
                .iter()
                .map(|j| job_view(c, j))
                .collect::<Result<_, _>>()
        })
        .await?;
    Ok(HttpResponse::Ok().json(views))
}

async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let view = state
        .db
        .run(move |c| {
            let job = jobs::get_for(c, id, &user)?;
            job_view(c, &job)
        })
        .await?;
    Ok(HttpResponse::Ok().json(view))
}

async fn logs(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let text = state
        .db
        .run(move |c| {
            jobs::get_for(c, id, &user)?;
            jobs::logs(c, id, jobs::MAX_LOG_BYTES as usize)
        })
        .await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(text))
}

async fn events(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let events = state
        .db
        .run(move |c| {
            jobs::get_for(c, id, &user)?;
            jobs::events(c, id)
        })
        .await?;
    Ok(HttpResponse::Ok().json(events))
}

async fn cancel(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = service::cancel(&state, user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}
