//! The agent's one integration-test binary. [`reconcile`] has the pure decision's table
//! tests; [`fake_runtime`] is an in-memory runtime that [`executor`] and [`restart`] drive
//! the executor through; [`docker`] runs the executor against the real Docker Engine, and
//! [`guard`] checks the per-attempt guard process there while the agent is down.
//! [`checkpoints`] drives restores and uploads through the executor against
//! [`portal_double`], a test double of the portal's checkpoint API over HTTP. [`extend`]
//! moves a running attempt's time limit as a `Renew` asks. [`images`] checks pins, pulls
//! and signatures against the real engine. [`host`] stops the containers of an earlier
//! identity of the same host.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod checkpoints;
mod docker;
mod executor;
mod extend;
mod fake_runtime;
mod guard;
mod guests;
mod host;
mod images;
mod portal_double;
mod reconcile;
mod reconcile_checkpoints;
mod restart;

use commons_agent::executor::Executor;
use commons_agent::runtime::DockerRuntime;
use commons_agent::store::Store;
use commons_proto::{AgentMsg, AttemptState, JobSpec, Lease, StopReason};
use std::path::{Path, PathBuf};
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

/// The image's ID in the local engine, as the allow-list pins it.
fn local_id(image: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .output()
        .expect("the docker CLI is needed (apt-get install docker.io)");
    assert!(out.status.success(), "docker image inspect {image}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn spec(cmd: &str, time_limit_s: u64) -> JobSpec {
    demo_image();
    JobSpec {
        image_digest: Some(local_id("commons-demo:latest")),
        image_signature: None,
        image: "commons-demo:latest".into(),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        env: Default::default(),
        cpus: 0.25,
        memory_mb: 128,
        time_limit_s,
        user: "tester".into(),
        checkpoint_interval_s: None,
        shm_mb: None,
        interactive: false,
        guest: false,
        lab: None,
        grace_s: None,
    }
}

/// This crate's `commons-agent` executable, run as the attempts' guard.
fn guard_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_commons-agent"))
}

/// A fresh agent id: agents sharing the engine never touch each other's containers.
fn new_agent_id() -> String {
    format!("test{:016x}", rand::random::<u64>())
}

/// One agent process over the real engine: agent id `id`, state dir `dir`, with guards.
async fn docker_agent(
    id: &str,
    dir: &Path,
) -> (Executor, mpsc::UnboundedReceiver<AgentMsg>, DockerRuntime) {
    demo_image();
    let rt = DockerRuntime::connect(id.to_string())
        .await
        .expect("the Docker Engine must run");
    let (tx, rx) = mpsc::unbounded_channel();
    let store = Store::new(dir).with_guard(Some(guard_exe()));
    (Executor::new(rt.clone(), tx, store), rx, rt)
}

/// The agent says `Hello`; the portal answers with a lease counted from it.
fn lease_from_hello(exec: &Executor, valid_for_s: u64) -> Lease {
    let AgentMsg::Hello { session, seq, .. } = exec.hello("test", vec![]) else {
        unreachable!()
    };
    Lease {
        session,
        seq,
        valid_for_s,
    }
}

/// The final event of an attempt, with the output collected on the way.
#[derive(Debug)]
struct Final {
    state: AttemptState,
    exit_code: Option<i64>,
    stop: Option<StopReason>,
    reason: Option<String>,
    logs: String,
}

/// Waits for the final event of an attempt, collecting its output.
async fn final_event(rx: &mut mpsc::UnboundedReceiver<AgentMsg>) -> Final {
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
                stop,
                reason,
                ..
            } if state.is_final() => {
                return Final {
                    state,
                    exit_code,
                    stop,
                    reason,
                    logs,
                }
            }
            _ => {}
        }
    }
}
