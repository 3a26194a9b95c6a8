//! `/api/v1/ssh-keys`: the caller's SSH public keys (list, add, remove).

use super::ApiJson;
use crate::auth::{CredentialsManager, CurrentUser};
use crate::error::ApiError;
use crate::service::ssh_keys::{self, NewSshKey};
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use commons_api::ssh::SshKey;
use commons_api::ErrorBody;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/ssh-keys", web::get().to(list))
        .route("/ssh-keys", web::post().to(add))
        .route("/ssh-keys/{id}", web::delete().to(remove));
}

/// The caller's SSH public keys, oldest first.
#[utoipa::path(get, path = "/api/v1/ssh-keys", tag = "ssh", operation_id = "list_ssh_keys",
    responses(
        (status = 200, description = "The keys", body = Vec<SshKey>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
) -> Result<HttpResponse, ApiError> {
    let keys = ssh_keys::list(&state, &user).await?;
    let keys: Vec<_> = keys.into_iter().map(ssh_keys::view).collect();
    Ok(HttpResponse::Ok().json(keys))
}

/// Adds a public key for SSH into the caller's jobs (a token that may add credentials).
#[utoipa::path(post, path = "/api/v1/ssh-keys", tag = "ssh", operation_id = "add_ssh_key",
    request_body = NewSshKey,
    responses(
        (status = 201, description = "Added", body = SshKey),
        (status = "4XX", description = "Refused: `field` names what to fix (422)", body = ErrorBody),
    ))]
pub(crate) async fn add(
    state: web::Data<AppState>,
    user: CredentialsManager,
    body: ApiJson<NewSshKey>,
) -> Result<HttpResponse, ApiError> {
    let key = ssh_keys::add(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(ssh_keys::view(key)))
}

/// Removes one of the caller's keys.
#[utoipa::path(delete, path = "/api/v1/ssh-keys/{id}", tag = "ssh", operation_id = "remove_ssh_key",
    params(("id" = i64, Path, description = "The key's id")),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    ssh_keys::remove(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}
