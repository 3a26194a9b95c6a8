//! `POST /api/v1/cli/device` and `POST /api/v1/cli/token`: the `commons` CLI's sign-in
//! through the browser (the device authorization grant; see `service::cli_login`). Both
//! work without a token: they are how the CLI gets one.

use super::ApiJson;
use crate::error::{ApiError, AppError, ErrorBody};
use crate::service::cli_login::{self, DeviceRequest, NotYet, TokenRequest};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};

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

async fn start(
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
async fn token(
    state: web::Data<AppState>,
    body: ApiJson<TokenRequest>,
) -> Result<HttpResponse, ApiError> {
    let days = state.config.cli_login.token_days;
    Ok(match cli_login::token(&state, body.0, days).await? {
        Ok(t) => HttpResponse::Ok()
            .insert_header(("cache-control", "no-store"))
            .json(t),
        Err(NotYet::SlowDown(interval)) => HttpResponse::BadRequest().json(serde_json::json!({
            "error": NotYet::SlowDown(interval).code(),
            "message": NotYet::SlowDown(interval).message(),
            "interval": interval,
        })),
        Err(not_yet) => HttpResponse::BadRequest().json(ErrorBody {
            error: not_yet.code(),
            message: not_yet.message(),
            field: None,
        }),
    })
}
