//! `/api/v1/images`: the image allow-list (list, add, remove), and
//! `PUT /api/v1/labs/{slug}/signed-images` (`{"require_signed": bool}`).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::images::{self, NewImage};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::image::{ImageView, RequireSigned};
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/images", web::get().to(list))
        .route("/images", web::post().to(add))
        .route("/images/{id}", web::delete().to(remove))
        .route("/labs/{slug}/signed-images", web::put().to(put_signed));
}

/// The entries the caller may use or manage: the campus's and their labs' (every lab's
/// for an operator).
#[utoipa::path(get, path = "/api/v1/images", tag = "images", operation_id = "list_images",
    responses(
        (status = 200, description = "The allow-list", body = Vec<ImageView>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(images::list(&state, &user).await?))
}

/// Adds an entry: campus-wide (operators) or a lab's (its admins), pinned to a digest and
/// optionally signed by a campus image authority.
#[utoipa::path(post, path = "/api/v1/images", tag = "images", operation_id = "add_image",
    request_body = NewImage,
    responses(
        (status = 201, description = "Added", body = ImageView),
        (status = "4XX", description = "Refused: `field` names what to fix (422)", body = ErrorBody),
    ))]
pub(crate) async fn add(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<NewImage>,
) -> Result<HttpResponse, ApiError> {
    let entry = images::add(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(entry))
}

/// Removes an entry (who may add it may remove it).
#[utoipa::path(delete, path = "/api/v1/images/{id}", tag = "images", operation_id = "remove_image",
    params(("id" = i64, Path, description = "The entry's id")),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    images::remove(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Whether the lab's jobs may use signed entries only (its admins).
#[utoipa::path(put, path = "/api/v1/labs/{slug}/signed-images", tag = "images",
    operation_id = "set_require_signed",
    params(("slug" = String, Path, description = "The lab")),
    request_body = RequireSigned,
    responses(
        (status = 200, description = "Stored", body = RequireSigned),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_signed(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<RequireSigned>,
) -> Result<HttpResponse, ApiError> {
    let on =
        images::set_require_signed(&state, &user, slug.into_inner(), body.0.require_signed).await?;
    Ok(HttpResponse::Ok().json(RequireSigned { require_signed: on }))
}
