//! The agent's one decision: given what the portal wants here ([`Assignment`]s) and what
//! this server has ([`ContainerObs`]), what to do next ([`Action`]s).
//!
//! [`reconcile`] is pure: no I/O, no tokio, no clock of its own (`now` is an argument), and
//! it walks attempts in (job, attempt) order, so the same inputs always give the same
//! actions. The executor applies the actions through a `ContainerRuntime` and asks again
//! until nothing is left to do; every effect it observes comes back as a changed input.
//!
//! Times are [`Duration`]s since the Unix epoch on this server's clock: wall-clock, because
//! a time limit's deadline outlives the agent in the container's labels.
//!
//! One attempt's life, one step per call:
//! 1. Wanted, nothing here yet: `Start` it (unless the portal already asked for a stop or
//!    its lease already ran out; then it never starts and that is its result).
//! 2. Found on the engine after a restart: `Adopt` it, whether it still runs or not.
//! 3. Running: `Stop` it, once, when the portal asked (with the portal's grace), when its
//!    lease ran out, or when its time limit passed (with [`ENFORCE_GRACE`]).
//! 4. Ended (or never created, or lost): `Record` its result. From then on it is in every
//!    heartbeat, so a report sent into a dying connection is not lost.
//! 5. Recorded: `Remove` its container; only a recorded result lets a container go.
//! 6. Removed: `Report` the result as an event.
//! 7. Reported and acknowledged by the portal (a `Renew` left it out): `Forget` it.
//!
//! Invariants: at most one action per attempt per call (the next step; the executor marks
//! work in flight, so a step is never issued twice); a container is stopped at most once;
//! nothing is removed before its result is recorded; nothing is forgotten before it is
//! reported and acknowledged.

use crate::runtime::AssignedGpu;
use commons_proto::{Attempt, AttemptReport, AttemptState, JobId, JobSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// An attempt's identity: every message about a job names its attempt.
pub type Key = (JobId, Attempt);

/// Grace given to a container whose time limit or lease ran out.
pub const ENFORCE_GRACE: Duration = Duration::from_secs(10);
/// The reason a container stopped by its time limit reports.
pub const REASON_TIME_LIMIT: &str = "time limit reached";
/// The reason an attempt stopped by its lease reports.
pub const REASON_LEASE: &str = "lease expired: the server lost contact with the portal";

/// What to run for an attempt the portal started here.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub spec: JobSpec,
    pub gpus: Vec<AssignedGpu>,
}

/// The portal's order to stop an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOrder {
    /// Time between SIGTERM and SIGKILL, for the job to write its checkpoint.
    pub grace: Duration,
    /// Why, in words for the job's owner.
    pub reason: String,
}

/// What the portal wants of one attempt on this server.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub job: JobId,
    pub attempt: Attempt,
    /// What to run; `None` for an attempt adopted from a container found after a restart.
    pub launch: Option<Arc<Launch>>,
    /// It may run until then; the portal extends this with `Renew`.
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
    Found { container: String },
    /// Create and start are under way.
    Creating,
    /// It could not be created or started: no container exists.
    NotCreated { error: String },
    /// It runs (as far as we know) and a watcher waits for its end.
    Running { container: String },
    /// Its main process ended with this code.
    Ended { container: String, exit_code: i64 },
    /// The runtime lost track of it (waiting for it failed).
    Lost { container: String, error: String },
    /// Removal is under way.
    Removing { container: String },
    /// No container is left.
    Removed,
}

/// How an attempt ended, as the portal is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResult {
    pub state: AttemptState,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
}

/// What this server has of one attempt: its container and, once recorded, its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerObs {
    pub job: JobId,
    pub attempt: Attempt,
    pub phase: Phase,
    /// When its time limit is reached; `None` when none is known (an adopted container
    /// without the label).
    pub deadline: Option<Duration>,
    /// Why we asked the container to stop, once we did.
    pub stopping: Option<String>,
    /// How it ended, once recorded; from then on it is in every heartbeat.
    pub result: Option<AttemptResult>,
    /// The result was sent as an `AttemptEvent`.
    pub reported: bool,
}

impl ContainerObs {
    /// A fresh observation in `phase`, with nothing stopped, recorded or reported.
    pub fn new(job: JobId, attempt: Attempt, phase: Phase, deadline: Option<Duration>) -> Self {
        Self {
            job,
            attempt,
            phase,
            deadline,
            stopping: None,
            result: None,
            reported: false,
        }
    }

    /// What the portal is told about this attempt in `Hello` and heartbeats.
    pub fn report(&self) -> AttemptReport {
        let (state, exit_code, reason) = match (&self.result, &self.phase) {
            (Some(r), _) => (r.state, r.exit_code, r.reason.clone()),
            (None, Phase::Creating | Phase::NotCreated { .. }) => {
                (AttemptState::Starting, None, None)
            }
            (None, _) => (AttemptState::Running, None, None),
        };
        AttemptReport {
            job: self.job,
            attempt: self.attempt,
            state,
            exit_code,
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
    /// Follow a container found after a restart (and take on its attempt if the portal
    /// has not named it yet).
    Adopt {
        job: JobId,
        attempt: Attempt,
        container: String,
    },
    /// SIGTERM now, SIGKILL after `grace`.
    Stop {
        job: JobId,
        attempt: Attempt,
        container: String,
        grace: Duration,
        reason: String,
    },
    /// Keep how the attempt ended, for heartbeats until the portal acknowledges it.
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
    /// Send the recorded result as an `AttemptEvent`.
    Report {
        job: JobId,
        attempt: Attempt,
        result: AttemptResult,
    },
    /// Drop every trace of an acknowledged attempt.
    Forget { job: JobId, attempt: Attempt },
}

impl Action {
    pub fn key(&self) -> Key {
        match self {
            Action::Start { job, attempt, .. }
            | Action::Adopt { job, attempt, .. }
            | Action::Stop { job, attempt, .. }
            | Action::Record { job, attempt, .. }
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
    let never = |reason: &str| Action::Record {
        job,
        attempt,
        result: AttemptResult {
            state: AttemptState::Stopped,
            exit_code: None,
            reason: Some(reason.to_string()),
        },
    };
    if let Some(order) = &w.stop {
        return Some(never(&order.reason));
    }
    if now > w.lease_until {
        return Some(never(REASON_LEASE));
    }
    match &w.launch {
        Some(launch) => Some(Action::Start {
            job,
            attempt,
            launch: launch.clone(),
            deadline: now.saturating_add(Duration::from_secs(launch.spec.time_limit_s)),
        }),
        // Adopted, but its container is not known here: nothing can bring it back.
        None => Some(Action::Record {
            job,
            attempt,
            result: AttemptResult {
                state: AttemptState::Failed,
                exit_code: None,
                reason: Some("lost the container".into()),
            },
        }),
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
    let Some(result) = &h.result else {
        return match &h.phase {
            Phase::Found { container } => Some(Action::Adopt {
                job,
                attempt,
                container: container.clone(),
            }),
            Phase::Creating | Phase::Removing { .. } => None,
            Phase::Running { container } => {
                if h.stopping.is_some() {
                    return None;
                }
                let (grace, reason) = why_stop(want, h.deadline, now)?;
                Some(Action::Stop {
                    job,
                    attempt,
                    container: container.clone(),
                    grace,
                    reason,
                })
            }
            Phase::Ended { exit_code, .. } => record(match &h.stopping {
                Some(reason) => stopped(Some(*exit_code), reason),
                None => AttemptResult {
                    state: AttemptState::Exited,
                    exit_code: Some(*exit_code),
                    reason: None,
                },
            }),
            Phase::Lost { error, .. } => record(match &h.stopping {
                Some(reason) => stopped(None, reason),
                None => failed(format!("lost the container: {error}")),
            }),
            Phase::NotCreated { error } => record(failed(error.clone())),
            Phase::Removed => record(failed("lost the container".into())),
        };
    };
    match &h.phase {
        Phase::Ended { container, .. }
        | Phase::Lost { container, .. }
        | Phase::Running { container }
        | Phase::Found { container } => Some(Action::Remove {
            job,
            attempt,
            container: container.clone(),
        }),
        Phase::Creating | Phase::Removing { .. } => None,
        Phase::Removed | Phase::NotCreated { .. } if !h.reported => Some(Action::Report {
            job,
            attempt,
            result: result.clone(),
        }),
        Phase::Removed | Phase::NotCreated { .. } => want
            .is_none_or(|w| w.acknowledged)
            .then_some(Action::Forget { job, attempt }),
    }
}

/// Why a running container must stop now, if it must: the portal's order first, then the
/// lease, then the time limit.
fn why_stop(
    want: Option<&Assignment>,
    deadline: Option<Duration>,
    now: Duration,
) -> Option<(Duration, String)> {
    if let Some(w) = want {
        if let Some(order) = &w.stop {
            return Some((order.grace, order.reason.clone()));
        }
        if now > w.lease_until {
            return Some((ENFORCE_GRACE, REASON_LEASE.into()));
        }
    }
    match deadline {
        Some(d) if now >= d => Some((ENFORCE_GRACE, REASON_TIME_LIMIT.into())),
        _ => None,
    }
}

fn stopped(exit_code: Option<i64>, reason: &str) -> AttemptResult {
    AttemptResult {
        state: AttemptState::Stopped,
        exit_code,
        reason: Some(reason.to_string()),
    }
}

fn failed(reason: String) -> AttemptResult {
    AttemptResult {
        state: AttemptState::Failed,
        exit_code: None,
        reason: Some(reason),
    }
}
