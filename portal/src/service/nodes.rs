//! The campus's servers as users see them: each node with its owner lab, GPUs and
//! lending state.

use super::{node_admin, Actor, Ctx};
use crate::db::models::{Gpu, Lab, Node};
use crate::db::{self, DbConn};
use crate::error::AppError;

pub use commons_api::node::{NodeGpu, NodeView, SharedCredential};

/// A GPU as the API shows it.
pub fn gpu_view(g: Gpu) -> NodeGpu {
    NodeGpu {
        id: g.id,
        node_id: g.node_id,
        uuid: g.uuid,
        idx: g.idx,
        model: g.model,
        memory_mb: g.memory_mb,
        is_fake: g.is_fake,
        present: g.present,
        local_use: g.local_use,
        utilization_pct: g.utilization_pct,
        idle_since: g.idle_since,
        fault: g.fault,
    }
}

/// Lending rules as the API shows them.
pub fn lending_view(l: commons_sched::Lending) -> commons_api::node::Lending {
    use commons_api::node::{LendMode as A, WeeklyWindow};
    use commons_sched::LendMode;
    commons_api::node::Lending {
        mode: match l.mode {
            LendMode::Always => A::Always,
            LendMode::Never => A::Never,
            LendMode::Windows => A::Windows,
        },
        windows: l
            .windows
            .iter()
            .map(|w| WeeklyWindow {
                start_minute: w.start_minute,
                end_minute: w.end_minute,
            })
            .collect(),
        max_lent_gpus: l.max_lent_gpus,
        min_idle_s: l.min_idle_s,
        max_guest_time_limit_s: l.max_guest_time_limit_s,
        borrowers: l.borrowers,
        share_gpus: l.share_gpus,
    }
}

/// Every enrolled node with its lab and GPUs (two queries).
pub fn list(c: &mut DbConn) -> Result<Vec<(Node, Lab, Vec<Gpu>)>, AppError> {
    Ok(db::nodes::list_with_gpus(c)?)
}

/// Every enrolled node with its lab and GPUs, for a page.
pub async fn all(ctx: &Ctx) -> Result<Vec<(Node, Lab, Vec<Gpu>)>, AppError> {
    ctx.db.run(list).await
}

/// Every enrolled node as the API shows it.
pub async fn all_views(ctx: &Ctx) -> Result<Vec<NodeView>, AppError> {
    ctx.db.run(views).await
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
            lending: lending_view(n.lending.0),
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
            gpus: gpus.into_iter().map(gpu_view).collect(),
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
