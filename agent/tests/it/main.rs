//! The agent's one integration-test binary. [`reconcile`] has the pure decision's table
//! tests; [`fake_runtime`] is an in-memory runtime that [`executor`] and [`restart`] drive
//! the executor through; [`docker`] runs the executor against the real Docker Engine, and
//! [`guard`] checks the per-attempt guard process there while the agent is down.
//! [`checkpoints`] drives restores and uploads through the executor against
//! [`portal_double`], a test double of the portal's checkpoint API over HTTP. [`extend`]
//! moves a running attempt's time limit as a `Renew` asks. [`images`] checks pins, pulls
//! and signatures against the real engine. [`logs`] holds a flooding job's output to its
//! rate there. [`signals`] checks that an SSH user's signals never outlive their exec.
//! [`host`] stops the containers of an earlier identity of the same host. [`shares`] runs
//! shares of one fake GPU (both modes, MPS with a stand-in daemon).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod checkpoints;
mod disk_caps;
mod disk_volumes;
mod docker;
mod executor;
mod extend;
mod fake_runtime;
mod guard;
mod guests;
mod host;
mod images;
mod inputs;
mod logs;
mod portal_double;
mod reconcile;
mod reconcile_checkpoints;
mod registry;
mod restart;
mod shares;
mod shares_nvml;
mod signals;

use commons_agent::executor::Executor;
use commons_agent::outbox::{self, OutboxRx};
use commons_agent::runtime::DockerRuntime;
use commons_agent::store::Store;
use commons_proto::{AgentMsg, AttemptState, JobSpec, Lease, StopReason};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
        inputs: Vec::new(),
        datasets: Vec::new(),
        image_digest: Some(local_id("commons-demo:latest")),
        image_signature: None,
        image_campus: true,
        disk_gb: None,
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
        gpu_share: None,
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
async fn docker_agent(id: &str, dir: &Path) -> (Executor, OutboxRx, DockerRuntime) {
    demo_image();
    let rt = DockerRuntime::connect(id.to_string())
        .await
        .expect("the Docker Engine must run");
    let (tx, rx) = outbox::channel(Default::default());
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
async fn final_event(rx: &mut OutboxRx) -> Final {
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

/// Free KiB, for unprivileged users, on the file system that holds `path` (`df`). Fails
/// the test when it cannot be read: a free-space check that reads 0 proves nothing.
fn free_kib(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-k", "--output=avail"])
        .arg(path)
        .output()
        .expect("the df command");
    assert!(
        out.status.success(),
        "df {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df {}: no figure in {:?}", path.display(), out.stdout))
}

/// KiB that the files below `path` take on disk (`du`), failing the test when unread.
fn du_kib(path: &Path) -> u64 {
    // -x: the image's content is counted once, as the image file, not again through
    // its mount point.
    let out = std::process::Command::new("du")
        .arg("-skx")
        .arg(path)
        .output()
        .expect("the du command");
    assert!(out.status.success(), "du {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("du {}: no figure", path.display()))
}

/// The loop devices whose backing file lies below `dir` (the kernel's own list).
fn loops_backed_by(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let file = e.path().join("loop/backing_file");
        if let Ok(back) = std::fs::read_to_string(&file) {
            if back.trim_end().starts_with(dir.to_str().unwrap()) {
                out.push(format!(
                    "{}: {}",
                    e.file_name().to_string_lossy(),
                    back.trim()
                ));
            }
        }
    }
    out
}

/// When a test ends, however it ends: removes the containers of its agent (named by id,
/// if any; a running container keeps its volume's loop device) and releases every job
/// volume still mounted below its state dir, so a failed test leaks no container, mount
/// or loop device on the shared host.
struct Volumes(PathBuf, Option<String>);

impl Drop for Volumes {
    fn drop(&mut self) {
        if let Some(agent) = &self.1 {
            let label = format!("label={}={agent}", commons_agent::runtime::LABEL_AGENT);
            if let Ok(out) = std::process::Command::new("docker")
                .args(["ps", "-aq", "--filter", &label])
                .output()
            {
                for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = std::process::Command::new("docker")
                        .args(["rm", "-f", id])
                        .output();
                }
            }
        }
        commons_agent::disk::release_all(&self.0);
    }
}

/// A disk policy that holds caps with images (root, loop devices and mkfs.ext4: the
/// agent's own check at start must pass), with no floor.
fn image_policy(state_dir: &Path) -> commons_agent::disk::DiskPolicy {
    commons_agent::disk::DiskPolicy {
        max_job_gb: 4,
        floor: commons_agent::disk::Floor::Percent(0),
        mode: commons_agent::disk::CapMode::Image,
    }
    .settled(state_dir)
    .expect("volumes as images: this test needs root, loop devices and mkfs.ext4")
}
