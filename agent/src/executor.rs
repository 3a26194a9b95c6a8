//! Runs attempts: one task per attempt that creates the container, forwards its logs,
//! enforces the time limit and the lease, and reports how it ended.
//!
//! The attempt table is the agent's truth about what runs. Final states stay in it (and so
//! in every heartbeat) until the portal stops renewing the attempt, which is how the portal
//! acknowledges them: a report sent into a dying connection is sent again.

use crate::runtime::{AssignedGpu, DockerRuntime, FoundContainer};
use commons_proto::{AgentMsg, Attempt, AttemptReport, AttemptState, JobId, JobSpec};
use futures_util::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Grace given to a container whose time limit or lease ran out.
const ENFORCE_GRACE_S: u64 = 10;
/// Logs are sent in chunks of at most this many bytes, or every flush interval.
const LOG_CHUNK: usize = 16 * 1024;
const LOG_FLUSH: Duration = Duration::from_millis(300);

type Key = (JobId, Attempt);

#[derive(Debug, Clone)]
struct StopRequest {
    grace_s: u64,
    reason: String,
}

struct Entry {
    state: AttemptState,
    exit_code: Option<i64>,
    reason: Option<String>,
    lease_until: i64,
    stop: watch::Sender<Option<StopRequest>>,
    container: Option<String>,
}

#[derive(Clone)]
pub struct Executor {
    runtime: DockerRuntime,
    events: mpsc::UnboundedSender<AgentMsg>,
    table: Arc<Mutex<BTreeMap<Key, Entry>>>,
}

pub fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl Executor {
    pub fn new(runtime: DockerRuntime, events: mpsc::UnboundedSender<AgentMsg>) -> Self {
        Self {
            runtime,
            events,
            table: Arc::default(),
        }
    }

    /// Re-adopts the containers an earlier run of the agent left: running ones are watched
    /// again, stopped ones are reported with their exit code and removed.
    pub async fn adopt(&self, lease_ttl_s: i64) -> anyhow::Result<()> {
        for c in self.runtime.list().await? {
            let FoundContainer {
                id,
                job,
                attempt,
                running,
                deadline,
            } = c;
            let stop_rx = self.insert(job, attempt, unix_now() + lease_ttl_s);
            tracing::info!(job, attempt, running, "re-adopting container");
            self.set_container(job, attempt, &id, AttemptState::Running);
            let this = self.clone();
            let deadline = deadline.unwrap_or(i64::MAX);
            // Logs from now on: what it printed before was already sent by the last run.
            let since = unix_now() as i32;
            tokio::spawn(
                async move { this.watch(job, attempt, id, deadline, since, stop_rx).await },
            );
        }
        Ok(())
    }

    fn insert(
        &self,
        job: JobId,
        attempt: Attempt,
        lease_until: i64,
    ) -> watch::Receiver<Option<StopRequest>> {
        let (tx, rx) = watch::channel(None);
        self.table.lock().unwrap().insert(
            (job, attempt),
            Entry {
                state: AttemptState::Starting,
                exit_code: None,
                reason: None,
                lease_until,
                stop: tx,
                container: None,
            },
        );
        rx
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
        if self.table.lock().unwrap().contains_key(&(job, attempt)) {
            return;
        }
        let stop_rx = self.insert(job, attempt, lease_until);
        let this = self.clone();
        tokio::spawn(async move {
            let deadline = unix_now().saturating_add(spec.time_limit_s as i64);
            match this
                .runtime
                .create_and_start(job, attempt, &spec, &gpus, deadline)
                .await
            {
                Err(e) => {
                    tracing::warn!(job, attempt, "cannot start: {e}");
                    this.finish(
                        job,
                        attempt,
                        AttemptState::Failed,
                        None,
                        Some(e.to_string()),
                    );
                }
                Ok(id) => {
                    this.set_container(job, attempt, &id, AttemptState::Running);
                    this.emit_event(job, attempt, AttemptState::Running, None, None);
                    this.watch(job, attempt, id, deadline, 0, stop_rx).await;
                }
            }
        });
    }

    fn set_container(&self, job: JobId, attempt: Attempt, id: &str, state: AttemptState) {
        if let Some(e) = self.table.lock().unwrap().get_mut(&(job, attempt)) {
            e.container = Some(id.to_string());
            e.state = state;
        }
    }

    /// Follows a running container until it ends, is stopped, or reaches its deadline.
    async fn watch(
        &self,
        job: JobId,
        attempt: Attempt,
        id: String,
        deadline: i64,
        logs_since: i32,
        mut stop_rx: watch::Receiver<Option<StopRequest>>,
    ) {
        let logs = tokio::spawn(forward_logs(
            self.runtime.logs(&id, logs_since),
            self.events.clone(),
            job,
            attempt,
        ));
        let left = Duration::from_secs(deadline.saturating_sub(unix_now()).max(0) as u64);
        let stop = tokio::select! {
            code = self.runtime.wait(&id) => {
                match code {
                    Ok(code) => (AttemptState::Exited, Some(code), None),
                    Err(e) => (AttemptState::Failed, None, Some(format!("lost the container: {e}"))),
                }
            }
            _ = tokio::time::sleep(left) => {
                let req = StopRequest { grace_s: ENFORCE_GRACE_S, reason: "time limit reached".into() };
                self.stop_container(&id, req).await
            }
            req = async { stop_rx.wait_for(|r| r.is_some()).await.ok().and_then(|r| r.clone()) } => {
                let req = req.unwrap_or(StopRequest {
                    grace_s: ENFORCE_GRACE_S,
                    reason: "stopped".into(),
                });
                self.stop_container(&id, req).await
            }
        };
        // The log stream ends with the container; give it a moment to drain.
        let _ = tokio::time::timeout(Duration::from_secs(5), logs).await;
        if let Err(e) = self.runtime.remove(&id).await {
            tracing::warn!(job, attempt, "cannot remove container {id}: {e}");
        }
        self.finish(job, attempt, stop.0, stop.1, stop.2);
    }

    async fn stop_container(
        &self,
        id: &str,
        req: StopRequest,
    ) -> (AttemptState, Option<i64>, Option<String>) {
        if let Err(e) = self.runtime.stop(id, req.grace_s).await {
            tracing::warn!("stop {id}: {e}");
        }
        let code = self.runtime.wait(id).await.ok();
        (AttemptState::Stopped, code, Some(req.reason))
    }

    fn finish(
        &self,
        job: JobId,
        attempt: Attempt,
        state: AttemptState,
        exit_code: Option<i64>,
        reason: Option<String>,
    ) {
        if let Some(e) = self.table.lock().unwrap().get_mut(&(job, attempt)) {
            e.state = state;
            e.exit_code = exit_code;
            e.reason = reason.clone();
            e.container = None;
        }
        self.emit_event(job, attempt, state, exit_code, reason);
    }

    fn emit_event(
        &self,
        job: JobId,
        attempt: Attempt,
        state: AttemptState,
        exit_code: Option<i64>,
        reason: Option<String>,
    ) {
        let _ = self.events.send(AgentMsg::AttemptEvent {
            job,
            attempt,
            state,
            exit_code,
            reason,
        });
    }

    /// Asks an attempt to stop. Returns false when the attempt is not known here.
    pub fn stop(&self, job: JobId, attempt: Attempt, grace_s: u64, reason: String) -> bool {
        match self.table.lock().unwrap().get(&(job, attempt)) {
            Some(e) => {
                e.stop.send_if_modified(|r| {
                    if r.is_none() {
                        *r = Some(StopRequest { grace_s, reason });
                        true
                    } else {
                        false
                    }
                });
                true
            }
            None => false,
        }
    }

    /// Tells the portal that an attempt it asked about is not running here.
    pub fn report_unknown(&self, job: JobId, attempt: Attempt) {
        self.emit_event(
            job,
            attempt,
            AttemptState::Stopped,
            None,
            Some("not running on this server".into()),
        );
    }

    /// Extends the listed attempts' leases and forgets final attempts the portal no longer
    /// lists (it has recorded how they ended).
    pub fn renew(&self, lease_until: i64, attempts: &[(JobId, Attempt)]) {
        let listed: BTreeSet<Key> = attempts.iter().copied().collect();
        let mut table = self.table.lock().unwrap();
        table.retain(|k, e| listed.contains(k) || !e.state.is_final());
        for k in &listed {
            if let Some(e) = table.get_mut(k) {
                e.lease_until = e.lease_until.max(lease_until);
            }
        }
    }

    /// Stops every live attempt whose lease ran out: the portal may already have given its
    /// GPUs to another attempt, and one job must never run twice at once.
    pub fn expire_leases(&self, now: i64) {
        let expired: Vec<Key> = self
            .table
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| !e.state.is_final() && e.lease_until < now)
            .map(|(k, _)| *k)
            .collect();
        for (job, attempt) in expired {
            tracing::warn!(job, attempt, "lease expired, stopping");
            self.stop(
                job,
                attempt,
                ENFORCE_GRACE_S,
                "lease expired: the server lost contact with the portal".into(),
            );
        }
    }

    pub fn reports(&self) -> Vec<AttemptReport> {
        self.table
            .lock()
            .unwrap()
            .iter()
            .map(|((job, attempt), e)| AttemptReport {
                job: *job,
                attempt: *attempt,
                state: e.state,
                exit_code: e.exit_code,
                reason: e.reason.clone(),
            })
            .collect()
    }

    /// Host pids inside our running containers.
    pub async fn our_pids(&self) -> BTreeSet<u32> {
        let ids: Vec<String> = self
            .table
            .lock()
            .unwrap()
            .values()
            .filter_map(|e| e.container.clone())
            .collect();
        let mut pids = BTreeSet::new();
        for id in ids {
            pids.extend(self.runtime.pids(&id).await);
        }
        pids
    }
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
