//! `PUT /api/v1/nodes/{id}/lending`, `PUT /api/v1/labs/{slug}/quota`,
//! `PUT /api/v1/labs/{slug}/members/{username}/quota`,
//! `PUT /api/v1/labs/{slug}/interactive` (`{"interactive_boost": bool}`).

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::policy::{self, LabQuota, LendingRequest, QuotaRequest, Windows};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::node::InteractiveBoost;

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

async fn put_lending(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    body: ApiJson<LendingRequest>,
) -> Result<HttpResponse, ApiError> {
    let saved = policy::set_lending(&state, &user, id.into_inner(), body.0, Windows::Given).await?;
    Ok(HttpResponse::Ok().json(saved))
}

async fn put_lab_quota(
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

async fn put_member_quota(
    state: web::Data<AppState>,
    user: CurrentUser,
    path: web::Path<(String, String)>,
    body: ApiJson<QuotaRequest>,
) -> Result<HttpResponse, ApiError> {
    let (slug, username) = path.into_inner();
    let q = policy::set_member_quota(&state, &user, slug, username, body.0).await?;
    Ok(HttpResponse::Ok().json(policy::stored_quota(&q)))
}

async fn put_member_default_quota(
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

async fn put_interactive(
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
