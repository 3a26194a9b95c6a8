//! `/api/v1/me/notifications`: the caller's notification settings and delivery log.

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::notify::{self, Options};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::notify::{Delivery, NotificationRequest, NotificationSettings};
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/me/notifications", web::get().to(get))
        .route("/me/notifications", web::put().to(put))
        .route("/me/notifications/deliveries", web::get().to(deliveries));
}

/// The caller's notification settings; webhook secrets only by their last characters.
#[utoipa::path(get, path = "/api/v1/me/notifications", tag = "notifications",
    operation_id = "get_notifications",
    responses(
        (status = 200, description = "The settings", body = NotificationSettings),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    let s = notify::get(&state, &user, Options::of(&state.config)).await?;
    Ok(HttpResponse::Ok().json(s))
}

/// Replaces the caller's notification settings: e-mail on or off, the webhooks (a
/// webhook sent without its secret keeps the one saved for its URL), and the events
/// (left out: all).
#[utoipa::path(put, path = "/api/v1/me/notifications", tag = "notifications",
    operation_id = "put_notifications",
    request_body = NotificationRequest,
    responses(
        (status = 200, description = "Saved", body = NotificationSettings),
        (status = "4XX", description = "Refused: `field` names what to fix (422), such as \
            `webhooks[0].url` for a private address", body = ErrorBody),
    ))]
pub(crate) async fn put(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<NotificationRequest>,
) -> Result<HttpResponse, ApiError> {
    let s = notify::put(&state, &user, body.0, Options::of(&state.config)).await?;
    Ok(HttpResponse::Ok().json(s))
}

/// The caller's latest 100 deliveries, newest first, with their last answers.
#[utoipa::path(get, path = "/api/v1/me/notifications/deliveries", tag = "notifications",
    operation_id = "list_notification_deliveries",
    responses(
        (status = 200, description = "The deliveries", body = Vec<Delivery>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn deliveries(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(notify::deliveries(&state, &user, 100).await?))
}
