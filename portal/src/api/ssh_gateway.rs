//! `GET /api/v1/ssh-gateway`: how to reach jobs over SSH (host, port, host key), for
//! scripts and the `commons` CLI. 404 `not_found` when the gateway is off.

use crate::auth::CurrentUser;
use crate::error::{ApiError, AppError};
use crate::service::ssh;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::ssh::GatewayInfo;
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/ssh-gateway", web::get().to(get));
}

/// How to reach jobs over SSH: host, port and host key.
#[utoipa::path(get, path = "/api/v1/ssh-gateway", tag = "ssh", operation_id = "ssh_gateway",
    responses(
        (status = 200, description = "The gateway", body = GatewayInfo),
        (status = "4XX", description = "Refused (404: this portal runs no gateway)", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    _user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    let endpoint = state
        .config
        .ssh
        .public_endpoint(state.config.public_url.as_deref());
    let info = ssh::gateway(&state, endpoint)
        .await?
        .ok_or(AppError::NotFound("SSH gateway (this portal runs none)"))?;
    Ok(HttpResponse::Ok().json(info))
}
