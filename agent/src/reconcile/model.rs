//! What [`reconcile`](super::reconcile) decides from and what it decides: the portal's
//! wishes ([`Assignment`]), what this server has ([`ContainerObs`]), and the steps
//! ([`Action`]). Plain data, with the few words and sums that belong to it.

use super::{uploads_before_report, Key, TEXT_LEASE};
use crate::runtime::AssignedGpu;
use commons_proto::{Attempt, AttemptReport, AttemptState, JobId, JobSpec, StopReason};
use std::sync::Arc;
use std::time::Duration;

/// Why an attempt is stopped: the reason the portal acts on, and words for the job's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    pub reason: StopReason,
    pub text: String,
    /// The agent stopped it for breaking a rule of this server (more GPU memory than its
    /// share holds), or never started it (a share that does not fit): its result is
    /// `failed` with `text` as the reason, not `stopped`, so it is not requeued.
    pub fails: bool,
}

impl Why {
    /// The agent's words for a reason of its own (or one restored from disk).
    pub fn of(reason: StopReason) -> Self {
        let text = match reason {
            StopReason::LeaseExpired => TEXT_LEASE.to_string(),
            other => other.as_str().to_string(),
        };
        Self {
            reason,
            text,
            fails: false,
        }
    }

    /// A failure the agent found (see [`Why::fails`]); `Cancelled` is the reason kept on
    /// disk beside it, so that a reader of the reason alone ends the job as well.
    pub fn failed(text: impl Into<String>) -> Self {
        Self {
            reason: StopReason::Cancelled,
            text: text.into(),
            fails: true,
        }
    }

    /// The portal's order: its reason, followed by its detail when it gave one.
    pub fn ordered(reason: StopReason, detail: Option<&str>) -> Self {
        let text = match detail.map(str::trim).filter(|d| !d.is_empty()) {
            Some(d) => format!("{reason}: {d}"),
            None => reason.as_str().to_string(),
        };
        Self {
            reason,
            text,
            fails: false,
        }
    }

    /// The container engine lost the container.
    pub fn lost(detail: &str) -> Self {
        Self {
            reason: StopReason::Lost,
            text: format!("{}: {detail}", StopReason::Lost),
            fails: false,
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

    /// Its result is recorded but must not reach the portal yet: its upload (outputs,
    /// checkpoint) is not over.
    pub fn holds_result(&self) -> bool {
        self.result.as_ref().is_some_and(|r| {
            uploads_before_report(r, &self.phase) && self.upload != UploadStage::Done
        })
    }

    pub(super) fn snapshot_busy(&self) -> bool {
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
            gpu_memory_used_mb: None,
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
