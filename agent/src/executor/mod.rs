//! Runs attempts: keeps the portal's wishes and what the runtime showed side by side, asks
//! [`reconcile`] what to do, and does it through a [`ContainerRuntime`].
//!
//! The executor's table is the agent's truth about what runs. It holds, per attempt, the
//! [`Assignment`] (from `Start`, `Stop` and `Renew`, or restored from disk) and the
//! [`ContainerObs`] (from the runtime). Every change to either, and a one-second tick for
//! time limits and leases, runs a reconcile pass ([`Executor::step`]):
//! 1. Snapshot the table and call [`reconcile`] with the boot-clock time.
//! 2. Apply each action (`apply.rs`): bookkeeping (`Record`, `Report`, `Forget`, `Adopt`)
//!    at once, under the table's lock; runtime calls (`Start`, `Stop`, `Remove`) and
//!    checkpoint journeys (`Snapshot`, `Upload`, in `checkpoints.rs`) are marked in flight
//!    in the table, then spawned, and each reports back by changing the table and running
//!    another pass.
//! 3. Repeat until a pass returns nothing, or the same actions as the last one (a write
//!    that keeps failing is retried on the next tick, not in a busy loop).
//!
//! The executor also numbers the agent's `Hello`s and heartbeats ([`Executor::hello`],
//! [`Executor::heartbeat`]) and remembers when it sent each, because a lease counts from
//! there (`clock::SentLog`).
//!
//! Invariants:
//! - A `Start` or `Renew` whose lease this process did not grant (another session, an
//!   unknown `seq`) extends nothing; such a `Start` is not started.
//! - Leases and time limits are enforced by the tick whether or not the portal is
//!   connected, and by each attempt's guard process (`guard`), which the tick starts
//!   again should it die ([`Executor::keep_guards`]), while the agent is down:
//!   `lease.json` is rewritten at start, at every renewal, when a `Renew` extends a time
//!   limit, and when a stop begins.
//! - A result is in `result.json` before its container is removed, stays in every
//!   heartbeat (and in the `Hello` of a restarted agent) until the portal acknowledges it
//!   by leaving it out of a `Renew`; then the attempt's directory is deleted.
//! - One container per attempt, followed by exactly one watcher (`watch.rs`) that forwards
//!   its logs and waits for its end; a failed wait is not an end (the container is
//!   inspected again); the logs are drained before the end is recorded.
//! - Checkpoints (`checkpoints.rs`): a `Start` with `resume` restores the job's latest
//!   checkpoint before the container is created; a snapshot in flight is cancelled when
//!   the attempt's stop begins or its end is recorded; a stopped attempt's final state is
//!   sent only after its upload is over (see `reconcile`).
//! - Disks (`volumes.rs`): an attempt's volume, with its cap, is made before its
//!   checkpoint is restored or its container created, and watched while it runs; a
//!   guest's `Start` under the free-space floor is never started (its result says why).
//! - Background tasks hold the table weakly: once the last `Executor` handle is dropped
//!   (the agent stopped), they touch nothing, and the containers are left to their guards
//!   and to the next agent, which re-adopts them with the deadlines on disk.

mod active;
mod apply;
mod checkpoints;
mod datasets;
mod inputs;
mod outputs;
mod restore;
mod shares;
mod volumes;
mod watch;

pub use active::ActiveAttempt;

use crate::checkpoint::CheckpointClient;
use crate::clock::{self, SentLog};
use crate::disk::DiskPolicy;
use crate::outbox::Outbox;
use crate::reconcile::{reconcile, Assignment, ContainerObs, Key, Launch, Phase, StopOrder, Why};
use crate::runtime::{AssignedGpu, ContainerRuntime, DockerRuntime, RuntimeError};
use crate::store::Store;
use commons_proto::{
    AgentMsg, Attempt, AttemptReport, AttemptState, GpuInfo, GpuStat, JobId, JobSpec, Lease,
    StopReason, TimeLimit, PROTOCOL_VERSION,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

/// How often time limits and leases are checked without any other reason to look.
const TICK: Duration = Duration::from_secs(1);
/// Passes per step at most; each pass moves every attempt one step along.
const MAX_PASSES: usize = 32;

struct Table {
    want: BTreeMap<Key, Assignment>,
    have: BTreeMap<Key, ContainerObs>,
    /// The end of each followed attempt's output, for `result.json`.
    tails: BTreeMap<Key, Arc<Mutex<String>>>,
    /// Cancels the snapshot in flight of each attempt that has one.
    cancels: BTreeMap<Key, Arc<AtomicBool>>,
    /// Each attempt's volume (`volumes.rs`).
    volumes: BTreeMap<Key, volumes::Volume>,
    /// What each admitted attempt holds of the GPUs (`shares.rs`).
    holds: BTreeMap<Key, crate::share::Hold>,
    /// Each running share attempt's GPU memory in MiB, as the share watch last read it.
    used: BTreeMap<Key, u64>,
    sent: SentLog,
}

struct Inner<R> {
    runtime: Arc<R>,
    events: Outbox,
    store: Store,
    /// The portal's checkpoint store; `None`: checkpoints stay on this server.
    checkpoints: Option<CheckpointClient>,
    /// Jobs' disk caps and the free-space floor (`disk`).
    disk: DiskPolicy,
    /// Exported datasets and the dataset cache, once the session sets them.
    datasets: std::sync::OnceLock<Arc<crate::datasets::Here>>,
    /// How shares of a GPU are taken, once the session sets it (`shares.rs`); unset: none.
    shares: std::sync::OnceLock<shares::Shares>,
    boot_id: String,
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

/// What became of a `Start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Taken on (it starts, or records why it never will).
    Accepted,
    /// Already known here: a duplicate `Start` is harmless.
    Duplicate,
    /// Its lease names another agent process or a message this one does not know: it
    /// grants nothing, so the attempt is not started (the portal sends it again).
    LeaseUnknown,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves the data as it was between two
    // actions, which is consistent; keep serving rather than cascade the panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn upgrade<R>(weak: &Weak<Inner<R>>) -> Option<Executor<R>> {
    weak.upgrade().map(|inner| Executor { inner })
}

impl<R: ContainerRuntime> Executor<R> {
    /// An executor without a checkpoint store (see [`Executor::with_checkpoints`]).
    pub fn new(runtime: R, events: Outbox, store: Store) -> Self {
        Self::with_checkpoints(runtime, events, store, None)
    }

    /// An executor with the default disk policy (see [`Executor::with_disk`]).
    pub fn with_checkpoints(
        runtime: R,
        events: Outbox,
        store: Store,
        checkpoints: Option<CheckpointClient>,
    ) -> Self {
        Self::with_disk(runtime, events, store, checkpoints, DiskPolicy::default())
    }

    /// Starts the executor's tick and its watch over jobs' volumes; call it inside a
    /// Tokio runtime. Attempts' files live in `store`, their checkpoints travel through
    /// `checkpoints`, their disks are capped as `disk` says (settled: see
    /// [`DiskPolicy::settled`]); the agent process gets a fresh random session.
    pub fn with_disk(
        runtime: R,
        events: Outbox,
        store: Store,
        checkpoints: Option<CheckpointClient>,
        disk: DiskPolicy,
    ) -> Self {
        let inner = Arc::new(Inner {
            runtime: Arc::new(runtime),
            events,
            store,
            checkpoints,
            disk,
            datasets: std::sync::OnceLock::new(),
            shares: std::sync::OnceLock::new(),
            boot_id: clock::boot_id(),
            table: Mutex::new(Table {
                want: BTreeMap::new(),
                have: BTreeMap::new(),
                tails: BTreeMap::new(),
                cancels: BTreeMap::new(),
                volumes: BTreeMap::new(),
                holds: BTreeMap::new(),
                used: BTreeMap::new(),
                sent: SentLog::new(rand::random()),
            }),
        });
        volumes::spawn_watch(Arc::downgrade(&inner));
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(exec) = upgrade(&weak) else { break };
                exec.step(clock::now());
                exec.keep_guards();
            }
        });
        Self { inner }
    }

    /// Gives the executor this server's exports and dataset cache (once; later calls
    /// change nothing).
    pub fn set_datasets(&self, here: Arc<crate::datasets::Here>) {
        let _ = self.inner.datasets.set(here);
    }

    /// What this server offers for datasets, once set.
    pub fn datasets_offer(&self) -> Option<commons_proto::NodeDatasets> {
        self.inner.datasets.get().map(|h| h.offer())
    }

    /// The container runtime the executor applies its actions through (the SSH relays
    /// start their processes with it too).
    pub fn runtime(&self) -> Arc<R> {
        self.inner.runtime.clone()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.inner.table)
    }

    fn weak(&self) -> Weak<Inner<R>> {
        Arc::downgrade(&self.inner)
    }

    /// This agent process's session, which its leases name.
    pub fn session(&self) -> u64 {
        self.table().sent.session()
    }

    /// The `Hello` that opens a connection, numbered and timed (leases may count from it
    /// for as long as the connection lasts), with every attempt known here.
    pub fn hello(&self, agent_version: &str, gpus: Vec<GpuInfo>) -> AgentMsg {
        let mut t = self.table();
        let seq = t.sent.stamp(clock::now(), true);
        AgentMsg::Hello {
            agent_version: agent_version.to_string(),
            protocol: PROTOCOL_VERSION,
            session: t.sent.session(),
            seq,
            gpus,
            attempts: reports_of(&t),
            capacity: None,
            disk: None,
            datasets: None,
            share_mode: self.share_mode(),
        }
    }

    /// A heartbeat, numbered and timed, with every attempt known here.
    pub fn heartbeat(&self, gpu_stats: Vec<GpuStat>) -> AgentMsg {
        let mut t = self.table();
        let seq = t.sent.stamp(clock::now(), false);
        AgentMsg::Heartbeat {
            seq,
            gpu_stats,
            attempts: reports_of(&t),
            capacity: None,
            disk: None,
            datasets: None,
        }
    }

    /// Takes back what an earlier run of the agent left: containers found by label and
    /// attempts' directories. Deadlines come from `lease.json` (a container without one,
    /// or with one from another boot, has an expired lease and is stopped); stops under way
    /// and the guard's stops are restored; results not yet acknowledged are reported again.
    /// Their volumes are taken back (mounted again after a reboot); the volumes of
    /// directories with nothing to restore are released with them.
    pub async fn adopt(&self) -> Result<(), RuntimeError> {
        let found = self.inner.runtime.list().await?;
        let disk = self.inner.store.load_all();
        let holds = shares::holds_on_disk(&disk);
        let restored = restore::restore(found, disk, &self.inner.boot_id);
        for key in &restored.strays {
            if let Err(e) = self.inner.store.remove(*key) {
                tracing::warn!("cannot remove the empty attempt dir of {key:?}: {e}");
            }
        }
        let keys: Vec<Key> = restored
            .attempts
            .iter()
            .map(|(w, _)| (w.job, w.attempt))
            .collect();
        self.reattach(&keys);
        {
            let mut t = self.table();
            for (want, have) in restored.attempts {
                let key = (want.job, want.attempt);
                if t.want.contains_key(&key) || t.have.contains_key(&key) {
                    continue;
                }
                t.want.insert(key, want);
                t.have.insert(key, have);
                if let Some(h) = holds.get(&key) {
                    t.holds.insert(key, h.clone());
                }
            }
        }
        self.step(clock::now());
        Ok(())
    }

    /// Starts an attempt from an empty `/checkpoint` (see [`Executor::start_with`]).
    pub fn start(
        &self,
        job: JobId,
        attempt: Attempt,
        spec: JobSpec,
        gpus: Vec<AssignedGpu>,
        lease: Lease,
    ) -> Admission {
        let launch = Launch {
            spec,
            gpus,
            resume: false,
        };
        self.start_with(job, attempt, launch, lease)
    }

    /// Starts an attempt unless it is already known (a duplicate `Start` is harmless) or
    /// its lease grants nothing; `launch.resume` restores the job's checkpoint first. A
    /// guest that comes while the server is under its free-space floor is never started:
    /// its result says why, and the portal queues it again. Nor is an attempt whose GPUs
    /// or share do not fit beside what the attempts here hold (`shares.rs`): it fails,
    /// saying why.
    pub fn start_with(
        &self,
        job: JobId,
        attempt: Attempt,
        launch: Launch,
        lease: Lease,
    ) -> Admission {
        {
            let mut t = self.table();
            let key = (job, attempt);
            if t.want.contains_key(&key) || t.have.contains_key(&key) {
                return Admission::Duplicate;
            }
            let Some(lease_until) = t.sent.deadline(&lease) else {
                return Admission::LeaseUnknown;
            };
            let stop = self
                .share_refusal(&t, &launch)
                .or_else(|| self.floor_refusal(&launch.spec));
            if stop.is_none() {
                self.keep_hold(&mut t, key, &launch);
            }
            t.want.insert(
                key,
                Assignment {
                    job,
                    attempt,
                    launch: Some(Arc::new(launch)),
                    lease_until,
                    stop,
                    acknowledged: false,
                },
            );
        }
        self.step(clock::now());
        Admission::Accepted
    }

    /// Asks an attempt to stop with the portal's grace and reason (the first order wins).
    /// Returns false when the attempt is not known here.
    pub fn stop(
        &self,
        job: JobId,
        attempt: Attempt,
        grace_s: u64,
        reason: StopReason,
        detail: Option<&str>,
    ) -> bool {
        let why = Why::ordered(reason, detail);
        self.stop_with((job, attempt), Duration::from_secs(grace_s), why)
    }

    /// Asks an attempt to stop with this grace and reason, in the agent's own words (the
    /// first order wins). Returns false when the attempt is not known here.
    fn stop_with(&self, key: Key, grace: Duration, why: Why) -> bool {
        {
            let mut t = self.table();
            let Some(w) = t.want.get_mut(&key) else {
                return false;
            };
            if w.stop.is_none() {
                w.stop = Some(StopOrder { grace, why });
            }
        }
        self.step(clock::now());
        true
    }

    /// Tells the portal that an attempt it asked to stop is not running here.
    pub fn report_unknown(&self, job: JobId, attempt: Attempt, reason: StopReason) {
        self.inner.events.send(AgentMsg::AttemptEvent {
            job,
            attempt,
            state: AttemptState::Stopped,
            exit_code: None,
            stop: Some(reason),
            reason: Some("not running on this server".into()),
        });
    }

    /// Extends the listed attempts' leases (when this process granted `lease`), rewriting
    /// their `lease.json`; an attempt left out whose result is already recorded is
    /// acknowledged (the portal has recorded how it ended), and is forgotten.
    pub fn renew(&self, lease: Lease, attempts: &[(JobId, Attempt)]) {
        let listed: BTreeSet<Key> = attempts.iter().copied().collect();
        {
            let mut t = self.table();
            let until = t.sent.deadline(&lease);
            if until.is_none() {
                tracing::warn!(
                    session = lease.session,
                    seq = lease.seq,
                    "a Renew whose lease this agent did not grant (another session or an \
                     unknown message): it extends nothing"
                );
            }
            let mut extended = Vec::new();
            let Table { want, have, .. } = &mut *t;
            for (key, w) in want.iter_mut() {
                if listed.contains(key) {
                    if let Some(u) = until.filter(|u| *u > w.lease_until) {
                        w.lease_until = u;
                        extended.push(*key);
                    }
                } else if have.get(key).is_some_and(|h| h.result.is_some()) {
                    w.acknowledged = true;
                }
            }
            for key in extended {
                self.save_lease(&t, key);
            }
        }
        self.step(clock::now());
    }

    /// Applies the time limits a `Renew` carries: an attempt whose limit grew gets its
    /// deadline moved later by as much, and its `lease.json` rewritten so its guard
    /// enforces the new one. Unknown attempts, equal or smaller limits, and attempts
    /// already stopping or ended change nothing (see [`ContainerObs::extend_time_limit`]).
    pub fn set_time_limits(&self, limits: &[TimeLimit]) {
        let mut t = self.table();
        for l in limits {
            let key = (l.job, l.attempt);
            let Some(h) = t.have.get_mut(&key) else {
                continue;
            };
            let known = h.time_limit.is_some();
            if h.extend_time_limit(Duration::from_secs(l.time_limit_s)) {
                tracing::info!(
                    job = l.job,
                    attempt = l.attempt,
                    time_limit_s = l.time_limit_s,
                    "time limit extended"
                );
                self.save_lease(&t, key);
            } else if !known && h.result.is_none() {
                tracing::warn!(
                    job = l.job,
                    attempt = l.attempt,
                    "cannot extend the time limit: this attempt's lease.json predates \
                     extensions, so its first limit is unknown"
                );
            }
        }
    }

    /// The boot-clock time an attempt's lease runs out, if the attempt is known.
    pub fn lease_deadline(&self, job: JobId, attempt: Attempt) -> Option<Duration> {
        self.table()
            .want
            .get(&(job, attempt))
            .map(|w| w.lease_until)
    }

    /// The boot-clock time an attempt's time limit is reached, if known.
    pub fn time_limit_deadline(&self, job: JobId, attempt: Attempt) -> Option<Duration> {
        self.table()
            .have
            .get(&(job, attempt))
            .and_then(|h| h.deadline)
    }

    /// What the portal is told in `Hello` and every heartbeat, in (job, attempt) order.
    pub fn reports(&self) -> Vec<AttemptReport> {
        reports_of(&self.table())
    }

    /// The container of an attempt that runs here and is not being stopped: what an SSH
    /// relay may attach to. `Err` says, for the user, why there is none.
    pub fn running_container(&self, job: JobId, attempt: Attempt) -> Result<String, String> {
        let t = self.table();
        let Some(obs) = t.have.get(&(job, attempt)) else {
            return Err(format!("job {job} does not run on this server (any more)"));
        };
        if let Some(s) = &obs.stopping {
            return Err(format!("job {job} is being stopped ({})", s.why.text));
        }
        match &obs.phase {
            Phase::Running { container }
            | Phase::Found {
                container,
                running: true,
            } => Ok(container.clone()),
            Phase::Creating => Err(format!(
                "job {job} is still starting: try again in a moment"
            )),
            _ => Err(format!("job {job} has ended")),
        }
    }

    /// Adds a line to an attempt's output (what its owner reads on the job's page).
    pub fn note(&self, job: JobId, attempt: Attempt, line: &str) {
        self.inner.events.send(AgentMsg::Logs {
            job,
            attempt,
            chunk: format!("{line}\n"),
        });
    }

    /// Reconciles as of `now` (boot clock) until nothing is left to do; see the module's
    /// numbered list. The tick calls it every second; tests call it with a later `now`.
    pub fn step(&self, now: Duration) {
        let mut t = self.table();
        let mut last = Vec::new();
        for _ in 0..MAX_PASSES {
            let want: Vec<Assignment> = t.want.values().cloned().collect();
            let have: Vec<ContainerObs> = t.have.values().cloned().collect();
            let actions = reconcile(&want, &have, now);
            if actions.is_empty() || actions == last {
                return;
            }
            for action in actions.iter().cloned() {
                self.apply(&mut t, action, now);
            }
            last = actions;
        }
        tracing::error!("reconcile did not settle in {MAX_PASSES} passes; continuing next tick");
    }
}

/// The container an observation names, while there is one.
fn container_of(phase: &Phase) -> Option<&str> {
    match phase {
        Phase::Found { container, .. }
        | Phase::Running { container }
        | Phase::Draining { container }
        | Phase::Ended { container, .. }
        | Phase::Lost { container, .. }
        | Phase::Removing { container } => Some(container),
        Phase::Creating | Phase::NotCreated { .. } | Phase::Removed => None,
    }
}

fn reports_of(t: &Table) -> Vec<AttemptReport> {
    let keys: BTreeSet<Key> = t.want.keys().chain(t.have.keys()).copied().collect();
    keys.into_iter()
        .map(|key| match t.have.get(&key) {
            Some(h) => {
                let mut r = h.report();
                if r.state == AttemptState::Running {
                    r.gpu_memory_used_mb = t.used.get(&key).copied();
                }
                r
            }
            None => AttemptReport {
                job: key.0,
                attempt: key.1,
                state: AttemptState::Starting,
                exit_code: None,
                stop: None,
                reason: None,
                gpu_memory_used_mb: None,
            },
        })
        .collect()
}
