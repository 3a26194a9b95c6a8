//! The executor driven through an in-memory `ContainerRuntime`: the same paths as the
//! Docker tests (start, exit, stop with grace, lease, time limit, adoption, removal before
//! the final report), fast and deterministic, with every runtime call visible.

use commons_agent::executor::{unix_now, Executor};
use commons_agent::gpu::{GpuError, GpuSource};
use commons_agent::reconcile::{ENFORCE_GRACE, REASON_LEASE, REASON_TIME_LIMIT};
use commons_agent::runtime::{AssignedGpu, ContainerRuntime, FoundContainer, RuntimeError};
use commons_proto::{AgentMsg, Attempt, AttemptState, GpuInfo, GpuStat, JobId, JobSpec};
use futures_util::{Stream, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The exit code a stopped fake container reports (SIGTERM).
const SIGTERM_EXIT: i64 = 143;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Create(JobId, Attempt),
    Stop(String, Duration),
    Remove(String),
}

struct FakeContainer {
    job: JobId,
    attempt: Attempt,
    deadline: Option<Duration>,
    logs: Vec<String>,
    exit: watch::Sender<Option<i64>>,
}

#[derive(Clone, Default)]
struct FakeRuntime {
    containers: Arc<Mutex<BTreeMap<String, FakeContainer>>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

fn id_of(job: JobId, attempt: Attempt) -> String {
    format!("fake-{job}-{attempt}")
}

impl FakeRuntime {
    /// A container an earlier agent left (running when `exit` is `None`).
    fn plant(&self, job: JobId, attempt: Attempt, exit: Option<i64>, deadline: Option<Duration>) {
        self.containers.lock().unwrap().insert(
            id_of(job, attempt),
            FakeContainer {
                job,
                attempt,
                deadline,
                logs: vec![],
                exit: watch::channel(exit).0,
            },
        );
    }

    /// The job's main process ends by itself.
    fn exit(&self, job: JobId, attempt: Attempt, code: i64) {
        let all = self.containers.lock().unwrap();
        all[&id_of(job, attempt)].exit.send_replace(Some(code));
    }

    fn ids(&self) -> Vec<String> {
        self.containers.lock().unwrap().keys().cloned().collect()
    }

    fn calls(&self) -> Vec<Call> {
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
        _gpus: &[AssignedGpu],
        deadline: Duration,
    ) -> Result<String, RuntimeError> {
        self.calls.lock().unwrap().push(Call::Create(job, attempt));
        if spec.image.starts_with("missing") {
            return Err(RuntimeError::ImageMissing(spec.image.clone()));
        }
        let id = id_of(job, attempt);
        self.containers.lock().unwrap().insert(
            id.clone(),
            FakeContainer {
                job,
                attempt,
                deadline: Some(deadline),
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
                deadline: c.deadline,
            })
            .collect();
        out.sort_by_key(|c| (c.job, c.attempt));
        Ok(out)
    }

    async fn wait(&self, id: &str) -> Result<i64, RuntimeError> {
        let gone = || RuntimeError::NoSuchContainer(id.to_string());
        let mut rx = self.exit_rx(id).ok_or_else(gone)?;
        let code = rx.wait_for(Option::is_some).await.map_err(|_| gone())?;
        (*code).ok_or_else(gone)
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
        self.containers.lock().unwrap().remove(id);
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
}

/// Collects the executor's messages so a test can wait for one job's without losing
/// another's.
struct Events {
    rx: mpsc::UnboundedReceiver<AgentMsg>,
    seen: Vec<AgentMsg>,
}

impl Events {
    async fn next(&mut self) -> AgentMsg {
        let msg = tokio::time::timeout(Duration::from_secs(5), self.rx.recv())
            .await
            .expect("no message from the executor within 5 s")
            .expect("channel open");
        self.seen.push(msg.clone());
        msg
    }

    /// Waits for an `AttemptEvent` of `job` in `state` (or any final state); returns it.
    async fn state_of(&mut self, job: JobId, want: Option<AttemptState>) -> AgentMsg {
        let hit = |m: &AgentMsg| {
            matches!(m, AgentMsg::AttemptEvent { job: j, state, .. }
                if *j == job && want.map_or(state.is_final(), |w| w == *state))
        };
        if let Some(m) = self.seen.iter().find(|m| hit(m)) {
            return m.clone();
        }
        loop {
            let m = self.next().await;
            if hit(&m) {
                return m;
            }
        }
    }

    async fn final_of(&mut self, job: JobId) -> (AttemptState, Option<i64>, Option<String>) {
        match self.state_of(job, None).await {
            AgentMsg::AttemptEvent {
                state,
                exit_code,
                reason,
                ..
            } => (state, exit_code, reason),
            other => unreachable!("{other:?}"),
        }
    }

    fn logs_of(&self, job: JobId) -> String {
        self.seen
            .iter()
            .filter_map(|m| match m {
                AgentMsg::Logs { job: j, chunk, .. } if *j == job => Some(chunk.as_str()),
                _ => None,
            })
            .collect()
    }
}

fn setup() -> (Executor<FakeRuntime>, Events, FakeRuntime) {
    let rt = FakeRuntime::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let events = Events { rx, seen: vec![] };
    (Executor::new(rt.clone(), tx), events, rt)
}

fn spec(image: &str, time_limit_s: u64) -> JobSpec {
    JobSpec {
        image: image.into(),
        command: vec!["train".into()],
        env: Default::default(),
        cpus: 1.0,
        memory_mb: 128,
        time_limit_s,
        user: "alice".into(),
    }
}

fn far_lease() -> i64 {
    unix_now() + 3600
}

fn state_in_reports(exec: &Executor<FakeRuntime>, job: JobId) -> Option<AttemptState> {
    exec.reports()
        .into_iter()
        .find(|r| r.job == job)
        .map(|r| r.state)
}

#[tokio::test]
async fn a_job_runs_reports_after_removal_and_is_forgotten_once_acknowledged() {
    let (exec, mut ev, rt) = setup();
    exec.start(1, 1, spec("demo", 600), vec![], far_lease());
    exec.start(1, 1, spec("demo", 600), vec![], far_lease());
    ev.state_of(1, Some(AttemptState::Running)).await;
    assert_eq!(
        rt.calls(),
        [Call::Create(1, 1)],
        "a duplicate Start is harmless"
    );
    assert_eq!(state_in_reports(&exec, 1), Some(AttemptState::Running));

    rt.exit(1, 1, 7);
    let end = ev.final_of(1).await;
    assert_eq!(end, (AttemptState::Exited, Some(7), None));
    assert!(rt.ids().is_empty(), "removed before the final report");
    assert!(
        ev.logs_of(1).contains("alice says hello"),
        "logs before the end"
    );

    exec.renew(far_lease(), &[(1, 1)]);
    assert_eq!(
        state_in_reports(&exec, 1),
        Some(AttemptState::Exited),
        "kept while the portal still lists it"
    );
    exec.renew(far_lease(), &[]);
    assert!(exec.reports().is_empty(), "forgotten once acknowledged");
}

#[tokio::test]
async fn a_portal_stop_uses_its_grace_and_reason() {
    let (exec, mut ev, rt) = setup();
    exec.start(2, 1, spec("demo", 600), vec![], far_lease());
    ev.state_of(2, Some(AttemptState::Running)).await;
    assert!(exec.stop(2, 1, 5, "preempted: owner needs the GPU".into()));
    let end = ev.final_of(2).await;
    assert_eq!(
        end,
        (
            AttemptState::Stopped,
            Some(SIGTERM_EXIT),
            Some("preempted: owner needs the GPU".into())
        )
    );
    let calls = rt.calls();
    assert_eq!(
        calls[1..],
        [
            Call::Stop(id_of(2, 1), Duration::from_secs(5)),
            Call::Remove(id_of(2, 1))
        ]
    );
    assert!(
        exec.stop(2, 1, 5, "again".into()),
        "still known until acknowledged"
    );
    assert_eq!(rt.calls().len(), calls.len(), "and stopped only once");
    assert!(!exec.stop(99, 1, 5, "x".into()), "an unknown attempt");
}

#[tokio::test]
async fn leases_and_time_limits_stop_attempts_with_the_enforcement_grace() {
    let (exec, mut ev, rt) = setup();
    let now = unix_now();
    exec.start(3, 1, spec("demo", 30), vec![], now + 3600);
    exec.start(4, 1, spec("demo", 3600), vec![], now + 5);
    ev.state_of(3, Some(AttemptState::Running)).await;
    ev.state_of(4, Some(AttemptState::Running)).await;

    exec.expire_leases(now + 10);
    let end = ev.final_of(4).await;
    assert_eq!(end.0, AttemptState::Stopped);
    assert_eq!(end.2.as_deref(), Some(REASON_LEASE));
    assert_eq!(state_in_reports(&exec, 3), Some(AttemptState::Running));

    exec.expire_leases(now + 40);
    let end = ev.final_of(3).await;
    assert_eq!(end.0, AttemptState::Stopped);
    assert_eq!(end.2.as_deref(), Some(REASON_TIME_LIMIT));
    for id in [id_of(3, 1), id_of(4, 1)] {
        assert!(rt.calls().contains(&Call::Stop(id, ENFORCE_GRACE)));
    }
}

#[tokio::test]
async fn containers_found_after_a_restart_are_adopted() {
    let (exec, mut ev, rt) = setup();
    let far = Duration::from_secs(u64::try_from(far_lease()).unwrap());
    rt.plant(5, 1, None, Some(far));
    rt.plant(6, 1, Some(0), Some(far));
    exec.adopt(120).await.unwrap();

    // The one that ended while no agent ran: reported with its code, then removed.
    assert_eq!(ev.final_of(6).await, (AttemptState::Exited, Some(0), None));
    assert_eq!(rt.ids(), [id_of(5, 1)]);
    // The running one is ours again, without a second start.
    assert_eq!(state_in_reports(&exec, 5), Some(AttemptState::Running));
    assert!(!rt.calls().iter().any(|c| matches!(c, Call::Create(..))));

    // Its lease is the adoption's until the portal renews it.
    let now = unix_now();
    exec.expire_leases(now + 60);
    assert_eq!(state_in_reports(&exec, 5), Some(AttemptState::Running));
    exec.expire_leases(now + 200);
    let end = ev.final_of(5).await;
    assert_eq!(end.0, AttemptState::Stopped);
    assert_eq!(end.2.as_deref(), Some(REASON_LEASE));
    assert!(
        !ev.seen.iter().any(|m| matches!(
            m,
            AgentMsg::AttemptEvent {
                state: AttemptState::Running,
                ..
            }
        )),
        "adoption is not a new start"
    );
}

#[tokio::test]
async fn a_missing_image_fails_with_the_reason() {
    let (exec, mut ev, rt) = setup();
    exec.start(7, 1, spec("missing:1", 60), vec![], far_lease());
    let (state, code, reason) = ev.final_of(7).await;
    assert_eq!((state, code), (AttemptState::Failed, None));
    assert!(reason.unwrap().contains("is not on this server"));
    assert!(rt.ids().is_empty());
    assert!(!rt.calls().iter().any(|c| matches!(c, Call::Remove(_))));
}

/// A GPU whose processes are fixed: the owner's unless the executor names them as ours.
struct OneGpu {
    pids: Vec<u32>,
}

impl GpuSource for OneGpu {
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(vec![])
    }

    fn stats(&self, our_pids: &BTreeSet<u32>) -> Result<Vec<GpuStat>, GpuError> {
        Ok(vec![GpuStat {
            uuid: "GPU-0".into(),
            utilization_pct: 50,
            memory_used_mb: 1,
            local_use: self.pids.iter().any(|p| !our_pids.contains(p)),
        }])
    }
}

#[tokio::test]
async fn gpu_processes_in_our_containers_are_not_local_use() {
    let (exec, mut ev, _rt) = setup();
    exec.start(8, 1, spec("demo", 600), vec![], far_lease());
    ev.state_of(8, Some(AttemptState::Running)).await;
    let ours = OneGpu { pids: vec![1008] };
    assert!(!exec.gpu_stats(&ours).await.unwrap()[0].local_use);
    let owner = OneGpu {
        pids: vec![1008, 4242],
    };
    assert!(exec.gpu_stats(&owner).await.unwrap()[0].local_use);
}
