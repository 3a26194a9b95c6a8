//! `/api/v1/nodes`: the campus's servers, their GPUs, owner lab and state.

use crate::auth::CurrentUser;
use crate::db::nodes;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use serde::Serialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/nodes", web::get().to(list));
}

#[derive(Serialize)]
struct NodeView {
    id: i64,
    name: String,
    lab: String,
    online: bool,
    agent_version: String,
    last_seen_at: Option<chrono::NaiveDateTime>,
    gpus: Vec<crate::db::models::Gpu>,
    lending: commons_sched::Lending,
    grace_s: i32,
    reclaim: bool,
}

async fn list(state: web::Data<AppState>, _user: CurrentUser) -> Result<HttpResponse, ApiError> {
    let rows = state.db.run(nodes::list_with_gpus).await?;
    let views: Vec<NodeView> = rows
        .into_iter()
        .map(|(n, l, gpus)| NodeView {
            lending: n.lending_rules(),
            grace_s: n.grace_s,
            reclaim: n.reclaim,
            id: n.id,
            name: n.name,
            lab: l.slug,
            online: n.online,
            agent_version: n.agent_version,
            last_seen_at: n.last_seen_at,
            gpus,
        })
        .collect();
    Ok(HttpResponse::Ok().json(views))
}
