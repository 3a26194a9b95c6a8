//! The servers page: every node, its owner lab and GPUs.

use super::Banner;
use crate::auth::CurrentUser;
use crate::db::models::{Gpu, Lab, Node};
use crate::error::WebError;
use crate::service::nodes;
use crate::state::AppState;
use actix_session::Session;
use actix_web::web;
use askama::Template;
use askama_web::WebTemplate;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/nodes", web::get().to(page));
}

#[derive(Template, WebTemplate)]
#[template(path = "nodes.html")]
struct NodesPage {
    banner: Banner,
    nodes: Vec<(Node, Lab, Vec<Gpu>)>,
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<NodesPage, WebError> {
    let nodes = state.db.run(nodes::list).await?;
    Ok(NodesPage {
        banner: Banner::new(&state, &session, Some(&user)),
        nodes,
    })
}
