//! The agents' datasets API (`commons_proto::DATASETS_PATH` documents it): list and
//! download the files of a starting attempt's `lab:` dataset. Each handler authenticates
//! the node and calls one use case of `service::files::datasets`.
//!
//! Invariants:
//! - Every request carries the credential of an enrolled, unrevoked node; anything else
//!   is 401.
//! - A file streams from the store to the agent, never held whole here.

use super::attempt_path::{attempt_of, file_path_after, whole_file};
use super::checkpoints::node;
use crate::error::{ApiError, AppError};
use crate::service::files::datasets;
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::DATASETS_PATH;

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
    let path = file_path_after(&req, DATASETS_PATH, 3)?;
    whole_file(datasets::get_for_node(&state, node.id, job, attempt, index, &path).await?)
}
