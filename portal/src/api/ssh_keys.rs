//! `/api/v1/ssh-keys`: the caller's SSH public keys (list, add, remove).

use super::ApiJson;
use crate::auth::{CredentialsManager, CurrentUser};
use crate::error::ApiError;
use crate::service::ssh_keys::{self, NewSshKey};
use crate::state::AppState;
use actix_web::{web, HttpResponse};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/ssh-keys", web::get().to(list))
        .route("/ssh-keys", web::post().to(add))
        .route("/ssh-keys/{id}", web::delete().to(remove));
}

async fn list(state: web::Data<AppState>, user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let keys = ssh_keys::list(&state, &user).await?;
    let keys: Vec<_> = keys.into_iter().map(ssh_keys::view).collect();
    Ok(HttpResponse::Ok().json(keys))
}

async fn add(
    state: web::Data<AppState>,
    user: CredentialsManager,
    body: ApiJson<NewSshKey>,
) -> Result<HttpResponse, ApiError> {
    let key = ssh_keys::add(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(ssh_keys::view(key)))
}

async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    ssh_keys::remove(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::NoContent().finish())
}
