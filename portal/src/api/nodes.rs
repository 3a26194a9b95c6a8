//! `/api/v1/nodes`: the campus's servers, their GPUs, owner lab and state; and
//! `/api/v1/overview`: the campus overview (GPUs by state, the queue by lab, the map),
//! the same read model as the home page.

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::nodes;
use crate::state::AppState;
use actix_web::{web, HttpResponse};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/nodes", web::get().to(list))
        .route("/overview", web::get().to(overview))
        .route("/nodes/{id}/drain", web::post().to(drain))
        .route("/nodes/{id}/undrain", web::post().to(undrain))
        .route("/nodes/{id}/revoke", web::post().to(revoke))
        .route(
            "/nodes/{id}/inventory/approve",
            web::post().to(approve_inventory),
        )
        .route(
            "/nodes/{id}/shared-credential/dismiss",
            web::post().to(dismiss_shared),
        );
}

/// Approves the GPUs the node reports now (its lab's admins, operators): they become its
/// baseline, and guests may be placed there again. 200 with the node.
async fn approve_inventory(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = crate::service::inventory::approve(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Clears the flag that two agents used the node's credential at once. 200 with the node.
async fn dismiss_shared(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = crate::service::inventory::dismiss_shared(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Revokes the node's credential (its lab's admins, operators): 204.
async fn revoke(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    crate::service::owner::revoke(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn drain(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = nodes::set_draining(&state, &user, id.into_inner(), true).await?;
    Ok(HttpResponse::Ok().json(view))
}

async fn undrain(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = nodes::set_draining(&state, &user, id.into_inner(), false).await?;
    Ok(HttpResponse::Ok().json(view))
}

async fn list(state: web::Data<AppState>, _user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let views = state.db.run(nodes::views).await?;
    Ok(HttpResponse::Ok().json(views))
}

async fn overview(state: web::Data<AppState>, user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let offset = state.config.policy.utc_offset_s;
    let view = state
        .db
        .run(move |c| crate::service::overview::overview(c, &user, offset))
        .await?;
    Ok(HttpResponse::Ok().json(view))
}
