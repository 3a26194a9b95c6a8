//! An in-memory `ContainerRuntime` with every call visible (and waits that can fail, and
//! containers that can vanish; each create records its checkpoint mount and the
//! environment the Docker runtime would give the container), plus the helpers the executor tests share: a setup over a
//! temporary state dir, leases granted from the executor's own numbered messages, and an
//! event collector.

use commons_agent::executor::Executor;
use commons_agent::outbox::{self, OutboxRx};
use commons_agent::runtime::{
    container_body, AssignedGpu, CheckpointMount, ContainerRuntime, ContainerStatus, ExecIo,
    ExecRequest, ExecState, FoundContainer, HostContainer, RuntimeError,
};
use commons_agent::store::{self, LeaseFile, Store};
use commons_proto::{
    AgentMsg, Attempt, AttemptReport, AttemptState, JobId, JobSpec, Lease, StopReason,
};
use futures_util::{Stream, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The fake runs no processes: the SSH relays are tested against the Docker Engine.
fn no_processes(what: &str) -> RuntimeError {
    RuntimeError::Engine(format!("the fake runtime runs no process in {what}"))
}

/// The exit code a stopped fake container reports (SIGTERM).
pub(crate) const SIGTERM_EXIT: i64 = 143;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Create(JobId, Attempt),
    Stop(String, Duration),
    Remove(String),
}

struct FakeContainer {
    job: JobId,
    attempt: Attempt,
    logs: Vec<String>,
    exit: watch::Sender<Option<i64>>,
}

/// What one create was given.
#[derive(Debug, Clone)]
pub(crate) struct Created {
    pub job: JobId,
    pub attempt: Attempt,
    pub mount: CheckpointMount,
    /// The container's environment, as `container_body` makes it.
    pub env: Vec<String>,
}

#[derive(Clone, Default)]
pub(crate) struct FakeRuntime {
    pub created: Arc<Mutex<Vec<Created>>>,
    containers: Arc<Mutex<BTreeMap<String, FakeContainer>>>,
    calls: Arc<Mutex<Vec<Call>>>,
    /// Containers whose next `wait` fails (the engine hiccups).
    fail_wait: Arc<Mutex<BTreeSet<String>>>,
    pub waits: Arc<Mutex<usize>>,
    /// The state dir, to check at each removal that the result is already on disk.
    state_dir: Arc<Mutex<Option<PathBuf>>>,
    pub result_on_disk_at_removal: Arc<Mutex<Vec<bool>>>,
}

pub(crate) fn id_of(job: JobId, attempt: Attempt) -> String {
    format!("fake-{job}-{attempt}")
}

impl FakeRuntime {
    /// A container an earlier agent left (running when `exit` is `None`).
    pub(crate) fn plant(&self, job: JobId, attempt: Attempt, exit: Option<i64>) {
        self.containers.lock().unwrap().insert(
            id_of(job, attempt),
            FakeContainer {
                job,
                attempt,
                logs: vec![],
                exit: watch::channel(exit).0,
            },
        );
    }

    /// The engine loses the container: it is gone with no exit code.
    pub(crate) fn vanish(&self, job: JobId, attempt: Attempt) {
        self.containers.lock().unwrap().remove(&id_of(job, attempt));
    }

    pub(crate) fn fail_next_wait(&self, job: JobId, attempt: Attempt) {
        self.fail_wait.lock().unwrap().insert(id_of(job, attempt));
    }

    pub(crate) fn running(&self, job: JobId, attempt: Attempt) -> bool {
        self.containers
            .lock()
            .unwrap()
            .get(&id_of(job, attempt))
            .is_some_and(|c| c.exit.borrow().is_none())
    }

    /// The job's main process ends by itself.
    pub(crate) fn exit(&self, job: JobId, attempt: Attempt, code: i64) {
        let all = self.containers.lock().unwrap();
        all[&id_of(job, attempt)].exit.send_replace(Some(code));
    }

    pub(crate) fn ids(&self) -> Vec<String> {
        self.containers.lock().unwrap().keys().cloned().collect()
    }

    /// What the last create of `(job, attempt)` was given.
    pub(crate) fn created_of(&self, job: JobId, attempt: Attempt) -> Created {
        self.created
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|c| (c.job, c.attempt) == (job, attempt))
            .cloned()
            .expect("created")
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn exit_rx(&self, id: &str) -> Option<watch::Receiver<Option<i64>>> {
        self.containers
            .lock()
            .unwrap()
            .get(id)
            .map(|c| c.exit.subscribe())
    }
}

impl ContainerRuntime for FakeRuntime {
    async fn create_and_start(
        &self,
        job: JobId,
        attempt: Attempt,
        spec: &JobSpec,
        gpus: &[AssignedGpu],
        checkpoint: &CheckpointMount,
    ) -> Result<String, RuntimeError> {
        self.calls.lock().unwrap().push(Call::Create(job, attempt));
        let body = container_body("fake", job, attempt, spec, gpus, checkpoint);
        self.created.lock().unwrap().push(Created {
            job,
            attempt,
            mount: checkpoint.clone(),
            env: body.env.unwrap_or_default(),
        });
        if spec.image.starts_with("missing") {
            return Err(RuntimeError::ImageMissing(spec.image.clone()));
        }
        let id = id_of(job, attempt);
        self.containers.lock().unwrap().insert(
            id.clone(),
            FakeContainer {
                job,
                attempt,
                logs: vec![format!("{} says hello\n", spec.user)],
                exit: watch::channel(None).0,
            },
        );
        Ok(id)
    }

    async fn list(&self) -> Result<Vec<FoundContainer>, RuntimeError> {
        let all = self.containers.lock().unwrap();
        let mut out: Vec<FoundContainer> = all
            .iter()
            .map(|(id, c)| FoundContainer {
                id: id.clone(),
                job: c.job,
                attempt: c.attempt,
                running: c.exit.borrow().is_none(),
            })
            .collect();
        out.sort_by_key(|c| (c.job, c.attempt));
        Ok(out)
    }

    async fn wait(&self, id: &str) -> Result<i64, RuntimeError> {
        *self.waits.lock().unwrap() += 1;
        if self.fail_wait.lock().unwrap().remove(id) {
            return Err(RuntimeError::Engine("connection reset".into()));
        }
        let gone = || RuntimeError::NoSuchContainer(id.to_string());
        let mut rx = self.exit_rx(id).ok_or_else(gone)?;
        let code = rx.wait_for(Option::is_some).await.map_err(|_| gone())?;
        (*code).ok_or_else(gone)
    }

    async fn inspect(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        Ok(match self.containers.lock().unwrap().get(id) {
            None => ContainerStatus::Gone,
            Some(c) => match *c.exit.borrow() {
                None => ContainerStatus::Running,
                Some(code) => ContainerStatus::Exited(code),
            },
        })
    }

    async fn env(&self, _id: &str) -> Result<Vec<String>, RuntimeError> {
        Ok(Vec::new())
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Stop(id.to_string(), grace));
        if let Some(c) = self.containers.lock().unwrap().get(id) {
            c.exit.send_if_modified(|e| {
                let was_running = e.is_none();
                e.get_or_insert(SIGTERM_EXIT);
                was_running
            });
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Remove(id.to_string()));
        let removed = self.containers.lock().unwrap().remove(id);
        if let (Some(c), Some(dir)) = (removed, self.state_dir.lock().unwrap().clone()) {
            let path = store::attempt_dir(&dir, c.job, c.attempt).join(store::RESULT_FILE);
            self.result_on_disk_at_removal
                .lock()
                .unwrap()
                .push(path.is_file());
        }
        Ok(())
    }

    fn logs(
        &self,
        id: &str,
        since: Option<Duration>,
    ) -> impl Stream<Item = String> + Send + 'static {
        let (lines, rx) = match self.containers.lock().unwrap().get(id) {
            Some(c) => (
                if since.is_none() {
                    c.logs.clone()
                } else {
                    vec![]
                },
                Some(c.exit.subscribe()),
            ),
            None => (vec![], None),
        };
        // The output so far, then the stream ends when the container does.
        let end = futures_util::stream::once(async move {
            if let Some(mut rx) = rx {
                let _ = rx.wait_for(Option::is_some).await;
            }
        })
        .filter_map(|()| async { None::<String> });
        futures_util::stream::iter(lines).chain(end)
    }

    async fn pids(&self, id: &str) -> BTreeSet<u32> {
        let all = self.containers.lock().unwrap();
        all.get(id)
            .map(|c| BTreeSet::from([1000 + c.job as u32]))
            .unwrap_or_default()
    }

    fn agent_id(&self) -> &str {
        "fake"
    }

    fn host_id(&self) -> Option<&str> {
        None
    }

    async fn list_host(&self) -> Result<Vec<HostContainer>, RuntimeError> {
        Ok(Vec::new())
    }

    async fn main_pid(&self, _id: &str) -> Option<i64> {
        None
    }

    async fn exec_create(
        &self,
        container: &str,
        _req: &ExecRequest,
    ) -> Result<String, RuntimeError> {
        Err(no_processes(container))
    }

    async fn exec_start(&self, exec: &str, _tty: bool) -> Result<ExecIo, RuntimeError> {
        Err(no_processes(exec))
    }

    async fn exec_resize(&self, exec: &str, _cols: u16, _rows: u16) -> Result<(), RuntimeError> {
        Err(no_processes(exec))
    }

    async fn exec_inspect(&self, exec: &str) -> Result<ExecState, RuntimeError> {
        Err(no_processes(exec))
    }
}

/// Collects the executor's messages so a test can wait for one job's without losing
/// another's.
pub(crate) struct Events {
    rx: OutboxRx,
    pub seen: Vec<AgentMsg>,
}

/// A final (or any) event, as the portal gets it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct End {
    pub state: AttemptState,
    pub exit_code: Option<i64>,
    pub stop: Option<StopReason>,
    pub reason: Option<String>,
}

impl Events {
    pub(crate) fn new(rx: OutboxRx) -> Self {
        Self { rx, seen: vec![] }
    }

    pub(crate) async fn next(&mut self) -> AgentMsg {
        let msg = tokio::time::timeout(Duration::from_secs(5), self.rx.recv())
            .await
            .expect("no message from the executor within 5 s")
            .expect("channel open");
        self.seen.push(msg.clone());
        msg
    }

    /// Waits for an `AttemptEvent` of `job` in `state` (or any final state); returns it.
    pub(crate) async fn state_of(&mut self, job: JobId, want: Option<AttemptState>) -> End {
        let hit = |m: &AgentMsg| match m {
            AgentMsg::AttemptEvent {
                job: j,
                state,
                exit_code,
                stop,
                reason,
                ..
            } if *j == job && want.map_or(state.is_final(), |w| w == *state) => Some(End {
                state: *state,
                exit_code: *exit_code,
                stop: *stop,
                reason: reason.clone(),
            }),
            _ => None,
        };
        if let Some(e) = self.seen.iter().find_map(hit) {
            return e;
        }
        loop {
            let m = self.next().await;
            if let Some(e) = hit(&m) {
                return e;
            }
        }
    }

    pub(crate) async fn final_of(&mut self, job: JobId) -> End {
        self.state_of(job, None).await
    }

    pub(crate) fn logs_of(&self, job: JobId) -> String {
        self.seen
            .iter()
            .filter_map(|m| match m {
                AgentMsg::Logs { job: j, chunk, .. } if *j == job => Some(chunk.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Nothing more arrives for `wait`.
    pub(crate) async fn quiet_for(&mut self, wait: Duration) -> Vec<AgentMsg> {
        let mut got = Vec::new();
        let until = tokio::time::Instant::now() + wait;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, self.rx.recv()).await {
            self.seen.push(m.clone());
            got.push(m);
        }
        got
    }
}

pub(crate) struct Setup {
    pub exec: Executor<FakeRuntime>,
    pub ev: Events,
    pub rt: FakeRuntime,
    pub dir: tempfile::TempDir,
}

pub(crate) fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::default();
    *rt.state_dir.lock().unwrap() = Some(dir.path().to_path_buf());
    let (exec, ev) = agent(&rt, dir.path());
    Setup { exec, ev, rt, dir }
}

/// An agent process (a fresh session) over `rt` and the state dir `dir`.
pub(crate) fn agent(rt: &FakeRuntime, dir: &Path) -> (Executor<FakeRuntime>, Events) {
    let (tx, rx) = outbox::channel(Default::default());
    (
        Executor::new(rt.clone(), tx, Store::new(dir)),
        Events::new(rx),
    )
}

pub(crate) fn spec(image: &str, time_limit_s: u64) -> JobSpec {
    JobSpec {
        inputs: Vec::new(),
        datasets: Vec::new(),
        image: image.into(),
        command: vec!["train".into()],
        env: Default::default(),
        cpus: 1.0,
        memory_mb: 128,
        time_limit_s,
        user: "alice".into(),
        checkpoint_interval_s: None,
        shm_mb: None,
        interactive: false,
        guest: false,
        lab: None,
        grace_s: None,
        image_digest: None,
        image_signature: None,
        image_campus: true,
        disk_gb: None,
        gpu_share: None,
    }
}

/// The agent says `Hello`; the portal answers with a lease counted from it.
pub(crate) fn lease_from_hello(exec: &Executor<FakeRuntime>, valid_for_s: u64) -> Lease {
    let AgentMsg::Hello { session, seq, .. } = exec.hello("test", vec![]) else {
        unreachable!()
    };
    Lease {
        session,
        seq,
        valid_for_s,
    }
}

/// A lease counted from a heartbeat sent now.
pub(crate) fn lease_from_heartbeat(exec: &Executor<FakeRuntime>, valid_for_s: u64) -> Lease {
    let AgentMsg::Heartbeat { seq, .. } = exec.heartbeat(vec![]) else {
        unreachable!()
    };
    Lease {
        session: exec.session(),
        seq,
        valid_for_s,
    }
}

pub(crate) fn far(exec: &Executor<FakeRuntime>) -> Lease {
    lease_from_hello(exec, 3600)
}

pub(crate) fn report_of(exec: &Executor<FakeRuntime>, job: JobId) -> Option<AttemptReport> {
    exec.reports().into_iter().find(|r| r.job == job)
}

pub(crate) fn state_in_reports(exec: &Executor<FakeRuntime>, job: JobId) -> Option<AttemptState> {
    report_of(exec, job).map(|r| r.state)
}

pub(crate) fn lease_file(dir: &Path, job: JobId, attempt: Attempt) -> LeaseFile {
    let path = store::attempt_dir(dir, job, attempt).join(store::LEASE_FILE);
    store::read_json(&path).unwrap().expect("lease.json")
}

pub(crate) fn write_lease(dir: &Path, job: JobId, attempt: Attempt, lease: &LeaseFile) {
    let path = store::attempt_dir(dir, job, attempt).join(store::LEASE_FILE);
    store::write_json(&path, lease).unwrap();
}

pub(crate) fn stops(rt: &FakeRuntime) -> Vec<(String, Duration)> {
    rt.calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Stop(id, grace) => Some((id, grace)),
            _ => None,
        })
        .collect()
}
