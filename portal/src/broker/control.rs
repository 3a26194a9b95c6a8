//! The owner's commands from the server (`commons_proto::control` documents the API):
//! the agent forwards `commons-agent lend|drain|undrain|reclaim|leave` here and reads the
//! node's state for `commons-agent status`, with its node credential.

use crate::error::ApiError;
use crate::service::owner;
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{NodeCommand, NODE_CONTROL_PATH};

/// Most bytes a command's JSON body may have.
const MAX_BODY: usize = 16 * 1024;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(NODE_CONTROL_PATH)
            .app_data(web::JsonConfig::default().limit(MAX_BODY))
            .route(web::get().to(status))
            .route(web::post().to(command)),
    );
}

async fn status(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let node = super::checkpoints::node(&state, &req).await?;
    let offset = state.config.policy.utc_offset_s;
    let st = state
        .db
        .run(move |c| owner::state_of(c, &node, offset))
        .await?;
    Ok(HttpResponse::Ok().json(st))
}

async fn command(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<NodeCommand>,
) -> Result<HttpResponse, ApiError> {
    let node = super::checkpoints::node(&state, &req).await?;
    let offset = state.config.policy.utc_offset_s;
    let cmd = body.into_inner();
    tracing::info!(node = node.id, ?cmd, "owner command from the server");
    let answer = owner::command(&state, node, cmd, offset).await?;
    Ok(HttpResponse::Ok().json(answer))
}
