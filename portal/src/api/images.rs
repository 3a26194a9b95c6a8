//! `/api/v1/images`: the image allow-list (list, add, remove), and
//! `PUT /api/v1/labs/{slug}/signed-images` (`{"require_signed": bool}`).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::images::{self, NewImage};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::image::RequireSigned;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/images", web::get().to(list))
        .route("/images", web::post().to(add))
        .route("/images/{id}", web::delete().to(remove))
        .route("/labs/{slug}/signed-images", web::put().to(put_signed));
}

async fn list(state: web::Data<AppState>, user: CurrentUser) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(images::list(&state, &user).await?))
}

async fn add(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<NewImage>,
) -> Result<HttpResponse, ApiError> {
    let entry = images::add(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(entry))
}

async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    images::remove(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn put_signed(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<RequireSigned>,
) -> Result<HttpResponse, ApiError> {
    let on =
        images::set_require_signed(&state, &user, slug.into_inner(), body.0.require_signed).await?;
    Ok(HttpResponse::Ok().json(RequireSigned { require_signed: on }))
}
