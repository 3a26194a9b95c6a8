//! `PUT /api/v1/nodes/{id}/lending`, `PUT /api/v1/labs/{slug}/quota`,
//! `PUT /api/v1/labs/{slug}/members/{username}/quota`,
//! `PUT /api/v1/labs/{slug}/interactive` (`{"interactive_boost": bool}`).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::policy::{self, LabQuota, LendingRequest, QuotaRequest, Windows};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::node::{InteractiveBoost, LendingSaved, StoredQuota};
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/nodes/{id}/lending", web::put().to(put_lending))
        .route("/labs/{slug}/quota", web::put().to(put_lab_quota))
        .route(
            "/labs/{slug}/members/{username}/quota",
            web::put().to(put_member_quota),
        )
        .route(
            "/labs/{slug}/member-default-quota",
            web::put().to(put_member_default_quota),
        )
        .route("/labs/{slug}/interactive", web::put().to(put_interactive));
}

/// Replaces the node's lending rules (its lab's admins, operators).
#[utoipa::path(put, path = "/api/v1/nodes/{id}/lending", tag = "policy", operation_id = "set_lending",
    params(("id" = i64, Path, description = "The node's id")),
    request_body = LendingRequest,
    responses(
        (status = 200, description = "Stored", body = LendingSaved),
        (status = "4XX", description = "Refused: `field` names what to fix (422)", body = ErrorBody),
    ))]
pub(crate) async fn put_lending(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    body: ApiJson<LendingRequest>,
) -> Result<HttpResponse, ApiError> {
    let saved = policy::set_lending(&state, &user, id.into_inner(), body.0, Windows::Given).await?;
    Ok(HttpResponse::Ok().json(saved))
}

/// Replaces what the lab may borrow from other labs (operators).
#[utoipa::path(put, path = "/api/v1/labs/{slug}/quota", tag = "policy", operation_id = "set_lab_quota",
    params(("slug" = String, Path, description = "The lab")),
    request_body = QuotaRequest,
    responses(
        (status = 200, description = "Stored", body = StoredQuota),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_lab_quota(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<QuotaRequest>,
) -> Result<HttpResponse, ApiError> {
    let q = policy::set_lab_quota(
        &state,
        &user,
        slug.into_inner(),
        body.0,
        LabQuota::Borrowing,
    )
    .await?;
    Ok(HttpResponse::Ok().json(policy::stored_quota(&q)))
}

/// Replaces a member's quota in the lab (its admins, operators).
#[utoipa::path(put, path = "/api/v1/labs/{slug}/members/{username}/quota", tag = "policy",
    operation_id = "set_member_quota",
    params(("slug" = String, Path, description = "The lab"),
        ("username" = String, Path, description = "The member")),
    request_body = QuotaRequest,
    responses(
        (status = 200, description = "Stored", body = StoredQuota),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_member_quota(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<(String, String)>,
    body: ApiJson<QuotaRequest>,
) -> Result<HttpResponse, ApiError> {
    let (slug, username) = path.into_inner();
    let q = policy::set_member_quota(&state, &user, slug, username, body.0).await?;
    Ok(HttpResponse::Ok().json(policy::stored_quota(&q)))
}

/// Replaces the quota of the lab's members who have none of their own (its admins,
/// operators).
#[utoipa::path(put, path = "/api/v1/labs/{slug}/member-default-quota", tag = "policy",
    operation_id = "set_member_default_quota",
    params(("slug" = String, Path, description = "The lab")),
    request_body = QuotaRequest,
    responses(
        (status = 200, description = "Stored", body = StoredQuota),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_member_default_quota(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<QuotaRequest>,
) -> Result<HttpResponse, ApiError> {
    let q = policy::set_lab_quota(
        &state,
        &user,
        slug.into_inner(),
        body.0,
        LabQuota::MemberDefault,
    )
    .await?;
    Ok(HttpResponse::Ok().json(policy::stored_quota(&q)))
}

/// Whether the lab's interactive jobs go ahead of its batch jobs (its admins, operators).
#[utoipa::path(put, path = "/api/v1/labs/{slug}/interactive", tag = "policy",
    operation_id = "set_interactive_boost",
    params(("slug" = String, Path, description = "The lab")),
    request_body = InteractiveBoost,
    responses(
        (status = 200, description = "Stored", body = InteractiveBoost),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn put_interactive(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    body: ApiJson<InteractiveBoost>,
) -> Result<HttpResponse, ApiError> {
    let on =
        policy::set_interactive_boost(&state, &user, slug.into_inner(), body.0.interactive_boost)
            .await?;
    Ok(HttpResponse::Ok().json(InteractiveBoost {
        interactive_boost: on,
    }))
}
