//! `POST /api/v1/cli/device` and `POST /api/v1/cli/token`: the `commons` CLI's sign-in
//! through the browser (the device authorization grant; see `service::cli_login`). Both
//! work without a token: they are how the CLI gets one.

use super::ApiJson;
use crate::error::{ApiError, AppError};
use crate::service::cli_login::{self, DeviceRequest, NotYet, TokenRequest};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_api::cli_login::{DeviceStart, TokenGranted};
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/cli/device", web::post().to(start))
        .route("/cli/token", web::post().to(token));
}

/// The portal's base URL as users reach it: `public_url`, else this request's host.
fn base_url(state: &AppState, req: &HttpRequest) -> String {
    match &state.config.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => {
            let info = req.connection_info();
            format!("{}://{}", info.scheme(), info.host())
        }
    }
}

/// Starts a sign-in through the browser (RFC 8628): the user opens `verification_uri`
/// and types `user_code`; the CLI polls `POST /api/v1/cli/token` with `device_code`.
#[utoipa::path(post, path = "/api/v1/cli/device", tag = "cli-login", operation_id = "cli_device",
    request_body = DeviceRequest,
    security(()),
    responses(
        (status = 200, description = "Started", body = DeviceStart),
        (status = "4XX", description = "Refused (429: too many starts from this address)", body = ErrorBody),
    ))]
pub(crate) async fn start(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: ApiJson<DeviceRequest>,
) -> Result<HttpResponse, ApiError> {
    let base = base_url(&state, &req);
    let from = crate::client_addr::client_ip(&req, &state.config.trusted_proxy_ranges())
        .ok_or_else(|| AppError::BadRequest("the client's address is unknown".into()))?;
    let per_address = state.config.cli_login.starts_per_address;
    let started = cli_login::start(&state, body.0, base, from.to_string(), per_address).await?;
    Ok(HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(started))
}

/// 200 with the token once approved; else 400 with RFC 8628's code
/// (`authorization_pending`, `slow_down` with the new `interval`, `access_denied`,
/// `expired_token`, `invalid_grant`).
#[utoipa::path(post, path = "/api/v1/cli/token", tag = "cli-login", operation_id = "cli_token",
    request_body = TokenRequest,
    security(()),
    responses(
        (status = 200, description = "Approved: the token (given once)", body = TokenGranted),
        (status = "4XX", description = "Not yet, or never: RFC 8628's `error` code", body = ErrorBody),
    ))]
pub(crate) async fn token(
    state: web::Data<AppState>,
    body: ApiJson<TokenRequest>,
) -> Result<HttpResponse, ApiError> {
    let days = state.config.cli_login.token_days;
    Ok(match cli_login::token(&state, body.0, days).await? {
        Ok(t) => HttpResponse::Ok()
            .insert_header(("cache-control", "no-store"))
            .json(t),
        Err(not_yet) => HttpResponse::BadRequest().json(ErrorBody {
            error: not_yet.code().into(),
            message: not_yet.message(),
            field: None,
            interval: match not_yet {
                NotYet::SlowDown(interval) => Some(interval),
                _ => None,
            },
        }),
    })
}
