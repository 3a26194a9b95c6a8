//! The scheduler's read at the start of a round: nodes gone silent go offline, leases that
//! ran out are judged, and the world the plan is made from is read, all on the database's
//! clock, so replicas whose clocks disagree judge alike.

use super::{attempts, Ctx};
pub use crate::db::leader::Leader;
use crate::db::plan::Waiting;
use crate::db::{nodes, snapshot, users};
use crate::error::AppError;
use crate::metrics::Metrics;
use commons_sched::{Policy, Snapshot};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What this round judges, from the portal's settings.
#[derive(Debug, Clone, Copy)]
pub struct Lap {
    pub heartbeat_s: u64,
    pub lease_margin_s: u64,
    /// False right after this replica took over (agents get a lease's time to renew).
    pub judge_leases: bool,
}

/// The world to plan from, and the waiting jobs the pages show (see
/// `db::snapshot::read_with_waiting`).
pub async fn read(
    ctx: &Ctx,
    lap: Lap,
    policy: Policy,
    metrics: Arc<Metrics>,
) -> Result<(Snapshot, BTreeMap<i64, Waiting>), AppError> {
    ctx.db
        .run(move |c| {
            let t = crate::db::clock(c)?;
            let silent = t - chrono::Duration::seconds(3 * lap.heartbeat_s as i64 + 5);
            nodes::mark_silent_offline(c, silent)?;
            if lap.judge_leases {
                let before = t - chrono::Duration::seconds(lap.lease_margin_s as i64);
                let lost = attempts::expire_leases(c, before)?;
                if lost > 0 {
                    tracing::warn!(lost, "attempts lost with their servers; jobs requeued");
                }
            }
            // Jobs whose waits were met join this round's queue; those whose waits can
            // no longer be met end now.
            let settled = super::deps::settle(c)?;
            if settled != super::deps::Settled::default() {
                tracing::info!(
                    released = settled.released,
                    failed = settled.failed,
                    "jobs waiting for other jobs settled"
                );
            }
            let (snapshot, shown) = snapshot::read_with_waiting(c, &policy)?;
            let labs = snapshot.nodes.iter().map(|n| n.lab);
            if !metrics.knows_labs(labs.chain(snapshot.queue.iter().map(|q| q.lab))) {
                metrics.set_labs(users::all_lab_slugs(c)?);
            }
            Ok((snapshot, shown))
        })
        .await
}
