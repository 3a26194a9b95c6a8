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
//! 6. Removed, once no snapshot is in flight: when it was stopped (see
//!    [`uploads_checkpoint`]), `Upload` its checkpoint, once. Until that upload is over
//!    (stored, nothing to store, or given up) its heartbeats say `running`, not how it
//!    ended: the portal ends an attempt when it hears its final state, and from then on
//!    neither takes its checkpoint nor could the next attempt resume from it.
//! 7. Removed (and uploaded): `Report` the result as an event.
//! 8. Reported and acknowledged by the portal (a `Renew` left it out): `Forget` it.
//!
//! Invariants: at most one action per attempt per call (the next step; the executor marks
//! work in flight, so a step is never issued twice); a container is stopped at most once per
//! agent process, and never with more grace than the first stop gave it; nothing is removed
//! before its result is saved; a stopped attempt's final state reaches the portal only
//! after its checkpoint upload is over; nothing is forgotten before it is reported and
//! acknowledged.

use crate::runtime::AssignedGpu;
use commons_proto::{Attempt, AttemptReport, AttemptState, JobId, JobSpec, StopReason};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// An attempt's identity: every message about a job names its attempt.
pub type Key = (JobId, Attempt);

/// Grace given to a container whose time limit or lease ran out.
pub const ENFORCE_GRACE: Duration = Duration::from_secs(10);
/// The words of a stop because the lease ran out.
pub const TEXT_LEASE: &str = "lease expired: the server lost contact with the portal";

/// Why an attempt is stopped: the reason the portal acts on, and words for the job's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    pub reason: StopReason,
    pub text: String,
}

impl Why {
    /// The agent's words for a reason of its own (or one restored from disk).
    pub fn of(reason: StopReason) -> Self {
        let text = match reason {
            StopReason::LeaseExpired => TEXT_LEASE.to_string(),
            other => other.as_str().to_string(),
        };
        Self { reason, text }
    }

    /// The portal's order: its reason, followed by its detail when it gave one.
    pub fn ordered(reason: StopReason, detail: Option<&str>) -> Self {
        let text = match detail.map(str::trim).filter(|d| !d.is_empty()) {
            Some(d) => format!("{reason}: {d}"),
            None => reason.as_str().to_string(),
        };
        Self { reason, text }
    }

    /// The container engine lost the container.
    pub fn lost(detail: &str) -> Self {
        Self {
            reason: StopReason::Lost,
            text: format!("{}: {detail}", StopReason::Lost),
        }
    }
}

/// What to run for an attempt the portal started here.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub spec: JobSpec,
    pub gpus: Vec<AssignedGpu>,
    /// Restore the job's latest checkpoint into `/checkpoint` before the container starts.
    pub resume: bool,
}

/// The portal's order to stop an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOrder {
    /// Time between SIGTERM and SIGKILL, for the job to write its checkpoint.
    pub grace: Duration,
    pub why: Why,
}

/// What the portal wants of one attempt on this server.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub job: JobId,
    pub attempt: Attempt,
    /// What to run; `None` for an attempt restored from disk or found on the engine.
    pub launch: Option<Arc<Launch>>,
    /// It may run until then (boot clock); `Renew` extends it.
    pub lease_until: Duration,
    /// The portal asked it to stop; the first order wins.
    pub stop: Option<StopOrder>,
    /// The portal has recorded how it ended: a `Renew` left it out after its result was
    /// already in our heartbeats.
    pub acknowledged: bool,
}

/// Where an attempt's container stands, as the executor last observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Found on the engine (after a restart), not followed yet.
    Found { container: String, running: bool },
    /// Create and start are under way.
    Creating,
    /// It could not be created or started: no container exists.
    NotCreated { error: String },
    /// It runs (as far as we know) and a watcher waits for its end.
    Running { container: String },
    /// Found already ended; a watcher reads its exit code.
    Draining { container: String },
    /// Its main process ended with this code.
    Ended { container: String, exit_code: i64 },
    /// The engine no longer has it, and its exit is unknown.
    Lost { container: String, error: String },
    /// Removal is under way.
    Removing { container: String },
    /// No container is left.
    Removed,
}

/// A stop under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopping {
    pub why: Why,
    /// The grace the stop began with.
    pub grace: Duration,
    /// When it began (boot clock).
    pub since: Duration,
    /// This agent process asked the engine; false for a stop restored from disk, which is
    /// issued again with what is left of its grace.
    pub issued: bool,
}

impl Stopping {
    /// What is left of the grace at `now`.
    pub fn grace_left(&self, now: Duration) -> Duration {
        self.grace.saturating_sub(now.saturating_sub(self.since))
    }
}

/// Periodic checkpoints of a running attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshots {
    pub every: Duration,
    /// The next is due then (boot clock).
    pub next: Duration,
    /// One is under way.
    pub busy: bool,
}

/// Where the upload after an attempt stopped stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UploadStage {
    #[default]
    Pending,
    /// Under way.
    Busy,
    /// Over: stored, nothing to store, or given up (or none was needed).
    Done,
}

/// Whether an attempt that ended so has its checkpoint uploaded before it is reported:
/// every stop (preempted, cancelled, lease expired, time limit, lost) but one the portal
/// did not expect to run at all. An attempt that exited by itself or failed to start
/// uploads nothing: a job that ended has nothing to resume.
pub fn uploads_checkpoint(r: &AttemptResult) -> bool {
    r.state == AttemptState::Stopped && r.stop != Some(StopReason::NotExpected)
}

/// How an attempt ended, as the portal is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResult {
    pub state: AttemptState,
    pub exit_code: Option<i64>,
    pub stop: Option<StopReason>,
    pub reason: Option<String>,
}

/// What this server has of one attempt: its container and, once recorded, its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerObs {
    pub job: JobId,
    pub attempt: Attempt,
    pub phase: Phase,
    /// When its time limit is reached (boot clock); `None` when none is known.
    pub deadline: Option<Duration>,
    /// The time limit `deadline` counts (from the container's start); `None` when
    /// unknown, and then it cannot be extended.
    pub time_limit: Option<Duration>,
    /// The stop under way, once there is one.
    pub stopping: Option<Stopping>,
    /// How it ended, once recorded; from then on it is in every heartbeat.
    pub result: Option<AttemptResult>,
    /// The result is in `result.json`.
    pub saved: bool,
    /// The result was sent as an `AttemptEvent`.
    pub reported: bool,
    /// Periodic checkpoints, when the job asked for them.
    pub snapshots: Option<Snapshots>,
    /// The checkpoint upload after it stopped.
    pub upload: UploadStage,
}

impl ContainerObs {
    /// A fresh observation in `phase`, with nothing stopped, recorded or reported.
    pub fn new(job: JobId, attempt: Attempt, phase: Phase, deadline: Option<Duration>) -> Self {
        Self {
            job,
            attempt,
            phase,
            deadline,
            time_limit: None,
            stopping: None,
            result: None,
            saved: false,
            reported: false,
            snapshots: None,
            upload: UploadStage::Pending,
        }
    }

    /// Moves the time-limit deadline later by what the limit grew to `limit` (counted
    /// from the same start); returns whether it changed. A limit never shrinks, and
    /// nothing changes once a stop has begun or the end is recorded (too late to extend),
    /// or when the current limit is unknown.
    pub fn extend_time_limit(&mut self, limit: Duration) -> bool {
        let (Some(old), Some(deadline)) = (self.time_limit, self.deadline) else {
            return false;
        };
        if limit <= old || self.stopping.is_some() || self.result.is_some() {
            return false;
        }
        self.deadline = Some(deadline.saturating_add(limit - old));
        self.time_limit = Some(limit);
        true
    }

    /// Its result is recorded but must not reach the portal yet: its checkpoint upload is
    /// not over.
    pub fn holds_result(&self) -> bool {
        self.result
            .as_ref()
            .is_some_and(|r| uploads_checkpoint(r) && self.upload != UploadStage::Done)
    }

    fn snapshot_busy(&self) -> bool {
        self.snapshots.as_ref().is_some_and(|s| s.busy)
    }

    /// What the portal is told about this attempt in `Hello` and heartbeats.
    pub fn report(&self) -> AttemptReport {
        let (state, exit_code, stop, reason) = match (&self.result, &self.phase) {
            (Some(_), _) if self.holds_result() => (AttemptState::Running, None, None, None),
            (Some(r), _) => (r.state, r.exit_code, r.stop, r.reason.clone()),
            (None, Phase::Creating | Phase::NotCreated { .. }) => {
                (AttemptState::Starting, None, None, None)
            }
            (None, _) => (AttemptState::Running, None, None, None),
        };
        AttemptReport {
            job: self.job,
            attempt: self.attempt,
            state,
            exit_code,
            stop,
            reason,
        }
    }
}

/// One step for the executor to take.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create and start the attempt's container, with its time limit's deadline.
    Start {
        job: JobId,
        attempt: Attempt,
        launch: Arc<Launch>,
        deadline: Duration,
    },
    /// Follow a container found after a restart.
    Adopt {
        job: JobId,
        attempt: Attempt,
        container: String,
        running: bool,
    },
    /// SIGTERM now, SIGKILL after `grace`; keep `stopping` as the stop under way.
    Stop {
        job: JobId,
        attempt: Attempt,
        container: String,
        grace: Duration,
        stopping: Stopping,
    },
    /// Archive and upload the running attempt's checkpoint directory; the one after is due
    /// at `next`.
    Snapshot {
        job: JobId,
        attempt: Attempt,
        next: Duration,
    },
    /// Keep how the attempt ended (in `result.json`, and in heartbeats until the portal
    /// acknowledges it).
    Record {
        job: JobId,
        attempt: Attempt,
        result: AttemptResult,
    },
    /// Remove the container of a recorded attempt.
    Remove {
        job: JobId,
        attempt: Attempt,
        container: String,
    },
    /// Upload the stopped attempt's checkpoint directory, before it is reported.
    Upload { job: JobId, attempt: Attempt },
    /// Send the recorded result as an `AttemptEvent`.
    Report {
        job: JobId,
        attempt: Attempt,
        result: AttemptResult,
    },
    /// Drop every trace of an acknowledged attempt, its directory on disk included.
    Forget { job: JobId, attempt: Attempt },
}

impl Action {
    pub fn key(&self) -> Key {
        match self {
            Action::Start { job, attempt, .. }
            | Action::Adopt { job, attempt, .. }
            | Action::Stop { job, attempt, .. }
            | Action::Snapshot { job, attempt, .. }
            | Action::Record { job, attempt, .. }
            | Action::Upload { job, attempt }
            | Action::Remove { job, attempt, .. }
            | Action::Report { job, attempt, .. }
            | Action::Forget { job, attempt } => (*job, *attempt),
        }
    }
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
    let record = |result| {
        Some(Action::Record {
            job,
            attempt,
            result,
        })
    };
    let why_ended = |exit_code| match &h.stopping {
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
    };
    let Some(result) = &h.result else {
        return match &h.phase {
            Phase::Found { container, running } => Some(Action::Adopt {
                job,
                attempt,
                container: container.clone(),
                running: *running,
            }),
            Phase::Creating | Phase::Draining { .. } | Phase::Removing { .. } => None,
            Phase::Running { container } => {
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
                    container: container.clone(),
                    grace,
                    stopping,
                })
            }
            Phase::Ended { exit_code, .. } => record(why_ended(Some(*exit_code))),
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
            Phase::Removed => record(why_ended(None)),
        };
    };
    if !h.saved {
        // Not on disk yet (the last write failed): nothing moves on until it is.
        return record(result.clone());
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
                _ if !uploads_checkpoint(result) => {}
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
    AttemptResult {
        state: AttemptState::Stopped,
        exit_code,
        stop: Some(why.reason),
        reason: Some(why.text.clone()),
    }
}
