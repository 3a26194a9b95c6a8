//! Applying one reconcile [`Action`]: bookkeeping under the table's lock, runtime calls
//! spawned (each reports back by changing the table and running another pass), and the
//! attempt's files kept in step (`lease.json`, `result.json`, the guard).
//!
//! Invariants: `result.json` is written (and synced) in `Record`, before the pass that may
//! `Remove` the container; `lease.json` is written before the container is created and
//! again once its id is known, whether or not the executor still exists by then, and the
//! guard is started right after (and again by the tick should it die: `keep_guards`), so
//! no started container is ever without its fence for longer than a tick; the
//! checkpoint directory exists (restored, when asked) before the container is created,
//! and no container is created once the executor is gone.

use super::{checkpoints, lock, upgrade, Executor, Inner, Table};
use crate::clock::{self, to_ms};
use crate::guard;
use crate::reconcile::{
    Action, AttemptResult, ContainerObs, Key, Launch, Phase, Snapshots, Stopping, ENFORCE_GRACE,
};
use crate::runtime::ContainerRuntime;
use crate::store::{self, LeaseFile, ResultFile, StopMark, Store, LOG_TAIL_MAX};
use commons_proto::{AgentMsg, AttemptState, StopReason};
use std::sync::{Arc, Weak};
use std::time::Duration;

impl<R: ContainerRuntime> Executor<R> {
    /// Starts a guard again for every attempt whose container runs here and whose guard
    /// is not running (it died, or was killed): the fence is back within a tick.
    /// Returns the attempts that got one.
    pub fn keep_guards(&self) -> Vec<Key> {
        if self.inner.store.guard_program().is_none() {
            return Vec::new();
        }
        let running: Vec<(Key, String)> = {
            let t = self.table();
            t.have
                .iter()
                .filter(|(_, h)| h.result.is_none())
                .filter_map(|(key, h)| match &h.phase {
                    Phase::Running { container }
                    | Phase::Found {
                        container,
                        running: true,
                    } => Some((*key, container.clone())),
                    _ => None,
                })
                .collect()
        };
        let mut started = Vec::new();
        for (key, container) in running {
            if guard::ensure(&self.inner.store, key, &container) {
                tracing::warn!(
                    job = key.0,
                    attempt = key.1,
                    "the attempt's guard was not running: started it again"
                );
                started.push(key);
            }
        }
        started
    }

    /// Applies one action: its bookkeeping now, its runtime calls spawned.
    pub(super) fn apply(&self, t: &mut Table, action: Action, now: Duration) {
        let key = action.key();
        match action {
            Action::Start {
                launch, deadline, ..
            } => self.apply_start(t, key, launch, deadline, now),
            Action::Adopt {
                container, running, ..
            } => self.apply_adopt(t, key, container, running),
            Action::Stop {
                container,
                grace,
                stopping,
                ..
            } => self.apply_stop(t, key, container, grace, stopping),
            Action::Snapshot { next, .. } => self.begin_snapshot(t, key, next),
            Action::Upload { .. } => self.begin_upload(t, key),
            Action::Record { result, .. } => self.apply_record(t, key, result),
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
                self.inner.events.send(AgentMsg::AttemptEvent {
                    job: key.0,
                    attempt: key.1,
                    state: result.state,
                    exit_code: result.exit_code,
                    stop: result.stop,
                    reason: result.reason,
                });
                if let Some(h) = t.have.get_mut(&key) {
                    h.reported = true;
                }
            }
            Action::Forget { .. } => self.apply_forget(t, key),
        }
    }

    /// `Start`: the attempt is `Creating`, its `lease.json` written, its container made
    /// in the background.
    fn apply_start(
        &self,
        t: &mut Table,
        key: Key,
        launch: Arc<Launch>,
        deadline: Duration,
        now: Duration,
    ) {
        let (job, attempt) = key;
        tracing::info!(job, attempt, image = %launch.spec.image, resume = launch.resume, "starting");
        let mut obs = ContainerObs::new(job, attempt, Phase::Creating, Some(deadline));
        obs.time_limit = Some(Duration::from_secs(launch.spec.time_limit_s));
        obs.snapshots = launch
            .spec
            .checkpoint_interval_s
            .filter(|s| *s > 0)
            .map(|s| Snapshots {
                every: Duration::from_secs(s),
                next: now.saturating_add(Duration::from_secs(s)),
                busy: false,
            });
        t.have.insert(key, obs);
        let lease = self.lease_file(t, key);
        if let Some(l) = &lease {
            self.write_lease(key, l);
        }
        tokio::spawn(start_task(
            self.weak(),
            self.inner.runtime.clone(),
            self.inner.store.clone(),
            key,
            launch,
            lease,
        ));
    }

    /// `Adopt`: a container found after a restart is followed again (and fenced again,
    /// when it runs).
    fn apply_adopt(&self, t: &mut Table, key: Key, container: String, running: bool) {
        let (job, attempt) = key;
        tracing::info!(job, attempt, running, "re-adopting container {container}");
        let Some(h) = t.have.get_mut(&key) else {
            return;
        };
        let c = container.clone();
        h.phase = if running {
            Phase::Running { container: c }
        } else {
            Phase::Draining { container: c }
        };
        if running {
            self.save_lease(t, key);
            guard::ensure(&self.inner.store, key, &container);
        }
        // Logs from now on: what it printed before was already sent by the last run.
        self.follow(t, key, container, Some(clock::wall_now()));
    }

    /// `Stop`: the stop is recorded (in the table and `lease.json`), then sent.
    fn apply_stop(
        &self,
        t: &mut Table,
        key: Key,
        container: String,
        grace: Duration,
        stopping: Stopping,
    ) {
        let (job, attempt) = key;
        let why = &stopping.why;
        if why.reason == StopReason::LeaseExpired {
            tracing::warn!(job, attempt, "lease expired, stopping (grace {grace:?})");
        } else {
            tracing::info!(job, attempt, reason = %why.text, "stopping (grace {grace:?})");
        }
        if let Some(h) = t.have.get_mut(&key) {
            h.stopping = Some(stopping);
        }
        // The checkpoint the job writes in its grace is uploaded once it stopped.
        checkpoints::cancel_snapshot(t, key);
        // The guard now only makes sure this stop finishes; a restarted agent gives it
        // what is left of this grace.
        self.save_lease(t, key);
        let runtime = self.inner.runtime.clone();
        tokio::spawn(async move {
            if let Err(e) = runtime.stop(&container, grace).await {
                tracing::warn!(job, attempt, "stop {container}: {e}");
            }
        });
    }

    /// `Record`: the result goes to `result.json` (with the end of the output) and the
    /// table; `saved` says whether the file made it.
    fn apply_record(&self, t: &mut Table, key: Key, result: AttemptResult) {
        let (job, attempt) = key;
        checkpoints::cancel_snapshot(t, key);
        let tail = t
            .tails
            .get(&key)
            .map(|b| store::tail(&lock(b), LOG_TAIL_MAX).to_string())
            .unwrap_or_default();
        let file = ResultFile {
            state: result.state,
            exit_code: result.exit_code,
            stop: result.stop,
            reason: result.reason.clone(),
            ended_unix_ms: to_ms(clock::wall_now()),
            log_tail: tail,
        };
        let saved = match self.inner.store.write_result(key, &file) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(job, attempt, "{e}; the container is kept until it is saved");
                false
            }
        };
        let h = t
            .have
            .entry(key)
            .or_insert_with(|| ContainerObs::new(job, attempt, Phase::Removed, None));
        h.result = Some(result);
        h.saved = saved;
    }

    /// `Forget`: the attempt leaves the table, and its directory the disk.
    fn apply_forget(&self, t: &mut Table, key: Key) {
        t.want.remove(&key);
        t.have.remove(&key);
        t.tails.remove(&key);
        t.cancels.remove(&key);
        t.volumes.remove(&key);
        t.holds.remove(&key);
        t.used.remove(&key);
        if let Err(e) = self.inner.store.remove(key) {
            tracing::warn!(
                job = key.0,
                attempt = key.1,
                "cannot remove the attempt's directory: {e}"
            );
        }
    }

    /// The attempt's `lease.json` as the table has it, while it has a container to guard.
    pub(super) fn lease_file(&self, t: &Table, key: Key) -> Option<LeaseFile> {
        let w = t.want.get(&key)?;
        let h = t.have.get(&key)?;
        if h.result.is_some() {
            return None;
        }
        let container = match &h.phase {
            Phase::Creating => None,
            Phase::NotCreated { .. } | Phase::Removed => return None,
            other => super::container_of(other).map(str::to_string),
        };
        Some(LeaseFile {
            container,
            boot_id: self.inner.boot_id.clone(),
            lease_deadline_ms: to_ms(w.lease_until),
            time_limit_deadline_ms: h.deadline.map(to_ms),
            time_limit_s: h.time_limit.map(|l| l.as_secs()),
            grace_s: ENFORCE_GRACE.as_secs(),
            stop: h.stopping.as_ref().map(|s| StopMark {
                reason: s.why.reason,
                text: s.why.text.clone(),
                fails: s.why.fails,
                grace_ms: to_ms(s.grace),
                since_ms: to_ms(s.since),
            }),
        })
    }

    /// Rewrites the attempt's `lease.json` from the table.
    pub(super) fn save_lease(&self, t: &Table, key: Key) {
        if let Some(l) = self.lease_file(t, key) {
            self.write_lease(key, &l);
        }
    }

    fn write_lease(&self, key: Key, lease: &LeaseFile) {
        write_lease(&self.inner.store, key, lease);
    }
}

fn write_lease(store: &Store, (job, attempt): Key, lease: &LeaseFile) {
    if let Err(e) = store.write_lease((job, attempt), lease) {
        tracing::error!(
            job,
            attempt,
            "{e}; while the agent is down its guard enforces the deadlines it last read"
        );
    }
}

/// Creates and starts a container, records its id in `lease.json`, starts its guard, then
/// records it running (and follows it) or failed.
async fn start_task<R: ContainerRuntime>(
    weak: Weak<Inner<R>>,
    runtime: Arc<R>,
    store: Store,
    key: Key,
    launch: Arc<Launch>,
    lease: Option<LeaseFile>,
) {
    let (job, attempt) = key;
    let created = match checkpoints::prepare(&weak, &store, key, &launch).await {
        Some(Ok(mut mount)) => match super::shares::mount(&weak, &launch) {
            Ok(share) => {
                mount.share = share;
                runtime
                    .create_and_start(job, attempt, &launch.spec, &launch.gpus, &mount)
                    .await
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        },
        Some(Err(e)) => Err(e),
        // The agent went away while restoring: nothing was created.
        None => return,
    };
    let Some(exec) = upgrade(&weak) else {
        // The agent is gone: fence the container anyway, with the deadlines it had.
        if let (Ok(id), Some(mut l)) = (created, lease) {
            l.container = Some(id.clone());
            write_lease(&store, key, &l);
            guard::ensure(&store, key, &id);
        }
        return;
    };
    let mut started = None;
    {
        let mut t = exec.table();
        let order = t.want.get(&key).and_then(|w| w.stop.clone());
        let Some(h) = t.have.get_mut(&key) else {
            return;
        };
        match (created, order) {
            // Stopped while it was being prepared (its inputs staged): it ends as its
            // stop order says (preempted, cancelled, ...), not as a failure to start.
            (Err(e), Some(order)) => {
                tracing::info!(job, attempt, "stopped before its container started: {e}");
                stopped_before_start(h, order);
            }
            (Err(e), None) => {
                tracing::warn!(job, attempt, "cannot start: {e}");
                crate::metrics::METRICS.container_start_failures.inc();
                h.phase = Phase::NotCreated { error: e };
            }
            (Ok(id), _) => {
                crate::metrics::METRICS.container_starts.inc();
                // The time limit counts from the container's start: staging inputs and
                // restoring a checkpoint before it do not use the job's time.
                if let Some(limit) = h.time_limit {
                    h.deadline = Some(clock::now().saturating_add(limit));
                }
                h.phase = Phase::Running {
                    container: id.clone(),
                };
                exec.save_lease(&t, key);
                exec.inner.events.send(AgentMsg::AttemptEvent {
                    job,
                    attempt,
                    state: AttemptState::Running,
                    exit_code: None,
                    stop: None,
                    reason: None,
                });
                exec.follow(&mut t, key, id.clone(), None);
                started = Some(id);
            }
        }
    }
    if let Some(id) = started {
        guard::ensure(&store, key, &id);
    }
    exec.step(clock::now());
}

/// An attempt whose stop came before its container: it has none, and ends as the stop
/// order says.
fn stopped_before_start(
    h: &mut crate::reconcile::ContainerObs,
    order: crate::reconcile::StopOrder,
) {
    h.stopping = Some(Stopping {
        why: order.why,
        grace: Duration::ZERO,
        since: clock::now(),
        issued: true,
    });
    h.phase = Phase::Removed;
}

/// Removes a recorded attempt's container; a failure is logged, and the attempt moves on
/// (its result, saved on disk, is what matters to the portal).
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
    exec.step(clock::now());
}
