//! A node's GPUs against the ones it enrolled with, and what its lab admin does about a
//! node flagged by its link (two agents with one credential, `db::node_link`).
//!
//! The first inventory a node's agent reports is its baseline: GPU models and how many
//! of each. A later `Hello` that reports more of a model, or a model not in the
//! baseline, leaves the node *unapproved*: the scheduler places no guest there (its own
//! lab's jobs run), until a lab admin approves the inventory it reports now, which
//! becomes the baseline (on the node's page, or `POST /api/v1/nodes/{id}/inventory/
//! approve`; audited). Fewer GPUs (one died, one taken out) need no approval. A rogue
//! agent so cannot advertise GPUs it does not have to draw other labs' jobs.
//!
//! Invariants: a node has a baseline from its first `Hello` on; the flag is recomputed
//! at every `Hello`; approving and dismissing are lab admins' (or operators') acts, each
//! in the lab's audit log in the same transaction.

use super::nodes::{views, NodeView};
use super::{node_admin, Actor, Ctx};
use crate::db::models::Gpu;
use crate::db::{self, DbConn};
use crate::error::AppError;
use commons_proto::GpuInfo;
use std::collections::BTreeMap;

/// GPU models and how many of each.
pub type Counts = BTreeMap<String, u32>;

/// The models and counts of an agent's inventory.
pub fn counts(inventory: &[GpuInfo]) -> Counts {
    let mut out = Counts::new();
    for g in inventory {
        *out.entry(g.model.clone()).or_default() += 1;
    }
    out
}

/// The same of the GPUs the portal knows present.
pub fn counts_of(gpus: &[Gpu]) -> Counts {
    let mut out = Counts::new();
    for g in gpus.iter().filter(|g| g.present) {
        *out.entry(g.model.clone()).or_default() += 1;
    }
    out
}

/// Whether `now` has more of some model than `baseline` (a model it lacks counts as 0).
pub fn exceeds(baseline: &Counts, now: &Counts) -> bool {
    now.iter()
        .any(|(model, n)| baseline.get(model).copied().unwrap_or(0) < *n)
}

/// "2 × A100-80GB, 1 × H100" ("no GPUs" when empty).
pub fn describe(c: &Counts) -> String {
    if c.is_empty() {
        return "no GPUs".into();
    }
    c.iter()
        .map(|(m, n)| format!("{n} × {m}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A node's baseline as stored; `None` before its first inventory. A damaged one counts
/// as empty (so nothing is lent until a lab admin approves again).
pub fn baseline_of(stored: Option<&str>) -> Option<Counts> {
    let s = stored?;
    Some(serde_json::from_str(s).unwrap_or_else(|e| {
        tracing::error!("a node's GPU baseline is damaged ({e}): it counts as none");
        Counts::new()
    }))
}

fn encode(c: &Counts) -> Result<String, AppError> {
    serde_json::to_string(c).map_err(|e| AppError::Internal(e.into()))
}

/// At a `Hello`: the first inventory becomes the node's baseline; a later one that
/// exceeds it leaves the node unapproved (and one within it approved again). Returns
/// whether the node is unapproved now.
pub fn judge(c: &mut DbConn, node: i64, inventory: &[GpuInfo]) -> Result<bool, AppError> {
    let n = db::nodes::node_by_id(c, node)?;
    let now = counts(inventory);
    let Some(base) = baseline_of(n.gpu_baseline.as_deref()) else {
        db::nodes::set_inventory(c, node, Some(&encode(&now)?), false)?;
        return Ok(false);
    };
    let unapproved = exceeds(&base, &now);
    if unapproved != n.inventory_unapproved {
        db::nodes::set_inventory(c, node, None, unapproved)?;
        if unapproved {
            tracing::warn!(
                node,
                reported = %describe(&now),
                approved = %describe(&base),
                "the node reports GPUs it did not enrol with: no guests until its lab \
                 admin approves them"
            );
        }
    }
    Ok(unapproved)
}

/// The view of `node` after a change.
fn view_of(c: &mut DbConn, node: i64) -> Result<NodeView, AppError> {
    views(c)?
        .into_iter()
        .find(|v| v.id == node)
        .ok_or(AppError::NotFound("node"))
}

/// A lab admin approves the GPUs the node reports now: they become its baseline, and
/// guests may be placed there again.
pub async fn approve(ctx: &Ctx, actor: &Actor, node: i64) -> Result<NodeView, AppError> {
    let actor = actor.clone();
    let view = ctx
        .db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            if n.revoked_at.is_some() {
                return Err(AppError::NotFound("node"));
            }
            let now = counts_of(&db::nodes::gpus_of(c, node)?);
            let before = baseline_of(n.gpu_baseline.as_deref()).unwrap_or_default();
            db::transaction(c, |c| {
                db::nodes::set_inventory(c, node, Some(&encode(&now)?), false)?;
                Ok::<_, AppError>(db::audit::record(
                    c,
                    admin.user(),
                    Some(n.lab_id),
                    "approve_inventory",
                    &format!("node {}", n.name),
                    &describe(&before),
                    &describe(&now),
                )?)
            })?;
            tracing::info!(node, by = %admin.user().username, gpus = %describe(&now), "inventory approved");
            view_of(c, node)
        })
        .await?;
    ctx.wake.notify_one();
    Ok(view)
}

/// A lab admin clears the flag that two agents used the node's credential at once (they
/// dealt with the clone).
pub async fn dismiss_shared(ctx: &Ctx, actor: &Actor, node: i64) -> Result<NodeView, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            if n.revoked_at.is_some() {
                return Err(AppError::NotFound("node"));
            }
            db::transaction(c, |c| {
                let was = db::node_link::dismiss_shared(c, node)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(n.lab_id),
                    "dismiss_shared_credential",
                    &format!("node {}", n.name),
                    was.as_deref().unwrap_or("not flagged"),
                    "dismissed",
                )
            })?;
            view_of(c, node)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(v: &[(&str, u32)]) -> Counts {
        v.iter().map(|(m, n)| (m.to_string(), *n)).collect()
    }

    #[test]
    fn more_gpus_or_another_model_exceed_the_baseline_fewer_do_not() {
        let base = c(&[("A100-80GB", 2)]);
        assert!(!exceeds(&base, &c(&[("A100-80GB", 2)])));
        assert!(!exceeds(&base, &c(&[("A100-80GB", 1)])), "one died");
        assert!(!exceeds(&base, &c(&[])));
        assert!(exceeds(&base, &c(&[("A100-80GB", 3)])), "one more");
        assert!(
            exceeds(&base, &c(&[("A100-80GB", 1), ("H100", 1)])),
            "another model, even with fewer in all"
        );
        assert_eq!(
            describe(&c(&[("H100", 1), ("A100-80GB", 2)])),
            "2 × A100-80GB, 1 × H100"
        );
        assert_eq!(describe(&c(&[])), "no GPUs");
        assert_eq!(baseline_of(Some("{oops")), Some(Counts::new()));
        assert_eq!(baseline_of(None), None);
    }
}
