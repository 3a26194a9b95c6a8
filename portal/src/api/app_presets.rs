//! `/api/v1/app-presets`: web apps to launch (list, add, change, remove) and
//! `POST /api/v1/app-presets/{id}/launch`.

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::app_presets;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::app_preset::{LaunchRequest, PresetRequest, PresetView};
use commons_api::{ErrorBody, JobView};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/app-presets", web::get().to(list))
        .route("/app-presets", web::post().to(add))
        .route("/app-presets/{id}", web::get().to(get))
        .route("/app-presets/{id}", web::put().to(put))
        .route("/app-presets/{id}", web::delete().to(remove))
        .route("/app-presets/{id}/launch", web::post().to(launch));
}

/// The presets the caller may launch: the campus's and their labs'.
#[utoipa::path(get, path = "/api/v1/app-presets", tag = "apps", operation_id = "list_app_presets",
    responses(
        (status = 200, description = "The presets", body = Vec<PresetView>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(app_presets::list(&state, &user).await?))
}

/// One preset the caller may see.
#[utoipa::path(get, path = "/api/v1/app-presets/{id}", tag = "apps", operation_id = "get_app_preset",
    params(("id" = i64, Path, description = "The preset's id")),
    responses(
        (status = 200, description = "The preset", body = PresetView),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(app_presets::get(&state, &user, id.into_inner()).await?))
}

/// Adds a preset: campus-wide (operators) or a lab's (its admins). Its image must be on
/// the allow-list its users' jobs may name.
#[utoipa::path(post, path = "/api/v1/app-presets", tag = "apps", operation_id = "add_app_preset",
    request_body = PresetRequest,
    responses(
        (status = 201, description = "Added", body = PresetView),
        (status = "4XX", description = "Refused: `field` names what to fix (422); a name in use (409)", body = ErrorBody),
    ))]
pub(crate) async fn add(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<PresetRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = app_presets::create(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(view))
}

/// Replaces a preset (who may add it may change it; it stays with its lab).
#[utoipa::path(put, path = "/api/v1/app-presets/{id}", tag = "apps", operation_id = "change_app_preset",
    params(("id" = i64, Path, description = "The preset's id")),
    request_body = PresetRequest,
    responses(
        (status = 200, description = "Stored", body = PresetView),
        (status = "4XX", description = "Refused: `field` names what to fix (422)", body = ErrorBody),
    ))]
pub(crate) async fn put(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    body: ApiJson<PresetRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = app_presets::update(&state, &user, id.into_inner(), body.0).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Removes a preset; jobs launched from it go on.
#[utoipa::path(delete, path = "/api/v1/app-presets/{id}", tag = "apps", operation_id = "remove_app_preset",
    params(("id" = i64, Path, description = "The preset's id")),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    app_presets::delete(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Launches a preset: an interactive job serving its app (`app_url` once it runs).
/// Settings left out take the preset's defaults; one the preset does not offer, or
/// past its maximum, is refused naming the field.
#[utoipa::path(post, path = "/api/v1/app-presets/{id}/launch", tag = "apps", operation_id = "launch_app_preset",
    params(("id" = i64, Path, description = "The preset's id")),
    request_body = LaunchRequest,
    responses(
        (status = 201, description = "The job", body = JobView),
        (status = "4XX", description = "Refused: `field` names what to fix (422)", body = ErrorBody),
    ))]
pub(crate) async fn launch(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    body: ApiJson<LaunchRequest>,
) -> Result<HttpResponse, ApiError> {
    let job = app_presets::launch(&state, &user, id.into_inner(), body.0).await?;
    Ok(HttpResponse::Created().json(job))
}
