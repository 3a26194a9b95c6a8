//! The agent's one decision: given what the portal wants here ([`Assignment`]s) and what
//! this server has ([`ContainerObs`]), what to do next ([`Action`]s).
//!
//! [`reconcile`] is pure: no I/O, no tokio, no clock of its own (`now` is an argument), and
//! it walks attempts in (job, attempt) order, so the same inputs always give the same
//! actions. The executor applies the actions through a `ContainerRuntime` and asks again
//! until nothing is left to do; every effect it observes comes back as a changed input.
//!
//! Times are [`Duration`]s on `CLOCK_BOOTTIME` (see `clock`): monotonic, never wall-clock.
//! A lease's end is counted from when the agent sent the message the lease names; a time
//! limit from the container's start. Both are kept on disk (`lease.json`), so a restarted
//! agent restores them instead of granting itself a fresh lease.
//!
//! One attempt's life, one step per call:
//! 1. Wanted, nothing here yet: `Start` it (unless the portal already asked for a stop or
//!    its lease already ran out; then it never starts and that is its result).
//! 2. Found on the engine after a restart: `Adopt` it, running (followed again) or not
//!    (its exit code is read; it is never stopped, since it already ended).
//! 3. Running: `Stop` it, once, when the portal asked (with the portal's grace), when its
//!    lease ran out, or when its time limit passed (with [`ENFORCE_GRACE`]). A stop begun
//!    before a restart is issued again with what is left of its grace. Otherwise, when the
//!    job asked for periodic checkpoints and one is due, `Snapshot` it (one at a time).
//! 4. Ended (or never created, or lost): `Record` its result, which the executor writes to
//!    `result.json`. From then on it is in every heartbeat, so a report sent into a dying
//!    connection is not lost; a result not yet on disk is recorded again.
//! 5. Recorded and on disk: `Remove` its container; only a saved result lets it go.
//! 6. Removed, once no snapshot is in flight: `Upload` its `/outputs` (whenever its
//!    container ran) and, when it was stopped (see [`uploads_checkpoint`]), its
//!    checkpoint, once ([`uploads_before_report`]). Until that upload is over (stored,
//!    nothing to store, or given up) its heartbeats say `running`, not how it ended: the
//!    portal ends an attempt when it hears its final state, and from then on takes
//!    neither its outputs nor its checkpoint, nor could the next attempt resume from them.
//! 7. Removed (and uploaded): `Report` the result as an event.
//! 8. Reported and acknowledged by the portal (a `Renew` left it out): `Forget` it.
//!
//! Invariants: at most one action per attempt per call (the next step; the executor marks
//! work in flight, so a step is never issued twice); a container is stopped at most once per
//! agent process, and never with more grace than the first stop gave it; nothing is removed
//! before its result is saved; a stopped attempt's final state reaches the portal only
//! after its checkpoint upload is over; nothing is forgotten before it is reported and
//! acknowledged.

mod model;

pub use model::{
    Action, Assignment, AttemptResult, ContainerObs, Launch, Phase, Snapshots, StopOrder, Stopping,
    UploadStage, Why,
};

use commons_proto::{Attempt, AttemptState, JobId, StopReason};
use std::collections::BTreeMap;
use std::time::Duration;

/// An attempt's identity: every message about a job names its attempt.
pub type Key = (JobId, Attempt);

/// Grace given to a container whose time limit or lease ran out.
pub const ENFORCE_GRACE: Duration = Duration::from_secs(10);
/// The words of a stop because the lease ran out.
pub const TEXT_LEASE: &str = "lease expired: the server lost contact with the portal";

/// Whether an attempt that ended so has its checkpoint uploaded before it is reported:
/// every stop (preempted, cancelled, lease expired, time limit, lost) but one the portal
/// did not expect to run at all. An attempt that exited by itself or failed to start
/// uploads nothing: a job that ended has nothing to resume.
pub fn uploads_checkpoint(r: &AttemptResult) -> bool {
    r.state == AttemptState::Stopped && r.stop != Some(StopReason::NotExpected)
}

/// Whether an attempt that ended so, in `phase`, uploads before it is reported: its
/// checkpoint when it was stopped ([`uploads_checkpoint`]), and its `/outputs` whenever
/// its container was made, unless the portal did not expect it to run at all.
pub fn uploads_before_report(r: &AttemptResult, phase: &Phase) -> bool {
    let ran = !matches!(phase, Phase::NotCreated { .. } | Phase::Creating);
    uploads_checkpoint(r) || (ran && r.stop != Some(StopReason::NotExpected))
}

/// The next step for every attempt that needs one, in (job, attempt) order.
pub fn reconcile(desired: &[Assignment], actual: &[ContainerObs], now: Duration) -> Vec<Action> {
    type Pair<'a> = (Option<&'a Assignment>, Option<&'a ContainerObs>);
    let mut attempts: BTreeMap<Key, Pair<'_>> = BTreeMap::new();
    for a in desired {
        attempts.entry((a.job, a.attempt)).or_default().0 = Some(a);
    }
    for o in actual {
        attempts.entry((o.job, o.attempt)).or_default().1 = Some(o);
    }
    attempts
        .into_iter()
        .filter_map(|((job, attempt), (want, have))| match have {
            None => want.and_then(|w| not_here(w, now)),
            Some(h) => here(job, attempt, want, h, now),
        })
        .collect()
}

/// An attempt the portal wants that has nothing on this server yet.
fn not_here(w: &Assignment, now: Duration) -> Option<Action> {
    let (job, attempt) = (w.job, w.attempt);
    let never = |why: &Why| Action::Record {
        job,
        attempt,
        result: stopped(None, why),
    };
    if let Some(order) = &w.stop {
        return Some(never(&order.why));
    }
    if crate::deadline::lease_lapsed(w.lease_until, now) {
        return Some(never(&Why::of(StopReason::LeaseExpired)));
    }
    match &w.launch {
        Some(launch) => Some(Action::Start {
            job,
            attempt,
            launch: launch.clone(),
            deadline: now.saturating_add(Duration::from_secs(launch.spec.time_limit_s)),
        }),
        // Restored, but neither its container nor its result is here: nothing can bring
        // it back; the portal requeues it.
        None => Some(never(&Why::lost("the container is not on this server"))),
    }
}

/// An attempt with an observation: steps 2 to 7 of the module's list.
fn here(
    job: JobId,
    attempt: Attempt,
    want: Option<&Assignment>,
    h: &ContainerObs,
    now: Duration,
) -> Option<Action> {
    match &h.result {
        None => unrecorded(job, attempt, want, h, now),
        Some(result) => recorded(job, attempt, want, h, result),
    }
}

/// Steps 2 to 4: adopt, stop or snapshot, or record how it ended.
fn unrecorded(
    job: JobId,
    attempt: Attempt,
    want: Option<&Assignment>,
    h: &ContainerObs,
    now: Duration,
) -> Option<Action> {
    let record = |result| {
        Some(Action::Record {
            job,
            attempt,
            result,
        })
    };
    match &h.phase {
        Phase::Found { container, running } => Some(Action::Adopt {
            job,
            attempt,
            container: container.clone(),
            running: *running,
        }),
        Phase::Creating | Phase::Draining { .. } | Phase::Removing { .. } => None,
        Phase::Running { container } => running(job, attempt, container, want, h, now),
        Phase::Ended { exit_code, .. } => record(why_ended(h, Some(*exit_code))),
        Phase::Lost { error, .. } => record(match &h.stopping {
            Some(s) => stopped(None, &s.why),
            None => stopped(None, &Why::lost(error)),
        }),
        Phase::NotCreated { error } => record(AttemptResult {
            state: AttemptState::Failed,
            exit_code: None,
            stop: None,
            reason: Some(error.clone()),
        }),
        Phase::Removed => record(why_ended(h, None)),
    }
}

/// Step 3: a running container is stopped (once), or snapshotted when one is due.
fn running(
    job: JobId,
    attempt: Attempt,
    container: &str,
    want: Option<&Assignment>,
    h: &ContainerObs,
    now: Duration,
) -> Option<Action> {
    let (grace, stopping) = match &h.stopping {
        Some(s) if s.issued => return None,
        Some(s) => (
            s.grace_left(now),
            Stopping {
                issued: true,
                ..s.clone()
            },
        ),
        None => {
            let Some((grace, why)) = why_stop(want, h.deadline, now) else {
                return h
                    .snapshots
                    .as_ref()
                    .filter(|s| !s.busy && now >= s.next)
                    .map(|s| Action::Snapshot {
                        job,
                        attempt,
                        next: now.saturating_add(s.every),
                    });
            };
            let stopping = Stopping {
                why,
                grace,
                since: now,
                issued: true,
            };
            (grace, stopping)
        }
    };
    Some(Action::Stop {
        job,
        attempt,
        container: container.to_string(),
        grace,
        stopping,
    })
}

/// How an attempt whose container ended (with `exit_code`, when known) is recorded: the
/// stop under way, if any, says why.
fn why_ended(h: &ContainerObs, exit_code: Option<i64>) -> AttemptResult {
    match &h.stopping {
        Some(s) => stopped(exit_code, &s.why),
        None => match exit_code {
            Some(code) => AttemptResult {
                state: AttemptState::Exited,
                exit_code: Some(code),
                stop: None,
                reason: None,
            },
            None => stopped(None, &Why::lost("the container vanished")),
        },
    }
}

/// Steps 4 to 8 once a result is recorded: saved, removed, uploaded, reported, forgotten.
fn recorded(
    job: JobId,
    attempt: Attempt,
    want: Option<&Assignment>,
    h: &ContainerObs,
    result: &AttemptResult,
) -> Option<Action> {
    if !h.saved {
        // Not on disk yet (the last write failed): nothing moves on until it is.
        return Some(Action::Record {
            job,
            attempt,
            result: result.clone(),
        });
    }
    match &h.phase {
        Phase::Ended { container, .. }
        | Phase::Lost { container, .. }
        | Phase::Running { container }
        | Phase::Draining { container }
        | Phase::Found { container, .. } => Some(Action::Remove {
            job,
            attempt,
            container: container.clone(),
        }),
        Phase::Creating | Phase::Removing { .. } => None,
        Phase::Removed | Phase::NotCreated { .. } if !h.reported => {
            if h.snapshot_busy() {
                // It ends soon (cancelled when the container stopped); the directory is
                // one snapshot's at a time.
                return None;
            }
            match h.upload {
                _ if !uploads_before_report(result, &h.phase) => {}
                UploadStage::Pending => return Some(Action::Upload { job, attempt }),
                UploadStage::Busy => return None,
                UploadStage::Done => {}
            }
            Some(Action::Report {
                job,
                attempt,
                result: result.clone(),
            })
        }
        Phase::Removed | Phase::NotCreated { .. } => want
            .is_none_or(|w| w.acknowledged)
            .then_some(Action::Forget { job, attempt }),
    }
}

/// Why a running container must stop now, if it must: the portal's order first, then the
/// lease, then the time limit, by the rule the guard also follows (`deadline`).
fn why_stop(
    want: Option<&Assignment>,
    deadline: Option<Duration>,
    now: Duration,
) -> Option<(Duration, Why)> {
    if let Some(order) = want.and_then(|w| w.stop.as_ref()) {
        return Some((order.grace, order.why.clone()));
    }
    // An attempt the portal no longer lists has no lease to lapse; its time limit holds.
    let lease = want.map(|w| w.lease_until);
    crate::deadline::passed(lease, deadline, now).map(|reason| (ENFORCE_GRACE, Why::of(reason)))
}

fn stopped(exit_code: Option<i64>, why: &Why) -> AttemptResult {
    if why.fails {
        return AttemptResult {
            state: AttemptState::Failed,
            exit_code,
            stop: None,
            reason: Some(why.text.clone()),
        };
    }
    AttemptResult {
        state: AttemptState::Stopped,
        exit_code,
        stop: Some(why.reason),
        reason: Some(why.text.clone()),
    }
}
