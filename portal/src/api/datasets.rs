//! Lab datasets: `GET /api/v1/datasets` (those the caller may use) and
//! `/api/v1/labs/{slug}/datasets` (a lab's: list, register; remove one by name).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::datasets;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::datasets::{DatasetRequest, DatasetView};
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/datasets", web::get().to(list))
        .route("/labs/{slug}/datasets", web::get().to(list_lab))
        .route("/labs/{slug}/datasets", web::post().to(add))
        .route("/labs/{slug}/datasets/{name}", web::delete().to(remove));
}

/// The datasets the caller may mount (operators: all), by lab and name.
#[utoipa::path(get, path = "/api/v1/datasets", tag = "files", operation_id = "list_datasets",
    responses(
        (status = 200, description = "The datasets", body = Vec<DatasetView>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(datasets::list(&state, &user, None).await?))
}

/// A lab's datasets that the caller may mount.
#[utoipa::path(get, path = "/api/v1/labs/{slug}/datasets", tag = "files", operation_id = "list_lab_datasets",
    params(("slug" = String, Path, description = "The lab")),
    responses(
        (status = 200, description = "The datasets", body = Vec<DatasetView>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list_lab(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let slug = Some(slug.into_inner());
    Ok(HttpResponse::Ok().json(datasets::list(&state, &user, slug).await?))
}

/// Registers a dataset of the lab (its admins): `source` is `lab:PREFIX`,
/// `https://...#sha256=HEX` or `node:NAME`.
#[utoipa::path(post, path = "/api/v1/labs/{slug}/datasets", tag = "files", operation_id = "add_dataset",
    params(("slug" = String, Path, description = "The lab")),
    request_body = DatasetRequest,
    responses(
        (status = 201, description = "Registered", body = DatasetView),
        (status = "4XX", description = "Refused: `field` names what to fix (422); a name in use (409)", body = ErrorBody),
    ))]
pub(crate) async fn add(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<DatasetRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = datasets::register(&state, &user, &slug, body.0).await?;
    Ok(HttpResponse::Created().json(view))
}

/// Removes a dataset of the lab (its admins). Jobs that name it and have not started
/// fail when they would.
#[utoipa::path(delete, path = "/api/v1/labs/{slug}/datasets/{name}", tag = "files", operation_id = "remove_dataset",
    params(("slug" = String, Path, description = "The lab"), ("name" = String, Path, description = "The dataset")),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (slug, name) = path.into_inner();
    datasets::remove(&state, &user, &slug, &name).await?;
    Ok(HttpResponse::NoContent().finish())
}
