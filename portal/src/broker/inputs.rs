//! The agents' inputs API (`commons_proto::INPUTS_PATH` documents it): list and download
//! the files a starting attempt stages under `/inputs`, and report how far staging got.
//! Each handler authenticates the node and calls one use case of
//! `service::files::inputs`, which decides what the node may do.
//!
//! Invariants:
//! - Every request carries the credential of an enrolled, unrevoked node; anything else
//!   is 401.
//! - A file streams from the store to the agent, never held whole here.

use super::attempt_path::{attempt_of, file_path, whole_file};
use super::checkpoints::node;
use crate::error::ApiError;
use crate::service::files::inputs;
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{Staging, INPUTS_PATH, STAGING_PATH};

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

async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let files = inputs::list_for_node(&state, node.id, job, attempt).await?;
    Ok(HttpResponse::Ok().json(files))
}

async fn get(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let path = file_path(&req, INPUTS_PATH)?;
    whole_file(inputs::get_for_node(&state, node.id, job, attempt, &path).await?)
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
