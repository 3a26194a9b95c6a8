//! The agents' inputs API (`commons_proto::INPUTS_PATH` documents it): list and download
//! the files a starting attempt stages under `/inputs`, and report how far staging got.
//! Each handler authenticates the node and calls one use case of
//! `service::files::inputs`, which decides what the node may do.
//!
//! Invariants:
//! - Every request carries the credential of an enrolled, unrevoked node; anything else
//!   is 401.
//! - A file streams from the store to the agent, never held whole here.

use super::checkpoints::node;
use crate::error::{ApiError, AppError};
use crate::service::files::{inputs, Download};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{Staging, INPUTS_PATH, SHA256_HEADER, STAGING_PATH};
use futures_util::TryStreamExt;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        &format!("{INPUTS_PATH}/{{job}}/{{attempt}}"),
        web::get().to(list),
    )
    .route(
        &format!("{INPUTS_PATH}/{{job}}/{{attempt}}/{{path:.*}}"),
        web::get().to(get),
    )
    .route(
        &format!("{STAGING_PATH}/{{job}}/{{attempt}}"),
        web::post().to(report),
    );
}

/// (job, attempt) of the route; malformed numbers are "not found".
fn attempt_of(req: &HttpRequest) -> Result<(i64, i32), AppError> {
    let job = req.match_info().get("job").and_then(|s| s.parse().ok());
    let attempt = req.match_info().get("attempt").and_then(|s| s.parse().ok());
    match (job, attempt) {
        (Some(job), Some(attempt)) => Ok((job, attempt)),
        _ => Err(AppError::NotFound("attempt")),
    }
}

/// `{path}` from the URI as sent: what follows `{INPUTS_PATH}/{job}/{attempt}/`,
/// decoded once.
fn file_path(req: &HttpRequest) -> Result<String, AppError> {
    let skip = INPUTS_PATH.matches('/').count() + 3;
    let raw = req
        .uri()
        .path()
        .splitn(skip + 1, '/')
        .nth(skip)
        .unwrap_or("");
    String::from_utf8(commons_api::files::percent_decode(raw))
        .map_err(|_| AppError::invalid("path", "the path is not UTF-8"))
}

async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let files = inputs::list_for_node(&state, node.id, job, attempt).await?;
    Ok(HttpResponse::Ok().json(files))
}

async fn get(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let path = file_path(&req)?;
    match inputs::get_for_node(&state, node.id, job, attempt, &path).await? {
        Download::Body { file, body, .. } => Ok(HttpResponse::Ok()
            .content_type("application/octet-stream")
            .insert_header((SHA256_HEADER, file.sha256.clone()))
            .body(actix_web::body::SizedStream::new(
                file.size,
                body.map_err(std::io::Error::other),
            ))),
        Download::Unsatisfiable { .. } => Err(AppError::NotFound("file").into()),
    }
}

async fn report(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<Staging>,
) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    inputs::report(&state, node.id, job, attempt, body.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}
