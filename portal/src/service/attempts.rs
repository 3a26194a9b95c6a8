//! The attempt lifecycle: the agent reports that move attempts (and so jobs) along,
//! leases, and the `Start`s an agent missed. (Committing the scheduler's plan is
//! `plan_commit`.)
//!
//! Invariants:
//! - At most one active attempt (starting, running, stopping) per job; active attempts
//!   hold their GPUs, so the scheduler never gives a GPU to two attempts.
//! - A report about an attempt that is unknown, on another node, or already over changes
//!   nothing here; if the agent still runs it, the caller answers with a `Stop`.
//! - Only a job's current attempt decides the job's fate.

use super::plan_commit::{start_msg, StartFacts};
pub use crate::db::attempts::Renewable;
use crate::db::jobs::{add_event, set_state};
use crate::db::models::{AgentClock, Attempt, AttemptStatus, Gpu, Job, JobState};
use crate::db::{self, now, DbConn};
use crate::error::AppError;
use chrono::NaiveDateTime;
use commons_proto::{AttemptReport, AttemptState, PortalMsg, StopReason};
use std::collections::{BTreeMap, BTreeSet};

/// Grace of a `Stop` for an attempt the portal does not expect to run at all, and for a
/// cancelled one.
pub const SHORT_GRACE_S: u64 = 10;

/// The lease and grace settings the lifecycle works with.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease lasts without renewal.
    pub lease_ttl_s: u64,
    /// The campus default grace of a preempted guest (a node may set its own).
    pub default_grace_s: u32,
    /// The campus default disk of a job that names none, in GiB.
    pub default_disk_gb: u64,
}

impl Timing {
    pub(crate) fn grace_on(&self, node_grace_s: i32) -> u64 {
        if node_grace_s > 0 {
            node_grace_s as u64
        } else {
            u64::from(self.default_grace_s)
        }
    }
}

/// A message to send to a node once the plan is committed.
pub struct Order {
    pub node: i64,
    pub msg: PortalMsg,
}

/// `Start`s for this node's attempts that should be starting but that the agent does not
/// report. The database is the truth of what should run: whichever portal replica holds
/// the agent's connection delivers them, also when the first send was lost. The agent
/// ignores a `Start` it already has.
pub fn undelivered_starts(
    c: &mut DbConn,
    node: i64,
    reported: &[AttemptReport],
    clock: &AgentClock,
    timing: Timing,
) -> Result<Vec<PortalMsg>, AppError> {
    let known: BTreeSet<(i64, i32)> = reported.iter().map(|r| (r.job, r.attempt)).collect();
    let missing: Vec<Attempt> = db::attempts::on_node(c, node, &[AttemptStatus::Starting])?
        .into_iter()
        .filter(|a| !known.contains(&(a.job_id, a.attempt)))
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = missing.iter().map(|a| a.job_id).collect();
    let jobs: BTreeMap<i64, Job> = db::jobs::by_ids(c, &ids)?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    let gpu_ids: Vec<i64> = missing.iter().flat_map(|a| a.gpu_id_list()).collect();
    let gpus = db::nodes::gpus_by_ids(c, &gpu_ids)?;
    let facts = StartFacts::read(c, jobs.values())?.with_nodes(c, &[node])?;
    Ok(missing
        .iter()
        .filter_map(|a| {
            let ids = a.gpu_id_list();
            let on: Vec<Gpu> = gpus
                .iter()
                .filter(|g| ids.contains(&g.id))
                .cloned()
                .collect();
            Some(start_msg(
                jobs.get(&a.job_id)?,
                a.attempt,
                (&on, a.share()),
                clock.lease(timing.lease_ttl_s),
                timing,
                &facts,
            ))
        })
        .collect())
}

/// The `Start`s a just-registered connection of session `session` still needs: those
/// placed on the node between its `Hello`'s answer and its registration with this replica,
/// which the scheduler could not deliver then (the agent ignores one it already has).
/// Nothing when another session holds the node by now.
pub fn starts_after_registering(
    c: &mut DbConn,
    node: i64,
    session: u64,
    reported: &[AttemptReport],
    timing: Timing,
) -> Result<Vec<PortalMsg>, AppError> {
    match db::nodes::node_by_id(c, node)?.agent_clock() {
        Some(clock) if clock.session == session => {
            undelivered_starts(c, node, reported, &clock, timing)
        }
        _ => Ok(Vec::new()),
    }
}

fn requeue(c: &mut DbConn, job: i64, why: &str) -> Result<(), db::DbError> {
    db::jobs::set_unplaced(c, job, why)?;
    set_state(c, job, JobState::Queued, &format!("requeued: {why}"))
}

/// Ends an attempt and moves its job along.
fn end_attempt(
    c: &mut DbConn,
    a: &Attempt,
    status: AttemptStatus,
    exit_code: Option<i64>,
    stop: Option<StopReason>,
    reason: Option<&str>,
) -> Result<(), AppError> {
    db::attempts::end(c, a.id, status, exit_code, reason, now())?;
    settle_job(c, a, status, exit_code, stop, reason)
}

/// After attempt `a` ended as `status`: its job's fate, if `a` is its current attempt.
fn settle_job(
    c: &mut DbConn,
    a: &Attempt,
    status: AttemptStatus,
    exit_code: Option<i64>,
    stop: Option<StopReason>,
    reason: Option<&str>,
) -> Result<(), AppError> {
    let job = db::jobs::get(c, a.job_id)?;
    // Only the job's current attempt may decide its fate.
    if job.attempts != a.attempt {
        return Ok(());
    }
    match job.state {
        JobState::Starting | JobState::Running => {}
        // A job that ended by itself during its grace period has simply ended.
        JobState::Preempting if status == AttemptStatus::Exited => {}
        JobState::Preempting => return Ok(requeue(c, job.id, reason.unwrap_or("preempted"))?),
        JobState::Cancelled => {
            return Ok(add_event(
                c,
                job.id,
                JobState::Cancelled,
                "container stopped",
            )?);
        }
        _ => return Ok(()),
    }
    db::jobs::set_result(c, job.id, exit_code, reason)?;
    let ended = match status {
        AttemptStatus::Exited => {
            let (state, message) = exit_outcome(exit_code);
            set_state(c, job.id, state, &message)
        }
        AttemptStatus::Lost => requeue(c, job.id, reason.unwrap_or("lost")),
        AttemptStatus::Stopped => match stop {
            Some(why) if why.requeues() => requeue(c, job.id, reason.unwrap_or(why.as_str())),
            Some(why) => set_state(c, job.id, JobState::Failed, reason.unwrap_or(why.as_str())),
            None => set_state(c, job.id, JobState::Failed, reason.unwrap_or("stopped")),
        },
        _ => set_state(c, job.id, JobState::Failed, reason.unwrap_or("failed")),
    };
    Ok(ended?)
}

/// What a job whose current attempt exited becomes, and its history row's message.
fn exit_outcome(exit_code: Option<i64>) -> (JobState, String) {
    match exit_code {
        Some(0) => (JobState::Succeeded, "exited with code 0".into()),
        code => (
            JobState::Failed,
            format!("exited with code {}", code.unwrap_or(-1)),
        ),
    }
}

/// The usual end of an attempt (it exited, or failed, while its job ran it), as one
/// statement on PostgreSQL inside the report's transaction: three statements where the
/// general path sends nine (the load test's campus ends a few hundred attempts a second,
/// each one of these). Whether it settled the report: not when the report is no such
/// end, or on SQLite; then the general path decides. The same rows either way
/// (`end_attempt`'s rules): an exit settles a job that runs or is being preempted (it
/// ended by itself during its grace period), a failure one that runs (a preempted one is
/// requeued: the general path).
fn usual_end(c: &mut DbConn, node: i64, r: &AttemptReport) -> Result<bool, AppError> {
    const RUNS: &[JobState] = &[JobState::Starting, JobState::Running];
    const RUNS_OR_PREEMPTED: &[JobState] =
        &[JobState::Starting, JobState::Running, JobState::Preempting];
    let (status, job_from, job_to, message) = match r.state {
        AttemptState::Exited => {
            let (to, message) = exit_outcome(r.exit_code);
            (AttemptStatus::Exited, RUNS_OR_PREEMPTED, to, message)
        }
        AttemptState::Failed => {
            let message = r.reason.clone().unwrap_or_else(|| "failed".into());
            (AttemptStatus::Failed, RUNS, JobState::Failed, message)
        }
        _ => return Ok(false),
    };
    let end = db::attempts::JobEnd {
        node,
        job: r.job,
        attempt: r.attempt,
        status,
        exit_code: r.exit_code,
        reason: r.reason.as_deref(),
        job_from,
        job_to,
        message: &message,
        at: now(),
    };
    match db::attempts::end_with_job(c, &end)? {
        Some(db::attempts::Ended { attempt: true, job }) => {
            if !job {
                // The job moved between the check and its row (a cancel committed
                // meanwhile): its fate by the general rules, in this transaction.
                if let Some(a) = db::attempts::find(c, r.job, r.attempt)? {
                    settle_job(c, &a, status, r.exit_code, r.stop, r.reason.as_deref())?;
                }
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// What the caller must do after a report.
#[derive(Debug, Default)]
pub struct ReportOutcome {
    /// Send this `Stop` back to the agent.
    pub stop: Option<PortalMsg>,
    /// GPUs were freed: run the scheduler soon.
    pub freed: bool,
}

/// Applies one attempt report or event from `node`.
pub fn apply_report(
    c: &mut DbConn,
    node: i64,
    r: &AttemptReport,
    timing: Timing,
) -> Result<ReportOutcome, AppError> {
    // The report of every start, made one statement on PostgreSQL (the load test: half
    // the statements of a campus filling up were these, six each).
    if r.state == AttemptState::Running
        && db::attempts::start_running(c, node, r.job, r.attempt, now())? == Some(true)
    {
        return Ok(ReportOutcome::default());
    }
    db::transaction(c, |c| {
        if usual_end(c, node, r)? {
            return Ok(ReportOutcome {
                stop: None,
                freed: true,
            });
        }
        let unexpected = PortalMsg::Stop {
            job: r.job,
            attempt: r.attempt,
            grace_s: SHORT_GRACE_S,
            reason: StopReason::NotExpected,
            detail: None,
        };
        let a = match db::attempts::find(c, r.job, r.attempt)? {
            Some(a) if a.node_id == node && a.state.is_active() => a,
            _ => {
                let mut out = ReportOutcome::default();
                if !r.state.is_final() {
                    out.stop = Some(unexpected);
                }
                return Ok(out);
            }
        };
        let mut out = ReportOutcome::default();
        let ended = match r.state {
            AttemptState::Starting => None,
            AttemptState::Running => {
                if a.state == AttemptStatus::Starting {
                    let t = now();
                    db::attempts::mark_running(c, a.id, t)?;
                    // The job moves only while it starts this attempt (one statement).
                    if db::jobs::set_running(c, a.job_id, a.attempt, t)? {
                        add_event(
                            c,
                            a.job_id,
                            JobState::Running,
                            &format!("attempt {} running", a.attempt),
                        )?;
                    }
                } else if a.state == AttemptStatus::Stopping {
                    // Still running although told to stop (the first `Stop` was lost):
                    // the same order again, with the same grace.
                    let job = db::jobs::get(c, a.job_id)?;
                    let node = db::nodes::node_by_id(c, a.node_id)?;
                    out.stop = Some(stop_order(&a, job.state, timing.grace_on(node.grace_s)));
                }
                None
            }
            AttemptState::Exited => Some(AttemptStatus::Exited),
            AttemptState::Stopped => Some(AttemptStatus::Stopped),
            AttemptState::Failed => Some(AttemptStatus::Failed),
        };
        if let Some(status) = ended {
            end_attempt(c, &a, status, r.exit_code, r.stop, r.reason.as_deref())?;
            out.freed = true;
        }
        Ok(out)
    })
}

/// After a `Hello`: attempts this node runs (or stops) but does not report. They are not
/// lost yet: an agent whose state dir was lost, or a clone with an old copy of it, says
/// nothing about a container that may still run on the first server until its lease
/// ends. So they are no longer renewed ([`renew`] extends only what the agent reports),
/// and the lease decides: lost, and requeued, once it ran out ([`expire_leases`]), when
/// whatever runs them has stopped them. Returns how many there are (logged).
///
/// An attempt still `starting` is not among them: its `Start` may have crossed the
/// `Hello` on the wire (or gone to the connection that just died); it is delivered again
/// ([`undelivered_starts`]), and the agent ignores a `Start` it already has.
pub fn reconcile_missing(
    c: &mut DbConn,
    node: i64,
    reported: &[AttemptReport],
) -> Result<usize, AppError> {
    let known: BTreeSet<(i64, i32)> = reported.iter().map(|r| (r.job, r.attempt)).collect();
    let ours = db::attempts::on_node(c, node, &[AttemptStatus::Running, AttemptStatus::Stopping])?;
    let missing: Vec<&Attempt> = ours
        .iter()
        .filter(|a| !known.contains(&(a.job_id, a.attempt)))
        .collect();
    for a in &missing {
        tracing::warn!(
            node,
            job = a.job_id,
            attempt = a.attempt,
            lease_until = %a.lease_until,
            "the agent's Hello does not report this attempt: no longer renewed, it is \
             requeued when its lease runs out"
        );
    }
    Ok(missing.len())
}

/// Renews the leases of this node's active attempts that `which` names for `ttl_s`,
/// counted from the agent message `clock`; returns the `Renew` to send, with each
/// attempt's current time limit (which an extension may have raised since its `Start`).
pub fn renew(
    c: &mut DbConn,
    node: i64,
    clock: &AgentClock,
    ttl_s: u64,
    which: Renewable<'_>,
) -> Result<PortalMsg, AppError> {
    let until = clock.lease_until(ttl_s);
    let attempts = db::attempts::renew_on(c, node, until, which)?;
    let time_limits = if attempts.is_empty() {
        Vec::new()
    } else {
        super::extend::time_limits(c, &attempts)?
    };
    Ok(PortalMsg::Renew {
        lease: clock.lease(ttl_s),
        attempts,
        time_limits,
    })
}

/// The jobs of an agent's reports, for [`Renewable::Reported`].
pub fn reported_jobs(reports: &[AttemptReport]) -> Vec<i64> {
    let mut jobs: Vec<i64> = reports.iter().map(|r| r.job).collect();
    jobs.sort_unstable();
    jobs.dedup();
    jobs
}

/// The `Stop` for an attempt in `stopping`, from its job's state: a preempted guest
/// gets its node's grace on every path, a cancelled job the short one.
fn stop_order(a: &Attempt, job: JobState, preempt_grace_s: u64) -> PortalMsg {
    let (reason, grace_s) = match job {
        JobState::Preempting => (StopReason::Preempted, preempt_grace_s),
        JobState::Cancelled => (StopReason::Cancelled, SHORT_GRACE_S),
        _ => (StopReason::NotExpected, SHORT_GRACE_S),
    };
    PortalMsg::Stop {
        job: a.job_id,
        attempt: a.attempt,
        grace_s,
        reason,
        detail: None,
    }
}

/// `Stop`s for this node's attempts that are being stopped (sent again after a reconnect).
pub fn pending_stops(
    c: &mut DbConn,
    node: i64,
    timing: Timing,
) -> Result<Vec<PortalMsg>, AppError> {
    let grace = timing.grace_on(db::nodes::node_by_id(c, node)?.grace_s);
    Ok(db::attempts::stopping_on(c, node)?
        .into_iter()
        .map(|(a, job)| stop_order(&a, job, grace))
        .collect())
}

/// Attempts whose lease ran out before `cutoff` (lease TTL plus a margin ago): their agent
/// has stopped them by now, so they are lost and their jobs requeued.
pub fn expire_leases(c: &mut DbConn, cutoff: NaiveDateTime) -> Result<usize, AppError> {
    db::transaction(c, |c| {
        let expired = db::attempts::expired(c, cutoff)?;
        for a in &expired {
            end_attempt(
                c,
                a,
                AttemptStatus::Lost,
                None,
                Some(StopReason::LeaseExpired),
                Some("lost contact with its server"),
            )?;
        }
        Ok(expired.len())
    })
}

#[cfg(test)]
#[path = "attempts_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "attempts_end_tests.rs"]
mod end_tests;
