//! The scheduler loop.
//!
//! Each tick:
//! 1. Housekeeping: nodes silent for three heartbeats go offline; attempts whose lease ran
//!    out more than the margin ago are lost and their jobs requeued (the agent has stopped
//!    them by then, so no job runs twice).
//! 2. Read the snapshot in one transaction.
//! 3. `commons_sched::plan` (pure).
//! 4. Commit the plan in a second transaction that re-checks every start.
//! 5. Send the `Start`s to the agents.
//!
//! The loop runs every `tick_ms`, and sooner when woken (submission, freed GPUs).

use crate::db::{attempts, nodes, now};
use crate::error::AppError;
use crate::state::AppState;
use std::time::Duration;

pub async fn run(state: AppState) {
    let period = Duration::from_millis(state.config.scheduler.tick_ms);
    loop {
        if let Err(e) = tick(&state).await {
            tracing::error!("scheduler tick failed: {e:#}");
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = state.wake.notified() => {}
        }
    }
}

pub async fn tick(state: &AppState) -> Result<(), AppError> {
    let cfg = state.config.scheduler.clone();
    let snapshot = state
        .db
        .run(move |c| {
            let silent = now() - chrono::Duration::seconds(3 * cfg.heartbeat_s as i64 + 5);
            nodes::mark_silent_offline(c, silent)?;
            let lost = attempts::expire_leases(
                c,
                now() - chrono::Duration::seconds(cfg.lease_margin_s as i64),
            )?;
            if lost > 0 {
                tracing::warn!(lost, "attempts lost with their servers; jobs requeued");
            }
            attempts::snapshot(c)
        })
        .await?;
    if snapshot.queue.is_empty() {
        return Ok(());
    }
    let plan = commons_sched::plan(
        &snapshot,
        &commons_sched::Policy::default(),
        chrono::Utc::now().timestamp(),
    );
    let ttl = chrono::Duration::seconds(state.config.scheduler.lease_ttl_s as i64);
    let orders = state
        .db
        .run(move |c| attempts::apply_plan(c, &plan, ttl))
        .await?;
    for o in orders {
        if !state.agents.send(o.node, o.msg) {
            tracing::warn!(
                node = o.node,
                "node disconnected before its start order; the lease will settle it"
            );
        }
    }
    Ok(())
}
