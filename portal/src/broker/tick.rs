//! The scheduler loop.
//!
//! Each tick:
//! 1. Housekeeping: nodes silent for three heartbeats go offline; attempts whose lease ran
//!    out more than the margin ago are lost and their jobs requeued (the agent has stopped
//!    them by then, so no job runs twice). Both are judged on the database's clock
//!    (`db::clock`), the one every lease was counted on.
//! 2. Read the snapshot in one transaction.
//! 3. `commons_sched::plan` (pure).
//! 4. Commit the plan in a second transaction that re-checks every start, in a fixed
//!    number of statements (`service::plan_commit`).
//! 5. Send the `Start`s to the agents.
//! 6. Write what the waiting jobs show (reason, place, estimate) where the plan changed
//!    it: for people to read, so after the `Start`s are on their way. A changed reason
//!    at once; places and estimates that moved at most every [`WAITING_MOVES_EVERY`].
//!
//! The loop runs every `tick_ms`, and sooner when woken (submission, freed GPUs): a
//! woken round starts once the previous one has been over for as long as it took, so
//! that submissions arriving hundreds a second do not keep the scheduler (and its
//! snapshot reads) running back to back. A round that left starts out (the cap
//! `max_starts_per_tick`) is followed at once.
//!
//! Leases are judged only by a scheduler that has watched for a whole lease plus the
//! margin: after a portal start (or a replica taking over), agents first get the time
//! to reconnect and renew. A portal that was down longer than a lease so does not
//! requeue every running job on campus at its first tick.
//! Besides the rounds, the leader applies the web apps' idle rule every
//! [`IDLE_APPS_EVERY`] (`service::app_idle`).
//! With PostgreSQL, several portal replicas may run; only the one holding the advisory
//! lock [`crate::db::leader::LEADER_LOCK`] ticks (the lock lives as long as its connection). SQLite
//! deployments run one portal.

use crate::error::AppError;
use crate::metrics::{preemption_cause, CauseLabel, KindLabel, LabLabel, Metrics};
use crate::service::plan_commit;
use crate::service::round::{Leader, Refresh};
use crate::state::AppState;
use commons_proto::{PortalMsg, StopReason};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the leader prunes the checkpoints of jobs that ended (it lists the store)
/// and the uploads of attempts no longer placed (so those go within 10 minutes).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// How often the waiting jobs' places and estimates are written when only they moved
/// (at 50,000 queued, a round that starts jobs moves nearly every row; writing them all
/// took about as long as the round itself).
pub const WAITING_MOVES_EVERY: Duration = Duration::from_secs(10);

/// How often the leader applies the web apps' idle rule (`service::app_idle`).
const IDLE_APPS_EVERY: Duration = Duration::from_secs(10);

pub async fn run(state: AppState) {
    let period = Duration::from_millis(state.config.scheduler.tick_ms);
    let postgres = state.db.backend == crate::db::Backend::Postgres;
    let leader = std::sync::Arc::new(std::sync::Mutex::new(Leader::default()));
    let watch = Duration::from_secs(
        state.config.scheduler.lease_ttl_s + state.config.scheduler.lease_margin_s,
    );
    // Since when this portal runs the scheduler without a break.
    let mut leading_since: Option<std::time::Instant> = None;
    let mut last_prune = std::time::Instant::now();
    let mut last_idle_check: Option<Instant> = None;
    let mut moves_written: Option<Instant> = None;
    // When the last round ended, and how long it took.
    let mut last_round = (Instant::now(), Duration::ZERO);
    // The scheduler's world between rounds while this replica leads, and when it was
    // last checked against a full read.
    let mut world = World::default();
    // The leader lock's term the world was read in (`Leader::terms`).
    let mut term = 0;
    loop {
        let (lead, now_term) = if postgres {
            let l = std::sync::Arc::clone(&leader);
            let url = state.config.database_url.clone();
            tokio::task::spawn_blocking(move || {
                let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
                (l.check(&url), l.terms())
            })
            .await
            .unwrap_or((false, term))
        } else {
            (true, term)
        };
        if lead && now_term != term {
            // The lock was lost and taken again between two checks: read afresh, and
            // give the agents a lease's time again, as at any takeover.
            term = now_term;
            leading_since = None;
            world = World::default();
        }
        if !lead {
            leading_since = None;
            // Another replica may lead meanwhile and take the changes out of the log.
            world = World::default();
            state.metrics.not_leading();
        }
        if lead {
            state.metrics.scheduler_leader.set(1);
            let since = *leading_since.get_or_insert_with(std::time::Instant::now);
            let judge_leases = since.elapsed() >= watch;
            let began = Instant::now();
            let more = match tick(&state, judge_leases, &mut moves_written, &mut world).await {
                Ok(more) => {
                    let at = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
                    state.metrics.last_tick.set(at);
                    more
                }
                Err(e) => {
                    tracing::error!("scheduler tick failed: {e:#}");
                    false
                }
            };
            last_round = (Instant::now(), began.elapsed());
            if last_idle_check.is_none_or(|t| t.elapsed() >= IDLE_APPS_EVERY) {
                last_idle_check = Some(Instant::now());
                if let Err(e) = crate::service::app_idle::check(&state).await {
                    tracing::error!("the idle apps' check failed: {e:#}");
                }
            }
            if last_prune.elapsed() >= PRUNE_EVERY {
                last_prune = std::time::Instant::now();
                match crate::service::checkpoints::prune_finished(&state).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(jobs = n, "checkpoints of ended jobs pruned"),
                    Err(e) => tracing::error!("pruning checkpoints failed: {e:#}"),
                }
                if let Err(e) = crate::service::checkpoints::prune_abandoned(&state).await {
                    tracing::error!("removing abandoned checkpoint uploads failed: {e:#}");
                }
                if let Err(e) = crate::service::files::sweep(&state).await {
                    tracing::error!("sweeping the file store failed: {e:#}");
                }
            }
            if more {
                continue;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = state.wake.notified() => {
                let (ended, took) = last_round;
                tokio::time::sleep_until((ended + took.min(period)).into()).await;
            }
        }
    }
}

/// The scheduler's world between rounds (`db::world`), and when it was last checked
/// against a full read.
#[derive(Default)]
pub struct World {
    rows: Option<crate::service::round::WorldRows>,
    checked: Option<Instant>,
}

/// One round; leases are judged only when `judge_leases` (see the module docs). Its
/// phases and what it saw go to the metrics. `moves_written`: when the waiting jobs'
/// places and estimates were last written (updated here). Returns whether starts were
/// left out for the next round (`max_starts_per_tick`).
pub async fn tick(
    state: &AppState,
    judge_leases: bool,
    moves_written: &mut Option<Instant>,
    world: &mut World,
) -> Result<bool, AppError> {
    let began = Instant::now();
    let cfg = state.config.scheduler.clone();
    let policy = state.config.policy.clone();
    let metrics = std::sync::Arc::clone(&state.metrics);
    let m = std::sync::Arc::clone(&metrics);
    let lap = crate::service::round::Lap {
        heartbeat_s: cfg.heartbeat_s,
        lease_margin_s: cfg.lease_margin_s,
        judge_leases,
    };
    let check_every = Duration::from_secs(cfg.world_check_s);
    let refresh = if world.checked.is_none_or(|t| t.elapsed() >= check_every) {
        Refresh::Check
    } else {
        Refresh::Changes
    };
    if !cfg.incremental_world {
        world.rows = None;
    }
    let had_world = world.rows.is_some();
    // Taken out while the round reads: a round that fails reads in full next time.
    let read =
        crate::service::round::read(state, lap, policy, m, world.rows.take(), refresh).await?;
    if refresh == Refresh::Check || !had_world {
        world.checked = Some(Instant::now());
    }
    if let Some(what) = &read.mismatch {
        metrics.world_mismatches.inc();
        tracing::error!(
            what = what.as_str(),
            "the scheduler's world differed from a fresh read of the database; repaired from it"
        );
    }
    // Kept through the round and given back at its end: a round that fails leaves no
    // world, and the next reads in full.
    let (snapshot, mut world_rows) = (read.snapshot, read.world);
    let now_s = chrono::Utc::now().timestamp();
    let offset = state.config.policy.utc_offset_s;
    let observing = Instant::now();
    metrics.observe_snapshot(&snapshot, now_s, offset);
    metrics.phase("read_observe", observing);
    metrics.phase("read", began);
    if nothing_to_plan(&snapshot, now_s, offset) {
        world.rows = Some(world_rows);
        metrics.plan_size.clear();
        metrics.tick_duration.observe(began.elapsed().as_secs_f64());
        return Ok(false);
    }
    let planning = Instant::now();
    // Tens of milliseconds of CPU at a large campus: off the runtime's worker threads,
    // which serve the SSH gateway and the portal's other loops meanwhile.
    let policy = state.config.policy.clone();
    let (mut plan, snapshot) = tokio::task::spawn_blocking(move || {
        let plan = commons_sched::plan(&snapshot, &policy, now_s);
        (plan, snapshot)
    })
    .await
    .map_err(|e| AppError::Internal(e.into()))?;
    metrics.phase("plan", planning);
    // A bounded commit: the starts left out are planned again in the next round, at once.
    let cap = state.config.scheduler.max_starts_per_tick.max(1);
    let more = plan.start.len() > cap;
    plan.start.truncate(cap);
    plan_sizes(&metrics, &plan);
    let committing = Instant::now();
    let timing = crate::broker::agent::timing(state);
    let pending = std::mem::take(&mut plan.pending);
    let m = std::sync::Arc::clone(&metrics);
    let orders = state
        .db
        .run_reserved(move |c| {
            m.phase("commit_wait", committing);
            plan_commit::apply_plan(c, &plan, timing)
        })
        .await?;
    metrics.phase("commit", committing);
    let sending = Instant::now();
    send_orders(state, &snapshot, orders, now_s).await;
    metrics.phase("send", sending);
    let waiting = Instant::now();
    let moves = moves_written.is_none_or(|t| t.elapsed() >= WAITING_MOVES_EVERY);
    // With the world's periodic check, the places a race left behind go.
    let sweep = refresh == Refresh::Check;
    // Compared with what the world holds, then noted in it (the triggers leave no change
    // for what the scheduler writes there).
    world.rows = Some(
        state
            .db
            .run_reserved(move |c| {
                if sweep {
                    let swept = plan_commit::sweep_places(c)?;
                    if swept > 0 {
                        tracing::info!(swept, "places of jobs that no longer wait removed");
                    }
                }
                let written =
                    plan_commit::record_waiting(c, &pending, |job| world_rows.shows(job), moves)?;
                world_rows.noted_waiting(&written);
                Ok::<_, AppError>(world_rows)
            })
            .await?,
    );
    if moves {
        *moves_written = Some(waiting);
    }
    metrics.phase("waiting", waiting);
    metrics.tick_duration.observe(began.elapsed().as_secs_f64());
    Ok(more)
}

/// Nothing queued and nothing to take back (reclaim, local use, a node that stopped
/// lending while guests run on it): nothing to plan.
fn nothing_to_plan(snapshot: &commons_sched::Snapshot, now_s: i64, offset: i32) -> bool {
    snapshot.queue.is_empty()
        && !snapshot.nodes.iter().any(|n| {
            n.reclaim
                || n.gpus.iter().any(|g| g.local_use)
                || (n.lending.lend_until(now_s, offset).is_none()
                    && snapshot
                        .running
                        .iter()
                        .any(|r| r.node == n.id && r.lab != n.lab))
        })
}

fn plan_sizes(metrics: &Metrics, plan: &commons_sched::Plan) {
    for (kind, n) in [
        ("start", plan.start.len()),
        ("preempt", plan.preempt.len()),
        ("pending", plan.pending.len()),
    ] {
        metrics
            .plan_size
            .get_or_create(&KindLabel { kind })
            .set(n as i64);
    }
}

/// Sends the committed orders (straight down the socket when this replica holds the
/// agent, else through the mailbox to the replica that does), counting starts and
/// preemptions.
async fn send_orders(
    state: &AppState,
    snapshot: &commons_sched::Snapshot,
    orders: Vec<crate::service::attempts::Order>,
    now_s: i64,
) {
    let metrics = &state.metrics;
    let queued: HashMap<i64, (i64, i64)> = snapshot
        .queue
        .iter()
        .map(|q| (q.id, (q.lab, q.submitted_at)))
        .collect();
    for o in orders {
        match &o.msg {
            PortalMsg::Start { job, attempt, .. } => {
                tracing::info!(job, attempt, node = o.node, "attempt started");
                if let Some(&(lab, submitted)) = queued.get(job) {
                    let lab = LabLabel {
                        lab: metrics.lab(lab),
                    };
                    metrics.starts.get_or_create(&lab).inc();
                    metrics
                        .queue_wait
                        .get_or_create(&lab)
                        .observe((now_s - submitted).max(0) as f64);
                }
            }
            PortalMsg::Stop {
                job,
                attempt,
                reason: StopReason::Preempted,
                detail,
                ..
            } => {
                let cause = preemption_cause(detail.as_deref().unwrap_or(""));
                tracing::info!(job, attempt, node = o.node, cause, "attempt preempted");
                metrics
                    .preemptions
                    .get_or_create(&CauseLabel { cause })
                    .inc();
            }
            _ => {}
        }
        if let Err(e) = crate::service::agents::deliver(state, o.node, o.msg).await {
            tracing::warn!(
                node = o.node,
                "order not delivered ({e}); the lease will settle it"
            );
        }
    }
}
