//! The agents' checkpoint API (HTTP beside the WebSocket; `commons_proto::CHECKPOINTS_PATH`
//! documents it): upload parts, list them, commit, download the latest. Each handler
//! authenticates the node, bounds the body, and calls one use case of
//! `service::checkpoints`, which decides what the node may do.
//!
//! Invariants:
//! - Every request carries `Authorization: Bearer <node credential>` of an enrolled,
//!   unrevoked node; anything else is 401 before the body is read.
//! - A part's body is read up to the part size and no further (413 past it); a commit's
//!   up to [`MAX_COMMIT_BODY`].
//! - Errors are the API's JSON errors; malformed path segments are 404.

use crate::db::models::Node;
use crate::error::{ApiError, AppError};
use crate::service::checkpoints;
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{
    CheckpointCommit, CHECKPOINTS_PATH, CHECKPOINT_ATTEMPT_HEADER, PART_BYTES_HEADER, SHA256_HEADER,
};
use futures_util::{StreamExt, TryStreamExt};

/// Most bytes a commit's JSON body may have.
pub const MAX_COMMIT_BODY: usize = 16 * 1024;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        &format!("{CHECKPOINTS_PATH}/{{job}}/{{attempt}}/parts/{{n}}"),
        web::put().to(put_part),
    )
    .route(
        &format!("{CHECKPOINTS_PATH}/{{job}}/{{attempt}}/parts"),
        web::get().to(list_parts),
    )
    .route(
        &format!("{CHECKPOINTS_PATH}/{{job}}/{{attempt}}/commit"),
        web::post().to(commit),
    )
    .route(
        &format!("{CHECKPOINTS_PATH}/{{job}}/latest"),
        web::get().to(latest),
    );
}

/// The node whose credential the request carries.
pub(super) async fn node(state: &AppState, req: &HttpRequest) -> Result<Node, AppError> {
    let credential = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_string)
        .ok_or_else(|| AppError::Unauthenticated("node credential required".into()))?;
    crate::service::agent_link::node_for_credential(state, credential).await
}

/// A path segment as a number; anything else is "not found".
fn number<T: std::str::FromStr>(segment: &str, what: &'static str) -> Result<T, AppError> {
    segment.parse().map_err(|_| AppError::NotFound(what))
}

/// Reads the body, refusing it past `limit` bytes (by its declared length, or as it comes).
async fn body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    too_large: impl Fn() -> AppError,
) -> Result<bytes::Bytes, AppError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| AppError::BadRequest(format!("cannot read the body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

async fn put_part(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt, n) = path.into_inner();
    let (job, attempt, n) = (
        number(&job, "job")?,
        number(&attempt, "attempt")?,
        number(&n, "part")?,
    );
    let limit = state.checkpoints.limits().part_bytes;
    let data = body(&req, payload, limit as usize, || {
        AppError::TooLarge(format!("a part holds at most {limit} bytes"))
    })
    .await?;
    let sha = req
        .headers()
        .get(SHA256_HEADER)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    let part =
        checkpoints::put_part(&state, node.id, job, attempt, n, sha.as_deref(), data).await?;
    Ok(HttpResponse::Ok().json(part))
}

async fn list_parts(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = path.into_inner();
    let (job, attempt) = (number(&job, "job")?, number(&attempt, "attempt")?);
    let parts = checkpoints::list_parts(&state, node.id, job, attempt).await?;
    Ok(HttpResponse::Ok()
        .insert_header((PART_BYTES_HEADER, state.checkpoints.limits().part_bytes))
        .json(parts))
}

async fn commit(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let (job, attempt) = path.into_inner();
    let (job, attempt) = (number(&job, "job")?, number(&attempt, "attempt")?);
    let raw = body(&req, payload, MAX_COMMIT_BODY, || {
        AppError::TooLarge(format!(
            "a commit's body is at most {MAX_COMMIT_BODY} bytes"
        ))
    })
    .await?;
    let commit: CheckpointCommit = serde_json::from_slice(&raw).map_err(|e| {
        AppError::BadRequest(format!(
            "the body is not a commit {{parts, bytes, sha256}}: {e}"
        ))
    })?;
    let done = checkpoints::commit(&state, node.id, job, attempt, commit).await?;
    Ok(HttpResponse::Ok().json(done))
}

async fn latest(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let node = node(&state, &req).await?;
    let job = number(&path.into_inner(), "job")?;
    let Some(download) = checkpoints::latest(&state, node.id, job).await? else {
        return Err(AppError::NotFound("checkpoint").into());
    };
    let k = &download.checkpoint;
    let body = download.body.map_err(|e| {
        tracing::error!("checkpoint download cut short: {e}");
        std::io::Error::other(e)
    });
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header((SHA256_HEADER, k.sha256.clone()))
        .insert_header((CHECKPOINT_ATTEMPT_HEADER, k.attempt))
        .body(actix_web::body::SizedStream::new(
            k.bytes.max(0) as u64,
            body,
        )))
}
