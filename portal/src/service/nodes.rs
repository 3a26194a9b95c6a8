//! The campus's servers as users see them: each node with its owner lab, GPUs and
//! lending state.

use super::{node_admin, Actor, Ctx};
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
    /// No new job starts here; guests move elsewhere; owner jobs finish.
    pub draining: bool,
    /// CPUs, memory (MiB) and free disk (GiB) the agent reports; 0: not reported.
    pub cpus: f64,
    pub memory_mb: i64,
    pub disk_gb: i64,
    /// The largest disk (GiB) its agent gives one job; absent: not reported (no limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_job_disk_gb: Option<i64>,
    /// Why it takes no new guests now (its agent's disk is under its floor); absent: it
    /// takes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_low: Option<String>,
    /// Where its agent connects from (its TCP peer; what a proxy says it forwards for).
    pub connected_from: String,
    /// The GPU models and counts it enrolled with (its first inventory), or that its lab
    /// admin last approved.
    pub approved_gpus: crate::service::inventory::Counts,
    /// It reports more GPUs, or other models, than that: no guest is placed here until
    /// a lab admin approves (`POST /api/v1/nodes/{id}/inventory/approve`).
    pub inventory_unapproved: bool,
    /// Two agents used its credential at once (a cloned server or state dir); `null`
    /// when never seen (or dismissed: `POST /api/v1/nodes/{id}/shared-credential/dismiss`).
    pub shared_credential: Option<SharedCredential>,
}

/// Two agents with one node credential at once, as seen.
#[derive(Debug, Clone, Serialize)]
pub struct SharedCredential {
    /// When the second was refused (UTC).
    pub seen_at: chrono::NaiveDateTime,
    /// Where the agent that kept the node connects from.
    pub connected_from: String,
    /// Where the refused one came from.
    pub refused_from: String,
}

/// Every enrolled node with its lab and GPUs (two queries).
pub fn list(c: &mut DbConn) -> Result<Vec<(Node, Lab, Vec<Gpu>)>, AppError> {
    Ok(db::nodes::list_with_gpus(c)?)
}

/// The same, as the API shows it.
pub fn views(c: &mut DbConn) -> Result<Vec<NodeView>, AppError> {
    Ok(list(c)?
        .into_iter()
        .map(|(n, l, gpus)| NodeView {
            connected_from: n.agent_addr,
            approved_gpus: crate::service::inventory::baseline_of(n.gpu_baseline.as_deref())
                .unwrap_or_default(),
            inventory_unapproved: n.inventory_unapproved,
            shared_credential: n.shared_at.map(|seen_at| SharedCredential {
                seen_at,
                connected_from: n.shared_connected_from.unwrap_or_default(),
                refused_from: n.shared_refused_from.unwrap_or_default(),
            }),
            lending: n.lending.0,
            grace_s: n.grace_s,
            reclaim: n.reclaim,
            draining: n.draining,
            cpus: n.cpus,
            memory_mb: n.memory_mb,
            disk_gb: n.disk_gb,
            max_job_disk_gb: n.max_job_disk_gb,
            disk_low: n.disk_low,
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

/// Drains a node (or ends the drain): its lab's admins or operators. While drained,
/// nothing new starts there and its guests are preempted (SIGTERM, the grace, their
/// checkpoint uploaded) to resume elsewhere; the owner's running jobs finish.
pub async fn set_draining(
    ctx: &Ctx,
    actor: &Actor,
    node: i64,
    draining: bool,
) -> Result<NodeView, AppError> {
    let actor = actor.clone();
    let view = ctx
        .db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            db::transaction(c, |c| {
                db::nodes::set_draining(c, node, draining)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(n.lab_id),
                    if draining { "drain" } else { "undrain" },
                    &format!("node {}", n.name),
                    &n.draining.to_string(),
                    &draining.to_string(),
                )
            })?;
            tracing::info!(node, draining, by = %admin.user().username, "node drain changed");
            views(c)?
                .into_iter()
                .find(|v| v.id == node)
                .ok_or(AppError::NotFound("node"))
        })
        .await?;
    ctx.wake.notify_one();
    Ok(view)
}
