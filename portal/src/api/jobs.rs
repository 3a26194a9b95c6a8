//! `/api/v1/jobs`: submit, list (the caller's, or a lab's for its admins), read, logs
//! (from an offset, for followers), history, cancel, extend.

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::extend::ExtendRequest;
use crate::service::{extend as ext, jobs};
use crate::state::AppState;
use crate::validate::JobRequest;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs", web::post().to(submit))
        .route("/jobs", web::get().to(list))
        .route("/jobs/{id}", web::get().to(get))
        .route("/jobs/{id}/logs", web::get().to(logs))
        .route("/jobs/{id}/events", web::get().to(events))
        .route("/jobs/{id}/cancel", web::post().to(cancel))
        .route("/jobs/{id}/extend", web::post().to(extend));
}

async fn submit(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<JobRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = jobs::submit(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// A lab's jobs (its admins), instead of the caller's own.
    lab: Option<String>,
}

/// The caller's jobs, or with `?lab=SLUG` the lab's (its admins), newest first.
async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    match query.into_inner().lab {
        Some(slug) => {
            let views = jobs::list_lab(&state, &user, slug, 500).await?;
            Ok(HttpResponse::Ok().json(views))
        }
        None => {
            let views = jobs::list(&state, &user, 500).await?;
            Ok(HttpResponse::Ok().json(views))
        }
    }
}

async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = jobs::get(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    /// Only the output from this byte on (what a follower has not seen yet).
    offset: Option<usize>,
}

/// The job's output; with `?offset=N` from byte N on (the next character boundary).
/// `x-log-bytes` says how long the whole output is, so a follower knows where it is.
async fn logs(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    query: web::Query<LogsQuery>,
) -> Result<HttpResponse, ApiError> {
    let text = jobs::logs(&state, &user, id.into_inner()).await?;
    let total = text.len();
    let mut from = query.offset.unwrap_or(0).min(total);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header(("x-log-bytes", total.to_string()))
        .body(text[from..].to_string()))
}

async fn events(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let events = jobs::events(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(events))
}

async fn cancel(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = jobs::cancel(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// `{minutes}` more for the caller's queued or running interactive job.
async fn extend(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    body: ApiJson<ExtendRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = ext::extend(&state, &user, id.into_inner(), body.0).await?;
    Ok(HttpResponse::Ok().json(view))
}
