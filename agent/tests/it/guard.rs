//! The per-attempt guard against the real engine, with the agent gone: attempts are
//! started through the executor, then the executor (the whole agent) is dropped, and the
//! guard process alone must enforce the lease and the time limit. A restarted agent then
//! reports what the guard did, or re-adopts with the deadline on disk.

use super::{docker_agent, final_event, lease_from_hello, new_agent_id, spec};
use commons_agent::outbox::OutboxRx;
use commons_agent::runtime::{ContainerRuntime, ContainerStatus, DockerRuntime};
use commons_agent::store::{self, LeaseFile, StoppedFile};
use commons_agent::{clock, guard};
use commons_proto::{AgentMsg, AttemptState, StopReason};
use std::path::Path;
use std::time::Duration;

/// Slack the guard gets past a deadline: its poll, the stop, the engine.
const SLACK: Duration = Duration::from_secs(5);

async fn running_event(rx: &mut OutboxRx) {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("no Running event within 30 s")
            .expect("channel open");
        if let AgentMsg::AttemptEvent { state, .. } = msg {
            assert_eq!(state, AttemptState::Running, "{msg:?}");
            return;
        }
    }
}

fn lease_file(attempt_dir: &Path) -> LeaseFile {
    store::read_json(&attempt_dir.join(store::LEASE_FILE))
        .unwrap()
        .expect("lease.json")
}

async fn until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + within;
    while !ok() {
        assert!(
            tokio::time::Instant::now() < end,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the container no longer runs, at the latest at `by` (boot clock); returns
/// when it was seen down.
async fn ended_by(rt: &DockerRuntime, id: &str, by: Duration) -> Duration {
    loop {
        match rt.inspect(id).await.unwrap() {
            ContainerStatus::Running => {
                let now = clock::now();
                assert!(now <= by, "still running {:?} after the limit", now - by);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return clock::now(),
        }
    }
}

/// Starts job `job` through a fresh agent, waits until it runs and its guard holds the
/// lock, then drops the agent. Returns the container id and the attempt's dir.
async fn start_then_drop_the_agent(
    agent_id: &str,
    dir: &Path,
    job: i64,
    cmd_limit_s: u64,
    lease_s: u64,
) -> (String, std::path::PathBuf) {
    let (exec, mut rx, _rt) = docker_agent(agent_id, dir).await;
    exec.start(
        job,
        1,
        spec("sleep 300", cmd_limit_s),
        vec![],
        lease_from_hello(&exec, lease_s),
    );
    running_event(&mut rx).await;
    let attempt_dir = store::attempt_dir(dir, job, 1);
    until("the guard runs", Duration::from_secs(10), || {
        guard::is_running(&attempt_dir)
    })
    .await;
    let container = lease_file(&attempt_dir).container.expect("container id");
    // The agent is gone: no executor, no tick, nobody renewing.
    drop(exec);
    drop(rx);
    (container, attempt_dir)
}

async fn guard_stops_alone(job: i64, limit_s: u64, lease_s: u64, reason: StopReason) {
    let dir = tempfile::tempdir().unwrap();
    let agent_id = new_agent_id();
    let before = clock::now();
    let (container, attempt_dir) =
        start_then_drop_the_agent(&agent_id, dir.path(), job, limit_s, lease_s).await;
    let rt = DockerRuntime::connect(agent_id.clone()).await.unwrap();
    let deadline = before + Duration::from_secs(limit_s.min(lease_s));
    let down = ended_by(&rt, &container, deadline + SLACK).await;
    assert!(down >= deadline, "stopped {:?} early", deadline - down);
    let stopped: StoppedFile = store::read_json(&attempt_dir.join(store::STOPPED_FILE))
        .unwrap()
        .expect("stopped.json: the guard says why");
    assert_eq!(stopped.reason, reason);
    until("the guard exits", Duration::from_secs(10), || {
        !guard::is_running(&attempt_dir)
    })
    .await;

    // A later agent reports the guard's reason and cleans up.
    let (exec, mut rx, rt) = docker_agent(&agent_id, dir.path()).await;
    exec.adopt().await.unwrap();
    let end = final_event(&mut rx).await;
    assert_eq!((end.state, end.stop), (AttemptState::Stopped, Some(reason)));
    assert!(rt.list().await.unwrap().is_empty(), "removed once reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_stops_a_container_whose_lease_ran_out_while_the_agent_is_down() {
    guard_stops_alone(20, 3600, 3, StopReason::LeaseExpired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_enforces_the_time_limit_while_the_agent_is_down() {
    guard_stops_alone(21, 3, 3600, StopReason::TimeLimit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_before_the_deadline_readopts_with_the_deadline_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let agent_id = new_agent_id();
    let (container, attempt_dir) =
        start_then_drop_the_agent(&agent_id, dir.path(), 22, 3600, 8).await;
    let on_disk = lease_file(&attempt_dir);
    let guard_pid = std::fs::read_to_string(attempt_dir.join(store::GUARD_PID_FILE)).unwrap();

    let (exec, mut rx, rt) = docker_agent(&agent_id, dir.path()).await;
    exec.adopt().await.unwrap();
    assert_eq!(
        exec.lease_deadline(22, 1),
        Some(clock::from_ms(on_disk.lease_deadline_ms)),
        "the deadline on disk, not a fresh lease"
    );
    assert_eq!(
        exec.time_limit_deadline(22, 1),
        on_disk.time_limit_deadline_ms.map(clock::from_ms)
    );
    assert_eq!(
        rt.inspect(&container).await.unwrap(),
        ContainerStatus::Running
    );
    assert_eq!(
        std::fs::read_to_string(attempt_dir.join(store::GUARD_PID_FILE)).unwrap(),
        guard_pid,
        "the same guard goes on; no second one"
    );

    // The new agent's portal renews before the old deadline: nothing stops the container.
    exec.renew(lease_from_hello(&exec, 3600), &[(22, 1)]);
    assert!(lease_file(&attempt_dir).lease_deadline_ms > on_disk.lease_deadline_ms);
    let old = clock::from_ms(on_disk.lease_deadline_ms);
    tokio::time::sleep((old + Duration::from_secs(2)).saturating_sub(clock::now())).await;
    assert_eq!(
        rt.inspect(&container).await.unwrap(),
        ContainerStatus::Running,
        "renewed: neither the agent nor the guard stops it"
    );

    assert!(exec.stop(22, 1, 1, StopReason::Cancelled, None));
    let end = final_event(&mut rx).await;
    assert_eq!(
        (end.state, end.stop),
        (AttemptState::Stopped, Some(StopReason::Cancelled))
    );
}

/// The guard's pid, as it wrote it in `guard.pid`.
fn guard_pid(attempt_dir: &Path) -> String {
    std::fs::read_to_string(attempt_dir.join(store::GUARD_PID_FILE))
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_attempt_dir_under_a_running_guard_stops_the_container() {
    // The state dir is lost (wiped, a disk replaced) while the agent is down: the guard
    // must not take that for "the attempt is over" and leave the container running.
    let dir = tempfile::tempdir().unwrap();
    let agent_id = new_agent_id();
    let (container, attempt_dir) =
        start_then_drop_the_agent(&agent_id, dir.path(), 23, 3600, 3600).await;
    let rt = DockerRuntime::connect(agent_id.clone()).await.unwrap();
    std::fs::remove_dir_all(&attempt_dir).unwrap();
    let removed = clock::now();
    // A poll, then SIGTERM (the job ends on it at once; at worst the grace, then SIGKILL).
    let by = removed + commons_agent::reconcile::ENFORCE_GRACE + SLACK;
    let down = ended_by(&rt, &container, by).await;
    println!(
        "the container stopped {:.1} s after its attempt's directory was removed",
        (down - removed).as_secs_f64()
    );
    rt.remove(&container).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_stops_at_the_deadline_even_when_stopped_json_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let agent_id = new_agent_id();
    let before = clock::now();
    let lease_s = 8;
    let (container, attempt_dir) =
        start_then_drop_the_agent(&agent_id, dir.path(), 24, 3600, lease_s).await;
    // A directory where stopped.json goes: it can be neither read nor written (root
    // ignores file modes, so a read-only file would not do).
    std::fs::create_dir(attempt_dir.join(store::STOPPED_FILE)).unwrap();
    let rt = DockerRuntime::connect(agent_id.clone()).await.unwrap();
    let deadline = before + Duration::from_secs(lease_s);
    let down = ended_by(&rt, &container, deadline + SLACK).await;
    assert!(down >= deadline, "stopped {:?} early", deadline - down);
    let log = std::fs::read_to_string(attempt_dir.join(store::GUARD_LOG_FILE)).unwrap();
    assert!(
        log.contains("stopping all the same"),
        "the guard says why the reason is missing: {log}"
    );
    rt.remove(&container).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_guard_is_started_again_by_the_running_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent_id = new_agent_id();
    let (exec, mut rx, _rt) = docker_agent(&agent_id, dir.path()).await;
    exec.start(
        25,
        1,
        spec("sleep 300", 3600),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    running_event(&mut rx).await;
    let attempt_dir = store::attempt_dir(dir.path(), 25, 1);
    until("the guard runs", Duration::from_secs(10), || {
        guard::is_running(&attempt_dir)
    })
    .await;
    let first = guard_pid(&attempt_dir);
    let killed = std::process::Command::new("kill")
        .args(["-9", &first])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {first}");
    let t0 = std::time::Instant::now();
    until("a new guard runs", Duration::from_secs(10), || {
        guard::is_running(&attempt_dir) && guard_pid(&attempt_dir) != first
    })
    .await;
    println!(
        "a new guard ({}) ran {:.1} s after the first ({first}) was killed",
        guard_pid(&attempt_dir),
        t0.elapsed().as_secs_f64()
    );
    assert!(exec.stop(25, 1, 1, StopReason::Cancelled, None));
    let end = final_event(&mut rx).await;
    assert_eq!(
        (end.state, end.stop),
        (AttemptState::Stopped, Some(StopReason::Cancelled))
    );
}
