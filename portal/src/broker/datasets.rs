//! The agents' datasets API (`commons_proto::DATASETS_PATH` documents it): list and
//! download the files of a starting attempt's `lab:` dataset. Each handler authenticates
//! the node and calls one use case of `service::files::datasets`.
//!
//! Invariants:
//! - Every request carries the credential of an enrolled, unrevoked node; anything else
//!   is 401.
//! - A file streams from the store to the agent, never held whole here.

use super::attempt_path::attempt_of;
use super::checkpoints::node;
use crate::error::{ApiError, AppError};
use crate::service::files::{datasets, Download};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{DATASETS_PATH, SHA256_HEADER};
use futures_util::TryStreamExt;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        &format!("{DATASETS_PATH}/{{job}}/{{attempt}}/{{index}}"),
        web::get().to(list),
    )
    .route(
        &format!("{DATASETS_PATH}/{{job}}/{{attempt}}/{{index}}/{{path:.*}}"),
        web::get().to(get),
    );
}

fn index_of(req: &HttpRequest) -> Result<usize, AppError> {
    req.match_info()
        .get("index")
        .and_then(|s| s.parse().ok())
        .ok_or(AppError::NotFound("dataset"))
}

async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let index = index_of(&req)?;
    let listing = datasets::listing_for_node(&state, node.id, job, attempt, index).await?;
    Ok(HttpResponse::Ok().json(listing))
}

async fn get(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let index = index_of(&req)?;
    // "/api/agent/v1/datasets/J/A/I/P": P follows the slash after I.
    let skip = DATASETS_PATH.matches('/').count() + 4;
    let raw = req
        .uri()
        .path()
        .splitn(skip + 1, '/')
        .nth(skip)
        .unwrap_or("");
    let path = String::from_utf8(commons_api::files::percent_decode(raw))
        .map_err(|_| AppError::invalid("path", "the path is not UTF-8"))?;
    match datasets::get_for_node(&state, node.id, job, attempt, index, &path).await? {
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
