//! `/api/v1/nodes`: the campus's servers, their GPUs, owner lab and state.

use crate::auth::CurrentUser;
use crate::error::ApiError;
use crate::service::nodes;
use crate::state::AppState;
use actix_web::{web, HttpResponse};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/nodes", web::get().to(list));
}

async fn list(state: web::Data<AppState>, _user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let views = state.db.run(nodes::views).await?;
    Ok(HttpResponse::Ok().json(views))
}
