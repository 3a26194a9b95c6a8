//! The agents' outputs API (`commons_proto::OUTPUTS_PATH` documents it): upload a job's
//! `/outputs` files after an attempt stops, list and download them for a resumed attempt.
//! Each handler authenticates the node and calls one use case of
//! `service::files::outputs`, which decides what the node may do.
//!
//! Invariants:
//! - Every request carries the credential of an enrolled, unrevoked node; anything else
//!   is 401 before the body is read.
//! - A file's body streams to the store; `{path}` is read from the URI as sent and
//!   decoded once (the file spaces' rules then apply, naming what is wrong).

use super::attempt_path::{attempt_of, file_path, whole_file};
use super::checkpoints::node;
use crate::error::ApiError;
use crate::service::files::outputs;
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{OUTPUTS_PATH, SHA256_HEADER};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        &format!("{OUTPUTS_PATH}/{{job}}/{{attempt}}"),
        web::get().to(list),
    )
    .service(
        web::resource(format!("{OUTPUTS_PATH}/{{job}}/{{attempt}}/{{path:.*}}"))
            .route(web::put().to(put))
            .route(web::get().to(get)),
    );
}

async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let kept = outputs::list_for_node(&state, node.id, job, attempt).await?;
    Ok(HttpResponse::Ok().json(kept))
}

async fn put(
    state: web::Data<AppState>,
    req: HttpRequest,
    mut payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let path = file_path(&req, OUTPUTS_PATH)?;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<u64>().ok());
    let sha = req
        .headers()
        .get(SHA256_HEADER)
        .and_then(|h| h.to_str().ok());
    let stored = outputs::put_from_node(
        &state,
        node.id,
        job,
        attempt,
        &path,
        declared,
        sha,
        &mut payload,
    )
    .await;
    match stored {
        Ok(up) => Ok(HttpResponse::Ok().json(up.entry)),
        Err(e) => {
            drain_refused(&mut payload).await;
            Err(e.into())
        }
    }
}

/// Most bytes of a refused upload read (and dropped) before the answer.
const DRAIN_BYTES: usize = 64 << 20;

/// Reads and drops what is left of a refused upload's body, up to [`DRAIN_BYTES`] or
/// 10 s, so that a client still sending reads the refusal rather than a reset
/// connection (the API's uploads use it too).
pub async fn drain_refused(payload: &mut web::Payload) {
    use futures_util::StreamExt;
    let read = async {
        let mut n = 0;
        while let Some(Ok(chunk)) = payload.next().await {
            n += chunk.len();
            if n > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
}

async fn get(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = attempt_of(&req)?;
    let path = file_path(&req, OUTPUTS_PATH)?;
    whole_file(outputs::get_for_node(&state, node.id, job, attempt, &path).await?)
}
