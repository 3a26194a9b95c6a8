//! The parts of the agents' per-attempt file routes (`{PREFIX}/{job}/{attempt}/{path}`:
//! outputs, inputs and datasets) that their handlers read and answer the same way.

use crate::error::{ApiError, AppError};
use crate::service::files::Download;
use actix_web::{HttpRequest, HttpResponse};
use commons_proto::SHA256_HEADER;
use futures_util::TryStreamExt;

/// (job, attempt) of the route; malformed numbers are "not found".
pub fn attempt_of(req: &HttpRequest) -> Result<(i64, i32), AppError> {
    let job = req.match_info().get("job").and_then(|s| s.parse().ok());
    let attempt = req.match_info().get("attempt").and_then(|s| s.parse().ok());
    match (job, attempt) {
        (Some(job), Some(attempt)) => Ok((job, attempt)),
        _ => Err(AppError::NotFound("attempt")),
    }
}

/// `{path}` from the URI as sent: what follows `{prefix}/{job}/{attempt}/`, decoded once
/// (the file spaces' rules then apply, naming what is wrong).
pub fn file_path(req: &HttpRequest, prefix: &str) -> Result<String, AppError> {
    file_path_after(req, prefix, 2)
}

/// `{path}` after `parts` segments that follow `prefix` (2 for `{job}/{attempt}`, 3 with
/// a dataset's `{index}`), decoded once.
pub fn file_path_after(req: &HttpRequest, prefix: &str, parts: usize) -> Result<String, AppError> {
    // "/api/agent/v1/outputs/J/A/P": P follows the slash after A.
    let skip = prefix.matches('/').count() + 1 + parts;
    let raw = req
        .uri()
        .path()
        .splitn(skip + 1, '/')
        .nth(skip)
        .unwrap_or("");
    String::from_utf8(commons_api::files::percent_decode(raw))
        .map_err(|_| AppError::invalid("path", "the path is not UTF-8"))
}

/// A whole file for an agent, streamed with its SHA-256 (a range never comes from one).
pub fn whole_file(d: Download) -> Result<HttpResponse, ApiError> {
    match d {
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
