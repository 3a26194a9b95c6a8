//! The scheduler's read at the start of a round: nodes gone silent go offline, leases that
//! ran out are judged, and the world the plan is made from is read, all on the database's
//! clock, so replicas whose clocks disagree judge alike.

use super::{attempts, Ctx};
pub use crate::db::leader::Leader;
use crate::db::world::{Update, World};
/// The scheduler's world between rounds (`db::world`), which the loop keeps.
pub type WorldRows = World;
use crate::db::{nodes, users};
use crate::error::AppError;
use crate::metrics::{KindLabel, Metrics};
use commons_sched::{Policy, Snapshot};
use std::sync::Arc;
use std::time::Instant;

/// What this round judges, from the portal's settings.
#[derive(Debug, Clone, Copy)]
pub struct Lap {
    pub heartbeat_s: u64,
    pub lease_margin_s: u64,
    /// False right after this replica took over (agents get a lease's time to renew).
    pub judge_leases: bool,
}

/// How this round brings the scheduler's world up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Take in the changes in the log.
    Changes,
    /// The same, then compare with a full read (repairing the world if they differ).
    Check,
}

/// What a round read: the world (to keep for the next round; it holds what the waiting
/// jobs show), the snapshot to plan from, and what a check found unlike a fresh read.
pub struct Read {
    pub world: World,
    pub snapshot: Snapshot,
    pub mismatch: Option<String>,
}

/// The world to plan from, and the waiting jobs the pages show: the world of the last
/// round brought up to date (`refresh`), or read in full when there is none.
pub async fn read(
    ctx: &Ctx,
    lap: Lap,
    policy: Policy,
    metrics: Arc<Metrics>,
    world: Option<World>,
    refresh: Refresh,
) -> Result<Read, AppError> {
    let asked = Instant::now();
    ctx.db
        .run_reserved(move |c| {
            metrics.phase("read_wait", asked);
            let judging = Instant::now();
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
            metrics.phase("read_judge", judging);
            let updating = Instant::now();
            let mut mismatch = None;
            let world = match world {
                None => {
                    metrics
                        .world_updates
                        .get_or_create(&KindLabel { kind: "full" })
                        .inc();
                    World::load(c)?
                }
                Some(mut w) => {
                    let update = match refresh {
                        Refresh::Changes => w.update(c)?,
                        Refresh::Check => {
                            let (update, differs) = w.check(c, &policy)?;
                            mismatch = differs;
                            update
                        }
                    };
                    let kind = match (refresh, update) {
                        (Refresh::Check, _) => "check",
                        (_, Update::Full) => "full",
                        (_, Update::Changes(_)) => "changes",
                    };
                    metrics
                        .world_updates
                        .get_or_create(&KindLabel { kind })
                        .inc();
                    if let Update::Changes(n) = update {
                        metrics.world_changes.inc_by(n as u64);
                    }
                    w
                }
            };
            metrics.phase("read_world", updating);
            let building = Instant::now();
            let snapshot = world.snapshot(&policy);
            let labs = snapshot.nodes.iter().map(|n| n.lab);
            if !metrics.knows_labs(labs.chain(snapshot.queue.iter().map(|q| q.lab))) {
                metrics.set_labs(users::all_lab_slugs(c)?);
            }
            metrics.phase("read_build", building);
            Ok(Read {
                world,
                snapshot,
                mismatch,
            })
        })
        .await
}
