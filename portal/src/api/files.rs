//! Files: `GET /api/v1/files?prefix=P`, `GET|PUT|DELETE /api/v1/files/{path}`, the same
//! under `/api/v1/labs/{slug}/files`, and the quotas' settings
//! (`PUT /api/v1/labs/{slug}/files-quota`, `.../members/{username}/files-quota`).
//!
//! Invariants:
//! - `{path}` is read from the request's URI as sent, percent-decoded once: a path that
//!   is not UTF-8 is refused naming that rule (the router would have replaced its bytes).
//! - An upload's body goes to `service::files::upload` as a stream, never read whole;
//!   after a refusal, some more of it is read and dropped so that the client, still
//!   sending, reads the refusal rather than a reset connection
//!   (`broker::outputs::drain_refused`).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::{ApiError, AppError};
use crate::service::files::{self, Download, FileEntry, FilesQuotaRequest, FilesQuotaSaved, Which};
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_api::files::SHA256_HEADER;
use commons_api::ErrorBody;
use futures_util::TryStreamExt;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/files", web::get().to(list))
        .service(
            web::resource("/files/{path:.*}")
                .route(web::get().to(get))
                .route(web::put().to(put))
                .route(web::delete().to(delete)),
        )
        .route("/labs/{slug}/files", web::get().to(lab_list))
        .service(
            web::resource("/labs/{slug}/files/{path:.*}")
                .route(web::get().to(lab_get))
                .route(web::put().to(lab_put))
                .route(web::delete().to(lab_delete)),
        )
        .route("/jobs/{id}/outputs", web::get().to(job_outputs))
        .route("/labs/{slug}/files-quota", web::put().to(put_lab_quota))
        .route(
            "/labs/{slug}/members/{username}/files-quota",
            web::put().to(put_member_quota),
        );
}

/// The space the route names: a lab's when it has a `{slug}`.
fn which(req: &HttpRequest) -> Which {
    match req.match_info().get("slug") {
        Some(slug) => Which::Lab(slug.to_string()),
        None => Which::Mine,
    }
}

/// `{path}` from the URI as sent (see the module's invariants).
fn file_path(req: &HttpRequest) -> Result<String, AppError> {
    // `/api/v1/files/P` or `/api/v1/labs/S/files/P`: P follows the 4th or the 6th '/'.
    let skip = if req.match_info().get("slug").is_some() {
        6
    } else {
        4
    };
    let raw = req
        .uri()
        .path()
        .splitn(skip + 1, '/')
        .nth(skip)
        .unwrap_or("");
    let bytes = commons_api::files::percent_decode(raw);
    String::from_utf8(bytes).map_err(|_| {
        AppError::invalid(
            "path",
            "the path is not UTF-8: file paths are UTF-8 text, percent-encoded in the URL",
        )
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only paths that start with this (`data/` for a folder); all when left out.
    #[serde(default)]
    prefix: String,
}

/// The caller's files (or a lab's, for its members) whose path starts with `prefix`, by
/// path.
#[utoipa::path(get, path = "/api/v1/files", tag = "files", operation_id = "list_files",
    params(ListQuery),
    responses(
        (status = 200, description = "The files, by path", body = Vec<FileEntry>),
        (status = "4XX", description = "Refused: `field` names a bad prefix (422)", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let found = files::list(&state, &user, which(&req), query.into_inner().prefix).await?;
    Ok(HttpResponse::Ok().json(found))
}

/// A file's bytes: all of them, or the one range `Range: bytes=A-B` asks for (206).
#[utoipa::path(get, path = "/api/v1/files/{path}", tag = "files", operation_id = "get_file",
    params(("path" = String, Path, description = "The file's path; it may hold '/'")),
    responses(
        (status = 200, description = "The file", body = String, content_type = "application/octet-stream",
            headers(("x-commons-sha256" = String, description = "SHA-256 of the whole file, in hex"))),
        (status = 206, description = "The range asked for", body = String,
            content_type = "application/octet-stream"),
        (status = "4XX", description = "Refused (404: no such file; 416: a range past its end)", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|h| h.to_str().ok());
    let got = files::download(&state, &user, which(&req), file_path(&req)?, range).await?;
    Ok(download_response(got))
}

/// `attachment; filename="..."; filename*=UTF-8''...` for the file's last segment.
fn disposition(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut encoded = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

fn download_response(got: Download) -> HttpResponse {
    let (file, range, body) = match got {
        Download::Unsatisfiable { size } => {
            return HttpResponse::RangeNotSatisfiable()
                .insert_header((header::CONTENT_RANGE, format!("bytes */{size}")))
                .json(ErrorBody {
                    error: "range_not_satisfiable".into(),
                    message: format!(
                        "the file has {size} bytes: the range asked for lies past its end"
                    ),
                    ..Default::default()
                });
        }
        Download::Body { file, range, body } => (file, range, body),
    };
    let mut res = match range {
        Some(_) => HttpResponse::PartialContent(),
        None => HttpResponse::Ok(),
    };
    let modified: std::time::SystemTime = file.modified.and_utc().into();
    res.content_type("application/octet-stream")
        .insert_header((header::ACCEPT_RANGES, "bytes"))
        .insert_header((header::ETAG, format!("\"{}\"", file.sha256)))
        .insert_header((header::LAST_MODIFIED, header::HttpDate::from(modified)))
        .insert_header((header::CONTENT_DISPOSITION, disposition(&file.path)))
        .insert_header((SHA256_HEADER, file.sha256.clone()));
    let len = match range {
        Some((start, end)) => {
            res.insert_header((
                header::CONTENT_RANGE,
                format!("bytes {start}-{end}/{}", file.size),
            ));
            end - start + 1
        }
        None => file.size,
    };
    let body = body.map_err(|e| {
        tracing::error!("file download cut short: {e}");
        std::io::Error::other(e)
    });
    res.body(actix_web::body::SizedStream::new(len, body))
}

/// Stores the request's body as the file at `path`, replacing any file there, streamed:
/// counted against the space's quota as it arrives (413 `file_quota` when it would pass
/// it, keeping nothing). `x-commons-sha256`, when sent, must match the body.
#[utoipa::path(put, path = "/api/v1/files/{path}", tag = "files", operation_id = "put_file",
    params(("path" = String, Path, description = "The file's path; it may hold '/'"),
        ("x-commons-sha256" = Option<String>, Header, description = "The body's SHA-256 in hex, checked when sent")),
    request_body(content = String, content_type = "application/octet-stream", description = "The file's bytes"),
    responses(
        (status = 201, description = "A new file", body = FileEntry),
        (status = 200, description = "The file at that path was replaced", body = FileEntry),
        (status = "4XX", description = "Refused: 413 `file_quota` names the quota; 422 names the path's rule", body = ErrorBody),
    ))]
pub(crate) async fn put(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
    mut payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<u64>().ok());
    let sha = req
        .headers()
        .get(SHA256_HEADER)
        .and_then(|h| h.to_str().ok());
    let path = file_path(&req);
    let done = match path {
        Ok(p) => files::upload(&state, &user, which(&req), p, declared, sha, &mut payload).await,
        Err(e) => Err(e),
    };
    match done {
        Ok(up) if up.created => Ok(HttpResponse::Created().json(up.entry)),
        Ok(up) => Ok(HttpResponse::Ok().json(up.entry)),
        Err(e) => {
            crate::broker::outputs::drain_refused(&mut payload).await;
            Err(e.into())
        }
    }
}

/// Deletes a file.
#[utoipa::path(delete, path = "/api/v1/files/{path}", tag = "files", operation_id = "delete_file",
    params(("path" = String, Path, description = "The file's path; it may hold '/'")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", description = "Refused (404: no such file)", body = ErrorBody),
    ))]
pub(crate) async fn delete(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    files::delete(&state, &user, which(&req), file_path(&req)?).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// The job's outputs (its owner's): what it wrote to `/outputs`, kept in the owner's files
/// under `jobs/{id}/`; download them as files (`GET /api/v1/files/{path}`).
#[utoipa::path(get, path = "/api/v1/jobs/{id}/outputs", tag = "jobs", operation_id = "job_outputs",
    params(("id" = i64, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The outputs, by path (in the owner's files)", body = Vec<FileEntry>),
        (status = "4XX", description = "Refused (403: not the job's owner; 404: no such job)", body = ErrorBody),
    ))]
pub(crate) async fn job_outputs(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let found = files::outputs::list(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(found))
}

/// Sets (or with `null` clears) a lab's quota for its shared space (operators).
#[utoipa::path(put, path = "/api/v1/labs/{slug}/files-quota", tag = "files",
    operation_id = "set_lab_files_quota",
    params(("slug" = String, Path, description = "The lab")),
    request_body = FilesQuotaRequest,
    responses(
        (status = 200, description = "Stored", body = FilesQuotaSaved),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_lab_quota(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<FilesQuotaRequest>,
) -> Result<HttpResponse, ApiError> {
    let saved = files::set_lab_quota(&state, &user, slug.into_inner(), body.0).await?;
    Ok(HttpResponse::Ok().json(saved))
}

/// Sets (or with `null` clears) the quota the lab gives a member for their own space (its
/// admins, operators); a user's quota is the largest their labs give, else the campus's.
#[utoipa::path(put, path = "/api/v1/labs/{slug}/members/{username}/files-quota", tag = "files",
    operation_id = "set_member_files_quota",
    params(("slug" = String, Path, description = "The lab"),
        ("username" = String, Path, description = "The member")),
    request_body = FilesQuotaRequest,
    responses(
        (status = 200, description = "Stored", body = FilesQuotaSaved),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_member_quota(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<(String, String)>,
    body: ApiJson<FilesQuotaRequest>,
) -> Result<HttpResponse, ApiError> {
    let (slug, username) = path.into_inner();
    let saved = files::set_member_quota(&state, &user, slug, username, body.0).await?;
    Ok(HttpResponse::Ok().json(saved))
}

// The lab's space: the same handlers (they read the slug from the route), documented
// under their own paths.

/// A lab's files whose path starts with `prefix`, by path (its members, operators).
#[utoipa::path(get, path = "/api/v1/labs/{slug}/files", tag = "files", operation_id = "list_lab_files",
    params(("slug" = String, Path, description = "The lab"), ListQuery),
    responses(
        (status = 200, description = "The files, by path", body = Vec<FileEntry>),
        (status = "4XX", description = "Refused (403: not a member of the lab)", body = ErrorBody),
    ))]
pub(crate) async fn lab_list(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    list(state, user, req, query).await
}

/// A lab's file (its members, operators); `Range` as for one's own files.
#[utoipa::path(get, path = "/api/v1/labs/{slug}/files/{path}", tag = "files", operation_id = "get_lab_file",
    params(("slug" = String, Path, description = "The lab"),
        ("path" = String, Path, description = "The file's path; it may hold '/'")),
    responses(
        (status = 200, description = "The file", body = String, content_type = "application/octet-stream"),
        (status = 206, description = "The range asked for", body = String,
            content_type = "application/octet-stream"),
        (status = "4XX", description = "Refused (403: not a member; 404: no such file)", body = ErrorBody),
    ))]
pub(crate) async fn lab_get(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    get(state, user, req).await
}

/// Stores a file in a lab's space (its admins, operators), against the lab's quota.
#[utoipa::path(put, path = "/api/v1/labs/{slug}/files/{path}", tag = "files", operation_id = "put_lab_file",
    params(("slug" = String, Path, description = "The lab"),
        ("path" = String, Path, description = "The file's path; it may hold '/'"),
        ("x-commons-sha256" = Option<String>, Header, description = "The body's SHA-256 in hex, checked when sent")),
    request_body(content = String, content_type = "application/octet-stream", description = "The file's bytes"),
    responses(
        (status = 201, description = "A new file", body = FileEntry),
        (status = 200, description = "The file at that path was replaced", body = FileEntry),
        (status = "4XX", description = "Refused (403: not the lab's admin; 413 `file_quota`)", body = ErrorBody),
    ))]
pub(crate) async fn lab_put(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    put(state, user, req, payload).await
}

/// Deletes a file of a lab's space (its admins, operators).
#[utoipa::path(delete, path = "/api/v1/labs/{slug}/files/{path}", tag = "files", operation_id = "delete_lab_file",
    params(("slug" = String, Path, description = "The lab"),
        ("path" = String, Path, description = "The file's path; it may hold '/'")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", description = "Refused (403: not the lab's admin; 404: no such file)", body = ErrorBody),
    ))]
pub(crate) async fn lab_delete(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    delete(state, user, req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_are_named_by_their_last_segment() {
        assert_eq!(
            disposition("data/r\u{e9}sult \"1\".csv"),
            "attachment; filename=\"r_sult _1_.csv\"; filename*=UTF-8''r%C3%A9sult%20%221%22.csv"
        );
    }
}
