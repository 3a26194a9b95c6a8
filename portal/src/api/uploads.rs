//! Uploads in parts: `POST|GET /api/v1/uploads`, `GET|DELETE /api/v1/uploads/{id}`,
//! `PUT /api/v1/uploads/{id}/parts/{n}`, `POST /api/v1/uploads/{id}/complete`
//! (`commons_api::uploads` documents the protocol; `service::files::parts` decides).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::files::{parts, FileEntry};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::uploads::{UploadStart, UploadView};
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/uploads", web::post().to(start))
        .route("/uploads", web::get().to(list))
        .route("/uploads/{id}", web::get().to(show))
        .route("/uploads/{id}", web::delete().to(abort))
        .route("/uploads/{id}/parts/{n}", web::put().to(put_part))
        .route("/uploads/{id}/complete", web::post().to(complete));
}

/// Starts an upload in parts of a file of `size` bytes to `path` (`lab:SLUG/PATH` for a
/// lab's space): the whole size is reserved against the quota.
#[utoipa::path(post, path = "/api/v1/uploads", tag = "files", operation_id = "start_upload",
    request_body = UploadStart,
    responses(
        (status = 201, description = "Started: send its parts", body = UploadView),
        (status = "4XX", description = "Refused: 413 `file_quota` names the quota; 422 names the field", body = ErrorBody),
    ))]
pub(crate) async fn start(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<UploadStart>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Created().json(parts::start(&state, &user, body.0).await?))
}

/// The caller's unfinished uploads in parts, oldest first: to resume one, send the parts
/// it has not `received`.
#[utoipa::path(get, path = "/api/v1/uploads", tag = "files", operation_id = "list_uploads",
    responses(
        (status = 200, description = "The uploads", body = Vec<UploadView>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(parts::list_mine(&state, &user).await?))
}

/// One of the caller's uploads in parts.
#[utoipa::path(get, path = "/api/v1/uploads/{id}", tag = "files", operation_id = "get_upload",
    params(("id" = i64, Path, description = "The upload")),
    responses(
        (status = 200, description = "The upload", body = UploadView),
        (status = "4XX", description = "Refused (404: no such upload of yours)", body = ErrorBody),
    ))]
pub(crate) async fn show(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(parts::show(&state, &user, id.into_inner()).await?))
}

/// Stores part `n` (0-based): exactly `part_bytes` bytes, fewer only for the last part.
/// Sending a part again replaces it.
#[utoipa::path(put, path = "/api/v1/uploads/{id}/parts/{n}", tag = "files", operation_id = "put_upload_part",
    params(("id" = i64, Path, description = "The upload"), ("n" = u32, Path, description = "The part, from 0")),
    request_body(content = String, content_type = "application/octet-stream", description = "The part's bytes"),
    responses(
        (status = 200, description = "Stored; the upload now", body = UploadView),
        (status = "4XX", description = "Refused: 400 a part of the wrong length; 404 no such upload; 422 no such part", body = ErrorBody),
    ))]
pub(crate) async fn put_part(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<(i64, u32)>,
    mut payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (id, n) = path.into_inner();
    match parts::put_part(&state, &user, id, n, &mut payload).await {
        Ok(v) => Ok(HttpResponse::Ok().json(v)),
        Err(e) => {
            crate::broker::outputs::drain_refused(&mut payload).await;
            Err(e.into())
        }
    }
}

/// Joins the parts into the file, replacing any file at its path.
#[utoipa::path(post, path = "/api/v1/uploads/{id}/complete", tag = "files", operation_id = "complete_upload",
    params(("id" = i64, Path, description = "The upload")),
    responses(
        (status = 201, description = "The new file", body = FileEntry),
        (status = 200, description = "The file at that path was replaced", body = FileEntry),
        (status = "4XX", description = "Refused: 409 `upload_incomplete` names the missing parts; 422 `sha256` the joined bytes hash otherwise", body = ErrorBody),
    ))]
pub(crate) async fn complete(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let up = parts::complete(&state, &user, id.into_inner()).await?;
    Ok(if up.created {
        HttpResponse::Created().json(up.entry)
    } else {
        HttpResponse::Ok().json(up.entry)
    })
}

/// Gives up an upload in parts: its parts and its reservation go.
#[utoipa::path(delete, path = "/api/v1/uploads/{id}", tag = "files", operation_id = "abort_upload",
    params(("id" = i64, Path, description = "The upload")),
    responses(
        (status = 204, description = "Given up"),
        (status = "4XX", description = "Refused (404: no such upload of yours)", body = ErrorBody),
    ))]
pub(crate) async fn abort(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    parts::abort(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}
