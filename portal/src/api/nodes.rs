//! `/api/v1/nodes`: the campus's servers, their GPUs, owner lab and state; and
//! `/api/v1/overview`: the campus overview (GPUs by state, the queue by lab, the map),
//! the same read model as the home page.

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::nodes;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::node::NodeView;
use commons_api::overview::Overview;
use commons_api::ErrorBody;

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
/// baseline, and guests may be placed there again.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/inventory/approve", tag = "nodes",
    operation_id = "approve_inventory", params(("id" = i64, Path, description = "The node's id")),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn approve_inventory(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = crate::service::inventory::approve(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Clears the flag that two agents used the node's credential at once.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/shared-credential/dismiss", tag = "nodes",
    operation_id = "dismiss_shared_credential", params(("id" = i64, Path, description = "The node's id")),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn dismiss_shared(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = crate::service::inventory::dismiss_shared(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Revokes the node's credential (its lab's admins, operators): its agent is cut off.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/revoke", tag = "nodes", operation_id = "revoke_node",
    params(("id" = i64, Path, description = "The node's id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn revoke(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    crate::service::owner::revoke(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Drains the node (its lab's admins, operators): nothing new starts there, its guests
/// are preempted to resume elsewhere, its owners' jobs finish.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/drain", tag = "nodes", operation_id = "drain_node",
    params(("id" = i64, Path, description = "The node's id")),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn drain(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = nodes::set_draining(&state, &user, id.into_inner(), true).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Ends the node's drain.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/undrain", tag = "nodes", operation_id = "undrain_node",
    params(("id" = i64, Path, description = "The node's id")),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn undrain(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = nodes::set_draining(&state, &user, id.into_inner(), false).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// Every enrolled server with its lab, GPUs and lending state.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", operation_id = "list_nodes",
    responses(
        (status = 200, description = "The servers", body = Vec<NodeView>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    _user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    let views = nodes::all_views(&state).await?;
    Ok(HttpResponse::Ok().json(views))
}

/// The campus overview: every GPU now, the queue by lab, the typical wait, and the
/// caller's use against their quotas (the home page's numbers).
#[utoipa::path(get, path = "/api/v1/overview", tag = "nodes", operation_id = "overview",
    responses(
        (status = 200, description = "The overview", body = Overview),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn overview(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    let offset = state.config.policy.utc_offset_s;
    let view = state
        .db
        .run(move |c| crate::service::overview::overview(c, &user, offset))
        .await?;
    Ok(HttpResponse::Ok().json(view))
}
