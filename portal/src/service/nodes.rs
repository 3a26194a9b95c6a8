//! The campus's servers as users see them: each node with its owner lab, GPUs and
//! lending state.

use crate::db::models::{Gpu, Lab, Node};
use crate::db::{self, DbConn};
use crate::error::AppError;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    pub id: i64,
    pub name: String,
    pub lab: String,
    pub online: bool,
    pub agent_version: String,
    pub last_seen_at: Option<chrono::NaiveDateTime>,
    pub gpus: Vec<Gpu>,
    pub lending: commons_sched::Lending,
    /// Seconds a preempted guest gets here; 0: the campus default.
    pub grace_s: i32,
    pub reclaim: bool,
}

/// Every enrolled node with its lab and GPUs (two queries).
pub fn list(c: &mut DbConn) -> Result<Vec<(Node, Lab, Vec<Gpu>)>, AppError> {
    db::nodes::list_with_gpus(c)
}

/// The same, as the API shows it.
pub fn views(c: &mut DbConn) -> Result<Vec<NodeView>, AppError> {
    Ok(list(c)?
        .into_iter()
        .map(|(n, l, gpus)| NodeView {
            lending: n.lending.0,
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
        .collect())
}
