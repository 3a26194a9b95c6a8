//! The parts of the agents' per-attempt file routes (`{PREFIX}/{job}/{attempt}/{path}`:
//! outputs and inputs) that their handlers read the same way.

use crate::error::AppError;
use actix_web::HttpRequest;

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
    // "/api/agent/v1/outputs/J/A/P": P follows the slash after A.
    let skip = prefix.matches('/').count() + 3;
    let raw = req
        .uri()
        .path()
        .splitn(skip + 1, '/')
        .nth(skip)
        .unwrap_or("");
    String::from_utf8(commons_api::files::percent_decode(raw))
        .map_err(|_| AppError::invalid("path", "the path is not UTF-8"))
}
