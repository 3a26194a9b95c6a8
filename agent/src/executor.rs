//! Runs attempts: keeps the portal's wishes and what the runtime showed side by side, asks
//! [`reconcile`] what to do, and does it through a [`ContainerRuntime`].
//!
//! The executor's table is the agent's truth about what runs. It holds, per attempt, the
//! [`Assignment`] (from `Start`, `Stop` and `Renew`, or from adopting a container) and the
//! [`ContainerObs`] (from the runtime). Every change to either, and a one-second tick for
//! time limits and leases, runs a reconcile pass ([`Executor::step`]):
//! 1. Snapshot the table and call [`reconcile`] with the time.
//! 2. Apply each action: bookkeeping (`Record`, `Report`, `Forget`, `Adopt`'s table entry)
//!    at once, under the table's lock; runtime calls (`Start`, `Stop`, `Remove`) are marked
//!    in flight in the table, then spawned, and each reports back by changing the table and
//!    running another pass.
//! 3. Repeat until a pass returns nothing (bounded, in case of a bug).
//!
//! Invariants:
//! - Final states stay in the table (and so in every heartbeat) until the portal
//!   acknowledges them by leaving them out of a `Renew`: a report sent into a dying
//!   connection is sent again.
//! - One container per attempt, followed by exactly one watcher that forwards its logs and
//!   waits for its end; the logs are drained before the end is recorded, so the final
//!   event comes after the last output.
//! - Background tasks hold the table weakly: once the last `Executor` handle is dropped
//!   (the agent stopped), they touch nothing, and the containers are left for the next
//!   agent to adopt.

use crate::gpu::{GpuError, GpuSource};
use crate::reconcile::{
    reconcile, Action, Assignment, ContainerObs, Key, Launch, Phase, StopOrder, REASON_LEASE,
};
use crate::runtime::{AssignedGpu, ContainerRuntime, DockerRuntime, RuntimeError};
use commons_proto::{AgentMsg, Attempt, AttemptReport, AttemptState, GpuStat, JobId, JobSpec};
use futures_util::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// Logs are sent in chunks of at most this many bytes, or every flush interval.
const LOG_CHUNK: usize = 16 * 1024;
const LOG_FLUSH: Duration = Duration::from_millis(300);
/// How long the end of a container's log stream may take after the container ended.
const LOG_DRAIN: Duration = Duration::from_secs(5);
/// How often time limits and leases are checked without any other reason to look.
const TICK: Duration = Duration::from_secs(1);
/// Passes per step at most; each pass moves every attempt one step along.
const MAX_PASSES: usize = 32;
/// Lease of an adopted attempt until the portal renews it, unless `adopt` says otherwise.
const DEFAULT_ADOPT_LEASE: Duration = Duration::from_secs(120);

/// The agent's wall clock, in Unix seconds.
pub fn unix_now() -> i64 {
    i64::try_from(clock().as_secs()).unwrap_or(i64::MAX)
}

/// The agent's wall clock, as a duration since the Unix epoch.
fn clock() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Whole seconds from the protocol (Unix time, or a span) as a reconcile duration; a
/// negative number is zero.
fn secs(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

#[derive(Default)]
struct Table {
    want: BTreeMap<Key, Assignment>,
    have: BTreeMap<Key, ContainerObs>,
    adopt_lease: Option<Duration>,
}

struct Inner<R> {
    runtime: Arc<R>,
    events: mpsc::UnboundedSender<AgentMsg>,
    table: Mutex<Table>,
}

/// A handle on the attempt table; clones share it.
pub struct Executor<R = DockerRuntime> {
    inner: Arc<Inner<R>>,
}

impl<R> Clone for Executor<R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<R: ContainerRuntime> Executor<R> {
    /// Starts the executor's tick; call it inside a Tokio runtime.
    pub fn new(runtime: R, events: mpsc::UnboundedSender<AgentMsg>) -> Self {
        let inner = Arc::new(Inner {
            runtime: Arc::new(runtime),
            events,
            table: Mutex::default(),
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                Executor { inner }.step(clock());
            }
        });
        Self { inner }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere while holding the lock leaves the table as it was between two
        // actions, which is consistent; keep serving rather than cascade the panic.
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn weak(&self) -> Weak<Inner<R>> {
        Arc::downgrade(&self.inner)
    }

    /// Re-adopts the containers an earlier run of the agent left: running ones are followed
    /// again, stopped ones are reported with their exit code and removed. Adopted attempts
    /// hold a lease of `lease_ttl_s` until the portal renews them.
    pub async fn adopt(&self, lease_ttl_s: i64) -> Result<(), RuntimeError> {
        let found = self.inner.runtime.list().await?;
        {
            let mut t = self.table();
            t.adopt_lease = Some(secs(lease_ttl_s));
            for c in found {
                let key = (c.job, c.attempt);
                if t.have.contains_key(&key) {
                    continue;
                }
                let phase = Phase::Found { container: c.id };
                t.have
                    .insert(key, ContainerObs::new(c.job, c.attempt, phase, c.deadline));
            }
        }
        self.step(clock());
        Ok(())
    }

    /// Starts an attempt unless it is already known (a duplicate `Start` is harmless).
    pub fn start(
        &self,
        job: JobId,
        attempt: Attempt,
        spec: JobSpec,
        gpus: Vec<AssignedGpu>,
        lease_until: i64,
    ) {
        {
            let mut t = self.table();
            let key = (job, attempt);
            if t.want.contains_key(&key) || t.have.contains_key(&key) {
                return;
            }
            t.want.insert(
                key,
                Assignment {
                    job,
                    attempt,
                    launch: Some(Arc::new(Launch { spec, gpus })),
                    lease_until: secs(lease_until),
                    stop: None,
                    acknowledged: false,
                },
            );
        }
        self.step(clock());
    }

    /// Asks an attempt to stop (the first order wins). Returns false when the attempt is
    /// not known here.
    pub fn stop(&self, job: JobId, attempt: Attempt, grace_s: u64, reason: String) -> bool {
        {
            let mut t = self.table();
            let Some(w) = t.want.get_mut(&(job, attempt)) else {
                return false;
            };
            if w.stop.is_none() {
                w.stop = Some(StopOrder {
                    grace: Duration::from_secs(grace_s),
                    reason,
                });
            }
        }
        self.step(clock());
        true
    }

    /// Tells the portal that an attempt it asked about is not running here.
    pub fn report_unknown(&self, job: JobId, attempt: Attempt) {
        let _ = self.inner.events.send(AgentMsg::AttemptEvent {
            job,
            attempt,
            state: AttemptState::Stopped,
            exit_code: None,
            reason: Some("not running on this server".into()),
        });
    }

    /// Extends the listed attempts' leases; an attempt left out whose result is already
    /// recorded is acknowledged (the portal has recorded how it ended) and forgotten.
    pub fn renew(&self, lease_until: i64, attempts: &[(JobId, Attempt)]) {
        let listed: BTreeSet<Key> = attempts.iter().copied().collect();
        let lease_until = secs(lease_until);
        {
            let mut t = self.table();
            let Table { want, have, .. } = &mut *t;
            for (key, w) in want.iter_mut() {
                if listed.contains(key) {
                    w.lease_until = w.lease_until.max(lease_until);
                } else if have.get(key).is_some_and(|h| h.result.is_some()) {
                    w.acknowledged = true;
                }
            }
        }
        self.step(clock());
    }

    /// Runs a pass as of `now` (Unix seconds): stops every live attempt whose lease ran out
    /// (the portal may already have given its GPUs to another attempt, and one job must
    /// never run twice at once) or whose time limit passed. The executor's own tick does
    /// this every second.
    pub fn expire_leases(&self, now: i64) {
        self.step(secs(now));
    }

    /// What the portal is told in `Hello` and every heartbeat, in (job, attempt) order.
    pub fn reports(&self) -> Vec<AttemptReport> {
        let t = self.table();
        let keys: BTreeSet<Key> = t.want.keys().chain(t.have.keys()).copied().collect();
        keys.into_iter()
            .map(|key| match t.have.get(&key) {
                Some(h) => h.report(),
                None => AttemptReport {
                    job: key.0,
                    attempt: key.1,
                    state: AttemptState::Starting,
                    exit_code: None,
                    reason: None,
                },
            })
            .collect()
    }

    /// Host pids inside our containers.
    pub async fn our_pids(&self) -> BTreeSet<u32> {
        let ids: Vec<String> = self
            .table()
            .have
            .values()
            .filter_map(|h| match &h.phase {
                Phase::Found { container }
                | Phase::Running { container }
                | Phase::Ended { container, .. }
                | Phase::Lost { container, .. }
                | Phase::Removing { container } => Some(container.clone()),
                Phase::Creating | Phase::NotCreated { .. } | Phase::Removed => None,
            })
            .collect();
        let mut pids = BTreeSet::new();
        for id in ids {
            pids.extend(self.inner.runtime.pids(&id).await);
        }
        pids
    }

    /// The GPUs' live numbers, with a GPU process outside our containers counted as the
    /// owner's local use.
    pub async fn gpu_stats(&self, gpus: &dyn GpuSource) -> Result<Vec<GpuStat>, GpuError> {
        let pids = self.our_pids().await;
        gpus.stats(&pids)
    }

    /// Reconciles until nothing is left to do now; see the module's numbered list.
    pub fn step(&self, now: Duration) {
        let mut t = self.table();
        for _ in 0..MAX_PASSES {
            let want: Vec<Assignment> = t.want.values().cloned().collect();
            let have: Vec<ContainerObs> = t.have.values().cloned().collect();
            let actions = reconcile(&want, &have, now);
            if actions.is_empty() {
                return;
            }
            for action in actions {
                self.apply(&mut t, action, now);
            }
        }
        tracing::error!("reconcile did not settle in {MAX_PASSES} passes; continuing next tick");
    }

    fn apply(&self, t: &mut Table, action: Action, now: Duration) {
        let key = action.key();
        let (job, attempt) = key;
        match action {
            Action::Start {
                launch, deadline, ..
            } => {
                tracing::info!(job, attempt, image = %launch.spec.image, "starting");
                t.have.insert(
                    key,
                    ContainerObs::new(job, attempt, Phase::Creating, Some(deadline)),
                );
                tokio::spawn(start_task(
                    self.weak(),
                    self.inner.runtime.clone(),
                    key,
                    launch,
                    deadline,
                ));
            }
            Action::Adopt { container, .. } => {
                tracing::info!(job, attempt, "re-adopting container {container}");
                let lease = t.adopt_lease.unwrap_or(DEFAULT_ADOPT_LEASE);
                t.want.entry(key).or_insert_with(|| Assignment {
                    job,
                    attempt,
                    launch: None,
                    lease_until: now.saturating_add(lease),
                    stop: None,
                    acknowledged: false,
                });
                if let Some(h) = t.have.get_mut(&key) {
                    h.phase = Phase::Running {
                        container: container.clone(),
                    };
                }
                // Logs from now on: what it printed before was already sent by the last run.
                self.follow(key, container, Some(now));
            }
            Action::Stop {
                container,
                grace,
                reason,
                ..
            } => {
                if reason == REASON_LEASE {
                    tracing::warn!(job, attempt, "lease expired, stopping");
                } else {
                    tracing::info!(job, attempt, %reason, "stopping");
                }
                if let Some(h) = t.have.get_mut(&key) {
                    h.stopping = Some(reason);
                }
                let runtime = self.inner.runtime.clone();
                tokio::spawn(async move {
                    if let Err(e) = runtime.stop(&container, grace).await {
                        tracing::warn!(job, attempt, "stop {container}: {e}");
                    }
                });
            }
            Action::Record { result, .. } => {
                let h = t
                    .have
                    .entry(key)
                    .or_insert_with(|| ContainerObs::new(job, attempt, Phase::Removed, None));
                h.result = Some(result);
            }
            Action::Remove { container, .. } => {
                if let Some(h) = t.have.get_mut(&key) {
                    h.phase = Phase::Removing {
                        container: container.clone(),
                    };
                }
                tokio::spawn(remove_task(
                    self.weak(),
                    self.inner.runtime.clone(),
                    key,
                    container,
                ));
            }
            Action::Report { result, .. } => {
                let _ = self.inner.events.send(AgentMsg::AttemptEvent {
                    job,
                    attempt,
                    state: result.state,
                    exit_code: result.exit_code,
                    reason: result.reason,
                });
                if let Some(h) = t.have.get_mut(&key) {
                    h.reported = true;
                }
            }
            Action::Forget { .. } => {
                t.want.remove(&key);
                t.have.remove(&key);
            }
        }
    }

    /// Spawns the one watcher of a running container: it forwards the logs, waits for the
    /// end, drains the logs, and records the end.
    fn follow(&self, key: Key, container: String, logs_since: Option<Duration>) {
        let weak = self.weak();
        let runtime = self.inner.runtime.clone();
        let events = self.inner.events.clone();
        tokio::spawn(async move {
            let (job, attempt) = key;
            let logs = tokio::spawn(forward_logs(
                runtime.logs(&container, logs_since),
                events,
                job,
                attempt,
            ));
            let end = runtime.wait(&container).await;
            // The log stream ends with the container; give it a moment to drain.
            let _ = tokio::time::timeout(LOG_DRAIN, logs).await;
            let Some(exec) = upgrade(&weak) else { return };
            {
                let mut t = exec.table();
                let Some(h) = t.have.get_mut(&key) else {
                    return;
                };
                if !matches!(&h.phase, Phase::Running { container: c } if *c == container) {
                    return;
                }
                h.phase = match end {
                    Ok(exit_code) => Phase::Ended {
                        container,
                        exit_code,
                    },
                    Err(e) => Phase::Lost {
                        container,
                        error: e.to_string(),
                    },
                };
            }
            exec.step(clock());
        });
    }
}

fn upgrade<R>(weak: &Weak<Inner<R>>) -> Option<Executor<R>> {
    weak.upgrade().map(|inner| Executor { inner })
}

/// Creates and starts a container, then records it running (and follows it) or failed.
async fn start_task<R: ContainerRuntime>(
    weak: Weak<Inner<R>>,
    runtime: Arc<R>,
    key: Key,
    launch: Arc<Launch>,
    deadline: Duration,
) {
    let (job, attempt) = key;
    let created = runtime
        .create_and_start(job, attempt, &launch.spec, &launch.gpus, deadline)
        .await;
    // Without an executor the container (if any) is left for the next agent to adopt.
    let Some(exec) = upgrade(&weak) else { return };
    {
        let mut t = exec.table();
        let Some(h) = t.have.get_mut(&key) else {
            return;
        };
        match created {
            Err(e) => {
                tracing::warn!(job, attempt, "cannot start: {e}");
                h.phase = Phase::NotCreated {
                    error: e.to_string(),
                };
            }
            Ok(id) => {
                h.phase = Phase::Running {
                    container: id.clone(),
                };
                let _ = exec.inner.events.send(AgentMsg::AttemptEvent {
                    job,
                    attempt,
                    state: AttemptState::Running,
                    exit_code: None,
                    reason: None,
                });
                exec.follow(key, id, None);
            }
        }
    }
    exec.step(clock());
}

/// Removes a recorded attempt's container; a failure is logged, and the attempt moves on
/// (its result is what matters to the portal).
async fn remove_task<R: ContainerRuntime>(
    weak: Weak<Inner<R>>,
    runtime: Arc<R>,
    key: Key,
    container: String,
) {
    let (job, attempt) = key;
    if let Err(e) = runtime.remove(&container).await {
        tracing::warn!(job, attempt, "cannot remove container {container}: {e}");
    }
    let Some(exec) = upgrade(&weak) else { return };
    if let Some(h) = exec.table().have.get_mut(&key) {
        h.phase = Phase::Removed;
    }
    exec.step(clock());
}

/// Sends a container's output as `Logs` messages, batched by size and time.
async fn forward_logs(
    stream: impl futures_util::Stream<Item = String>,
    events: mpsc::UnboundedSender<AgentMsg>,
    job: JobId,
    attempt: Attempt,
) {
    let mut stream = std::pin::pin!(stream);
    let mut buf = String::new();
    let flush = |buf: &mut String| {
        if !buf.is_empty() {
            let _ = events.send(AgentMsg::Logs {
                job,
                attempt,
                chunk: std::mem::take(buf),
            });
        }
    };
    loop {
        match tokio::time::timeout(LOG_FLUSH, stream.next()).await {
            Ok(Some(s)) => {
                buf.push_str(&s);
                if buf.len() >= LOG_CHUNK {
                    flush(&mut buf);
                }
            }
            Ok(None) => break,
            Err(_) => flush(&mut buf),
        }
    }
    flush(&mut buf);
}
