//! Shares of one GPU against the real Docker Engine (issue 32 §3): two half shares of one
//! fake GPU run side by side with their variables (in the job and in an exec), a third
//! that would over-commit and a whole-GPU job are refused with their reasons; in
//! `timeslice` mode a share over its GPU memory (the fake GPU's per-process file, the pid
//! a real one in the container, found through its real `/proc/PID/cgroup`) is stopped as
//! failed while one within its cap runs on; in `mps` mode a stand-in MPS control daemon is
//! started for the shared GPU, its pipe directory mounted, started again when killed, and
//! stopped once the last share ends.

use super::{demo_image, guard_exe, lease_from_hello, new_agent_id, spec, Volumes};
use commons_agent::config::FakeGpuModel;
use commons_agent::executor::Executor;
use commons_agent::gpu::fake::{save_fake_processes, FakeGpus, FakeProcess};
use commons_agent::gpu::GpuSource;
use commons_agent::outbox::OutboxRx;
use commons_agent::runtime::{
    AssignedGpu, ContainerRuntime, DockerRuntime, ExecOutput, ExecRequest,
};
use commons_agent::share::ShareConfig;
use commons_agent::store::Store;
use commons_proto::{
    AgentMsg, AttemptState, GpuInfo, GpuShare, JobId, Lease, ShareMode, StopReason,
};
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// An agent over the real engine taking shares as `config` says, of one fake 40 GB GPU.
struct Agent {
    exec: Executor,
    rt: DockerRuntime,
    seen: Seen,
    gpu: GpuInfo,
    lease: Lease,
    _volumes: Volumes,
}

async fn agent(dir: &Path, config: Option<ShareConfig>) -> Agent {
    demo_image();
    let id = new_agent_id();
    let rt = DockerRuntime::connect(id.clone())
        .await
        .expect("the Docker Engine must run");
    let (tx, rx) = commons_agent::outbox::channel(Default::default());
    let store = Store::new(dir).with_guard(Some(guard_exe()));
    let exec = Executor::new(rt.clone(), tx, store);
    let gpus: Arc<dyn GpuSource> = Arc::new(FakeGpus::new(
        vec![FakeGpuModel {
            model: "A100-40GB".into(),
            memory_mb: 40 * 1024,
        }],
        dir.to_path_buf(),
    ));
    let inventory = gpus.inventory().unwrap();
    if let Some(c) = config {
        exec.set_shares(c, &inventory, gpus, dir);
    }
    let lease = lease_from_hello(&exec, 600);
    Agent {
        exec,
        rt,
        seen: Seen {
            rx,
            all: Vec::new(),
        },
        gpu: inventory[0].clone(),
        lease,
        _volumes: Volumes(dir.to_path_buf(), Some(id)),
    }
}

impl Agent {
    fn start(&self, job: JobId, cmd: &str, share: Option<(u32, u64)>) {
        let mut s = spec(cmd, 600);
        s.gpu_share = share.map(|(milli, gb)| GpuShare {
            milli,
            memory_mb: gb * 1024,
        });
        s.env
            .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "100".into());
        let gpus = vec![AssignedGpu {
            uuid: self.gpu.uuid.clone(),
            fake: true,
        }];
        self.exec.start(job, 1, s, gpus, self.lease);
    }

    fn container(&self, job: JobId) -> String {
        self.exec.running_container(job, 1).unwrap()
    }

    async fn main_pid(&self, job: JobId) -> u32 {
        let pid = self.rt.main_pid(&self.container(job)).await.unwrap();
        u32::try_from(pid).unwrap()
    }

    /// What `sh -c CMD` prints when run in the job's container as an SSH session's exec
    /// is (the container's environment, nothing added).
    async fn exec_output(&self, job: JobId, cmd: &str) -> String {
        let req = ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), cmd.into()],
            env: Vec::new(),
            tty: false,
        };
        let id = self
            .rt
            .exec_create(&self.container(job), &req)
            .await
            .unwrap();
        let mut io = self.rt.exec_start(&id, false).await.unwrap();
        let mut out = String::new();
        while let Some(piece) = tokio::time::timeout(WAIT, io.output.next())
            .await
            .expect("the exec ends")
        {
            let (ExecOutput::Out(b) | ExecOutput::Err(b)) = piece.unwrap();
            out.push_str(&String::from_utf8_lossy(&b));
        }
        out
    }
}

/// Everything the agent sent, and waits on it.
struct Seen {
    rx: OutboxRx,
    all: Vec<AgentMsg>,
}

impl Seen {
    /// Takes what arrives for up to `d`.
    async fn drain(&mut self, d: Duration) {
        if let Ok(Some(m)) = tokio::time::timeout(d, self.rx.recv()).await {
            self.all.push(m);
        }
        while let Some(m) = self.rx.try_recv() {
            self.all.push(m);
        }
    }

    fn logs(&self, job: JobId) -> String {
        self.all
            .iter()
            .filter_map(|m| match m {
                AgentMsg::Logs { job: j, chunk, .. } if *j == job => Some(chunk.as_str()),
                _ => None,
            })
            .collect()
    }

    fn end(&self, job: JobId) -> Option<(AttemptState, Option<StopReason>, Option<String>)> {
        self.all.iter().find_map(|m| match m {
            AgentMsg::AttemptEvent {
                job: j,
                state,
                stop,
                reason,
                ..
            } if *j == job && state.is_final() => Some((*state, *stop, reason.clone())),
            _ => None,
        })
    }

    /// Waits (taking messages meanwhile) until `check` gives something, failing after
    /// [`WAIT`] with `what` and the logs seen.
    async fn until<T>(&mut self, what: &str, mut check: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(t) = check(self) {
                return t;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {WAIT:?}; saw {:#?}",
                self.all
            );
            self.drain(Duration::from_millis(100)).await;
        }
    }

    async fn end_of(&mut self, job: JobId) -> (AttemptState, Option<StopReason>, Option<String>) {
        self.until(&format!("job {job} ends"), |s| s.end(job)).await
    }
}

fn write_procs(dir: &Path, gpu: &str, procs: &[(u32, u64)]) {
    let list = procs
        .iter()
        .map(|(pid, mb)| FakeProcess {
            pid: *pid,
            used_memory_mb: *mb,
        })
        .collect();
    save_fake_processes(dir, &BTreeMap::from([(gpu.to_string(), list)])).unwrap();
}

const SHOW: &str = "echo share $COMMONS_GPU_FRACTION $COMMONS_GPU_MEMORY_LIMIT_MB; exec sleep 600";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_shares_run_side_by_side_and_timeslice_stops_one_over_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let config = ShareConfig {
        mode: Some(ShareMode::Timeslice),
        watch_every: Duration::from_millis(200),
        ..ShareConfig::default()
    };
    let mut a = agent(dir.path(), Some(config)).await;
    let AgentMsg::Hello { share_mode, .. } = a.exec.hello("test", vec![]) else {
        unreachable!()
    };
    assert_eq!(share_mode, Some(ShareMode::Timeslice));

    a.start(1, SHOW, Some((500, 20)));
    a.start(2, SHOW, Some((500, 20)));
    for job in [1, 2] {
        a.seen
            .until(&format!("job {job} prints its share"), |s| {
                s.logs(job).contains("share 0.5 20480").then_some(())
            })
            .await;
    }
    let out = a
        .exec_output(2, "echo $COMMONS_GPU_FRACTION $COMMONS_GPU_MEMORY_LIMIT_MB")
        .await;
    assert_eq!(
        out.trim(),
        "0.5 20480",
        "an exec session sees the share's variables"
    );

    // A third share would over-commit the compute; a whole-GPU job cannot have it either.
    a.start(3, SHOW, Some((100, 1)));
    let (state, stop, reason) = a.seen.end_of(3).await;
    assert_eq!((state, stop), (AttemptState::Failed, None));
    assert_eq!(
        reason.as_deref(),
        Some(
            "not started: GPU GPU-fake-00-A100-40GB has 0 of its compute free, this share \
             needs 0.1"
        )
    );
    a.start(4, SHOW, None);
    let (state, _, reason) = a.seen.end_of(4).await;
    assert_eq!(state, AttemptState::Failed);
    assert!(reason.unwrap().contains("carries 2 share(s)"));

    // Job 1's process holds 23 GB of its 20 GB, job 2's 10 GB of its 20.
    let (p1, p2) = (a.main_pid(1).await, a.main_pid(2).await);
    write_procs(
        dir.path(),
        &a.gpu.uuid,
        &[(p1, 23 * 1024 + 100), (p2, 10 * 1024)],
    );
    let (state, stop, reason) = a.seen.end_of(1).await;
    assert_eq!((state, stop), (AttemptState::Failed, None));
    assert_eq!(
        reason.as_deref(),
        Some("used 23 GB of its 20 GB GPU memory")
    );
    assert!(a
        .seen
        .logs(1)
        .contains("stopped: used 23 GB of its 20 GB GPU memory"));
    let used = a
        .seen
        .until("job 2's GPU memory in the reports", |_| {
            a.exec
                .reports()
                .into_iter()
                .find(|r| r.job == 2 && r.gpu_memory_used_mb.is_some())
        })
        .await;
    assert_eq!(
        (used.state, used.gpu_memory_used_mb),
        (AttemptState::Running, Some(10 * 1024))
    );
    assert!(
        a.exec.running_container(2, 1).is_ok(),
        "job 2 keeps running"
    );

    // Job 1's half is free again: a new half fits.
    a.start(5, SHOW, Some((500, 20)));
    a.seen
        .until("job 5 prints its share", |s| {
            s.logs(5).contains("share 0.5 20480").then_some(())
        })
        .await;
    for job in [2, 5] {
        a.exec.stop(job, 1, 1, StopReason::Cancelled, None);
        a.seen.end_of(job).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_a_share_mode_refuses_a_share() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = agent(dir.path(), None).await;
    let AgentMsg::Hello { share_mode, .. } = a.exec.hello("test", vec![]) else {
        unreachable!()
    };
    assert_eq!(share_mode, None);
    a.start(1, SHOW, Some((500, 20)));
    let (state, _, reason) = a.seen.end_of(1).await;
    assert_eq!(state, AttemptState::Failed);
    assert!(reason.unwrap().contains("without --share-mode"));
}

/// A stand-in for `nvidia-cuda-mps-control -f`: says who it is in its pipe directory and
/// stays in the foreground.
const STAND_IN: &str = r#"#!/bin/sh
touch "$CUDA_MPS_PIPE_DIRECTORY/control"
echo "$$ $CUDA_VISIBLE_DEVICES $CUDA_MPS_LOG_DIRECTORY" > "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid"
exec sleep 600
"#;

fn daemon(pipe: &Path) -> Option<(u32, String)> {
    let text = std::fs::read_to_string(pipe.join("daemon.pid")).ok()?;
    let mut words = text.split_whitespace();
    let pid: u32 = words.next()?.parse().ok()?;
    let alive =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    alive.then_some((pid, text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_daemons_are_started_mounted_restarted_and_stopped_per_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("mps-stand-in.sh");
    std::fs::write(&script, STAND_IN).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = ShareConfig {
        mode: Some(ShareMode::Mps),
        mps_control: vec![script.to_string_lossy().into_owned()],
        watch_every: Duration::from_millis(200),
        mps_dir: Some(dir.path().join("mps")),
    };
    let mut a = agent(dir.path(), Some(config)).await;
    let uuid = a.gpu.uuid.clone();
    let pipe = a.exec.mps_pipe_dir(&uuid).unwrap();
    assert!(a.exec.mps_daemons().is_empty(), "no daemon before a share");

    let cmd = "echo mps $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PIPE_DIRECTORY \
               $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; ls /run/commons-mps; exec sleep 600";
    a.start(11, cmd, Some((500, 20)));
    let (first, text) = a.seen.until("the MPS daemon runs", |_| daemon(&pipe)).await;
    assert!(
        text.contains(&uuid),
        "CUDA_VISIBLE_DEVICES is the GPU: {text}"
    );
    a.seen
        .until("job 11 sees its variables and the pipes", |s| {
            let l = s.logs(11);
            (l.contains("mps 50 /run/commons-mps 0=20480M") && l.contains("daemon.pid"))
                .then_some(())
        })
        .await;
    a.start(12, cmd, Some((500, 20)));
    a.seen
        .until("job 12 runs", |s| {
            s.logs(12).contains("daemon.pid").then_some(())
        })
        .await;
    assert_eq!(
        a.exec.mps_daemons(),
        [uuid.clone()].into(),
        "one daemon per GPU"
    );
    assert_eq!(daemon(&pipe).map(|d| d.0), Some(first));

    // Killed, it is started again.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (second, _) = a
        .seen
        .until("the MPS daemon runs again", |_| {
            daemon(&pipe).filter(|(pid, _)| *pid != first)
        })
        .await;

    // One share left: the daemon stays; none: it goes.
    a.exec.stop(11, 1, 1, StopReason::Cancelled, None);
    a.seen.end_of(11).await;
    assert_eq!(daemon(&pipe).map(|d| d.0), Some(second));
    a.exec.stop(12, 1, 1, StopReason::Cancelled, None);
    a.seen.end_of(12).await;
    a.seen
        .until("the MPS daemon is stopped", |_| {
            (a.exec.mps_daemons().is_empty() && daemon(&pipe).is_none()).then_some(())
        })
        .await;
}
