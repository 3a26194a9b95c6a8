//! `/metrics` for Prometheus, and the middleware that times every request by its route
//! pattern and gives it a request id (a tracing span and the `x-request-id` header).

use crate::error::{ApiError, AppError};
use crate::metrics::HttpLabels;
use crate::state::AppState;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse};
use tracing::Instrument;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(metrics));
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let m = &state.config.metrics;
    if !m.enabled {
        return Err(AppError::NotFound("metrics are off").into());
    }
    if let Some(want) = m.token().map_err(AppError::Internal)? {
        let got = req
            .headers()
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !crate::auth::constant_time_eq(got.trim().as_bytes(), want.0.as_bytes()) {
            return Err(AppError::Unauthenticated("metrics need the scrape token".into()).into());
        }
    }
    let text = crate::service::metrics::scrape(&state).await?;
    Ok(HttpResponse::Ok().content_type(OPENMETRICS).body(text))
}

/// A request id from the reverse proxy, if it is short and plain; else a new one.
fn request_id(req: &ServiceRequest) -> String {
    req.headers()
        .get("x-request-id")
        .and_then(|h| h.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()))
}

/// Times the request into `commons_http_request_duration_seconds{method,route,status}`
/// (the route pattern, `unmatched` for paths no route knows) and runs it inside a
/// `request` span carrying its id.
pub async fn track(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let began = std::time::Instant::now();
    let id = request_id(&req);
    let method = req.method().to_string();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let span =
        tracing::info_span!("request", request_id = %id, method = %method, path = %req.path());
    let res = next.call(req).instrument(span).await;
    let (status, route) = match &res {
        Ok(r) => (r.status().as_u16(), r.request().match_pattern()),
        Err(e) => (e.as_response_error().status_code().as_u16(), None),
    };
    if let Some(state) = state {
        state
            .metrics
            .http_requests
            .get_or_create(&HttpLabels {
                method,
                route: route.unwrap_or_else(|| "unmatched".into()),
                status,
            })
            .observe(began.elapsed().as_secs_f64());
    }
    let mut res = res?;
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut()
            .insert(HeaderName::from_static("x-request-id"), v);
    }
    Ok(res)
}
