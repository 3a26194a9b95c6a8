//! Shares on a real NVIDIA GPU with MPS: run only by `deploy/gpu-check/shares.sh` on a
//! server with a GPU, the NVIDIA container toolkit and MPS (`--ignored`; it has not run on
//! hardware yet). Two half shares of GPU 0 run a CUDA program from
//! `COMMONS_GPU_CHECK_IMAGE`; `nvidia-smi` must show the MPS server and both clients, and
//! each job its share's variables. Prints `PASS`/`FAIL` lines.

use super::{guard_exe, lease_from_hello, local_id, new_agent_id, Volumes};
use commons_agent::executor::Executor;
use commons_agent::gpu::{nvml::NvmlGpus, GpuSource};
use commons_agent::runtime::{AssignedGpu, DockerRuntime};
use commons_agent::share::ShareConfig;
use commons_agent::store::Store;
use commons_proto::{GpuShare, JobSpec, ShareMode, StopReason};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Holds a CUDA context and a little memory for a while (the image has PyTorch).
const HOLD: &str = "echo share $COMMONS_GPU_FRACTION $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE \
$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; python -c 'import torch, time; \
x = torch.ones(256, 1024, 1024, device=\"cuda\"); print(\"cuda ok\", flush=True); time.sleep(120)'";

fn check(name: &str, ok: bool, detail: &str) -> bool {
    println!(
        "{} {name}{}",
        if ok { "PASS" } else { "FAIL" },
        if ok {
            String::new()
        } else {
            format!(": {detail}")
        }
    );
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU with MPS: deploy/gpu-check/shares.sh runs it"]
async fn two_half_shares_run_under_mps_on_a_real_gpu() {
    let image = std::env::var("COMMONS_GPU_CHECK_IMAGE")
        .unwrap_or_else(|_| "pytorch/pytorch:latest".into());
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let id = new_agent_id();
    let _volumes = Volumes(dir.path().to_path_buf(), Some(id.clone()));
    let rt = DockerRuntime::connect(id)
        .await
        .expect("the Docker Engine must run");
    let (tx, mut rx) = commons_agent::outbox::channel(Default::default());
    let exec = Executor::new(rt, tx, Store::new(dir.path()).with_guard(Some(guard_exe())));
    let gpus: Arc<dyn GpuSource> = Arc::new(NvmlGpus::init().expect("NVML"));
    let inventory = gpus.inventory().unwrap();
    let gpu = inventory.first().expect("a GPU").clone();
    let config = ShareConfig {
        mode: Some(ShareMode::Mps),
        ..ShareConfig::default()
    };
    exec.set_shares(config, &inventory, gpus, dir.path());
    let lease = lease_from_hello(&exec, 600);
    let half = GpuShare {
        milli: 500,
        memory_mb: gpu.memory_mb / 2,
    };
    for job in [1, 2] {
        let spec = JobSpec {
            image: image.clone(),
            image_digest: Some(local_id(&image)),
            command: vec!["sh".into(), "-c".into(), HOLD.into()],
            memory_mb: 8192,
            cpus: 2.0,
            gpu_share: Some(half),
            ..super::spec("true", 600)
        };
        let assigned = vec![AssignedGpu {
            uuid: gpu.uuid.clone(),
            fake: false,
        }];
        exec.start(job, 1, spec, assigned, lease);
    }
    let mut logs = String::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    while logs.matches("cuda ok").count() < 2 && Instant::now() < deadline {
        if let Ok(Some(commons_proto::AgentMsg::Logs { chunk, .. })) =
            tokio::time::timeout(Duration::from_secs(1), rx.recv()).await
        {
            logs.push_str(&chunk);
        }
    }
    let pct = half.thread_percentage();
    let mut ok = check(
        "both shares hold a CUDA context",
        logs.matches("cuda ok").count() == 2,
        &logs,
    );
    let vars = format!("share 0.5 {pct} 0={}M", half.memory_mb);
    ok &= check(
        "each share sees its variables",
        logs.matches(&vars).count() == 2,
        &logs,
    );
    let smi = std::process::Command::new("nvidia-smi")
        .output()
        .expect("nvidia-smi");
    let smi = String::from_utf8_lossy(&smi.stdout).to_string();
    println!("{smi}");
    ok &= check(
        "nvidia-smi shows the MPS server",
        smi.contains("nvidia-cuda-mps-server"),
        &smi,
    );
    ok &= check(
        "nvidia-smi shows two MPS clients",
        smi.matches("M+C").count() >= 2,
        &smi,
    );
    ok &= check(
        "one MPS daemon for the GPU",
        exec.mps_daemons().len() == 1,
        "",
    );
    for job in [1, 2] {
        exec.stop(job, 1, 5, StopReason::Cancelled, None);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !exec.mps_daemons().is_empty() && Instant::now() < deadline {
        exec.watch_shares(&NvmlGpus::init().expect("NVML")).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
    }
    ok &= check(
        "the daemon stops with the last share",
        exec.mps_daemons().is_empty(),
        "",
    );
    assert!(ok, "see the FAIL lines");
}
