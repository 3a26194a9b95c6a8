//! The agent's one integration-test binary. Here: the executor against the real Docker
//! Engine (time limits, stops, reports); [`reconcile`] has the pure decision's table tests
//! and [`fake_runtime`] drives the executor through an in-memory runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_runtime;
mod reconcile;

use commons_agent::executor::Executor;
use commons_agent::runtime::{AssignedGpu, ContainerRuntime, DockerRuntime};
use commons_proto::{AgentMsg, AttemptState, JobSpec};
use std::time::Duration;
use tokio::sync::mpsc;

fn demo_image() {
    let have = std::process::Command::new("docker")
        .args(["image", "inspect", "commons-demo:latest"])
        .output()
        .expect("the docker CLI is needed (apt-get install docker.io)");
    if !have.status.success() {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/images/build-demo.sh"
        );
        let ok = std::process::Command::new("bash")
            .arg(script)
            .status()
            .unwrap();
        assert!(
            ok.success(),
            "building the demo image failed (apt-get install busybox-static)"
        );
    }
}

fn spec(cmd: &str, time_limit_s: u64) -> JobSpec {
    JobSpec {
        image: "commons-demo:latest".into(),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        env: Default::default(),
        cpus: 0.25,
        memory_mb: 128,
        time_limit_s,
        user: "tester".into(),
    }
}

async fn executor() -> (Executor, mpsc::UnboundedReceiver<AgentMsg>, DockerRuntime) {
    demo_image();
    let id = format!("test{:012x}", rand_id());
    let rt = DockerRuntime::connect(id)
        .await
        .expect("the Docker Engine must run");
    let (tx, rx) = mpsc::unbounded_channel();
    (Executor::new(rt.clone(), tx), rx, rt)
}

fn rand_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ (std::process::id() as u64) << 32
}

/// Waits for the final event of an attempt, collecting its output.
async fn final_event(
    rx: &mut mpsc::UnboundedReceiver<AgentMsg>,
) -> (AttemptState, Option<i64>, Option<String>, String) {
    let mut logs = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let msg = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("no final event within 60 s")
            .expect("channel open");
        match msg {
            AgentMsg::Logs { chunk, .. } => logs.push_str(&chunk),
            AgentMsg::AttemptEvent {
                state,
                exit_code,
                reason,
                ..
            } if state.is_final() => return (state, exit_code, reason, logs),
            _ => {}
        }
    }
}

fn far_lease() -> i64 {
    chrono::Utc::now().timestamp() + 3600
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_and_output_come_back_and_the_container_goes() {
    let (exec, mut rx, rt) = executor().await;
    exec.start(
        1,
        1,
        spec("echo out; echo err >&2; exit 7", 60),
        vec![],
        far_lease(),
    );
    let (state, code, _, logs) = final_event(&mut rx).await;
    assert_eq!((state, code), (AttemptState::Exited, Some(7)));
    assert!(logs.contains("out") && logs.contains("err"), "{logs:?}");
    assert!(
        rt.list().await.unwrap().is_empty(),
        "the container is removed"
    );
    let reports = exec.reports();
    assert_eq!(
        reports[0].exit_code,
        Some(7),
        "the final state is repeated in heartbeats"
    );
    exec.renew(far_lease(), &[]);
    assert!(
        exec.reports().is_empty(),
        "forgotten once the portal stops renewing it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_limit_is_enforced() {
    let (exec, mut rx, _rt) = executor().await;
    let started = std::time::Instant::now();
    exec.start(2, 1, spec("sleep 120", 2), vec![], far_lease());
    let (state, _, reason, _) = final_event(&mut rx).await;
    assert_eq!(state, AttemptState::Stopped);
    assert_eq!(reason.as_deref(), Some("time limit reached"));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_uses_the_grace_period_and_an_expired_lease_stops_the_job() {
    let (exec, mut rx, _rt) = executor().await;
    // The job traps SIGTERM and writes a last word: the grace period lets it.
    exec.start(
        3,
        1,
        spec(
            "trap 'echo checkpointing; exit 0' TERM; while true; do sleep 0.2; done",
            600,
        ),
        vec![],
        far_lease(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(exec.stop(3, 1, 5, "preempted: owner needs the GPU".into()));
    let (state, _, reason, logs) = final_event(&mut rx).await;
    assert_eq!(state, AttemptState::Stopped);
    assert_eq!(reason.as_deref(), Some("preempted: owner needs the GPU"));
    assert!(
        logs.contains("checkpointing"),
        "SIGTERM first, within the grace: {logs:?}"
    );
    assert!(
        !exec.stop(99, 1, 5, "x".into()),
        "an unknown attempt is not ours"
    );

    let lease = chrono::Utc::now().timestamp() + 1;
    exec.start(
        4,
        1,
        spec("sleep 120", 600),
        vec![AssignedGpu {
            uuid: "GPU-fake-00".into(),
            fake: true,
        }],
        lease,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    exec.expire_leases(chrono::Utc::now().timestamp());
    let (state, _, reason, _) = final_event(&mut rx).await;
    assert_eq!(state, AttemptState::Stopped);
    assert!(reason.unwrap().starts_with("lease expired"));
}
