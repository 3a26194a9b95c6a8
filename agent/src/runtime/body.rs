//! How a job's container looks: [`container_body`], the one place that decides it (pure,
//! unit-tested). Labelled with its job and attempt, non-root, no privileges, every
//! capability dropped, `no-new-privileges`, memory/CPU/pid limits, and the assigned GPUs
//! as an NVIDIA device request plus `NVIDIA_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES`, and
//! the attempt's checkpoint directory as its one host path (a bind mount at `/checkpoint`).
//!
//! An interactive job without a command gets [`KEEP_ALIVE`] as its entrypoint: the
//! container stays up (for its owner to SSH in) until its time limit, a stop or its lease,
//! and ends at once and cleanly on SIGTERM. An image without `/bin/sh` cannot run it (the
//! Docker runtime checks, and the job fails with `RuntimeError::NoShell`).

use super::{AssignedGpu, CheckpointMount, LABEL_AGENT};
use crate::checkpoint;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountType,
};
use commons_proto::{Attempt, JobId, JobSpec, LABEL_ATTEMPT, LABEL_JOB};
use std::collections::HashMap;

/// The uid:gid jobs run as: `nobody`, never root.
pub const JOB_USER: &str = "65534:65534";
const PIDS_LIMIT: i64 = 4096;

/// The shell that keeps an interactive job without a command alive. `sleep` runs in the
/// background and the shell `wait`s for it, so a SIGTERM interrupts the wait and the trap
/// ends the shell (and so the container) at once, instead of after the current `sleep`.
pub const KEEP_ALIVE: &str = "trap 'exit 0' TERM INT HUP; \
echo 'GPU Commons: interactive job ready; the container stays up until its time limit or a cancel'; \
while :; do sleep 3600 & wait $!; done";
/// The shell [`KEEP_ALIVE`] needs in the image.
pub const KEEP_ALIVE_SHELL: &str = "/bin/sh";

/// Whether the container runs [`KEEP_ALIVE`] instead of a command of the job's or the image's.
pub fn keeps_alive(spec: &JobSpec) -> bool {
    spec.interactive && spec.command.is_empty()
}

/// The container for one attempt. Pure: everything it decides is visible in the result.
pub fn container_body(
    agent_id: &str,
    job: JobId,
    attempt: Attempt,
    spec: &JobSpec,
    gpus: &[AssignedGpu],
    ckpt: &CheckpointMount,
) -> ContainerCreateBody {
    let env = job_env(job, attempt, spec, gpus, ckpt);
    let labels = HashMap::from([
        (LABEL_JOB.to_string(), job.to_string()),
        (LABEL_ATTEMPT.to_string(), attempt.to_string()),
        (LABEL_AGENT.to_string(), agent_id.to_string()),
        ("commons.user".to_string(), spec.user.clone()),
    ]);
    // The keep-alive replaces the image's entrypoint too: an entrypoint would take the
    // shell as its arguments (and the image's default command goes with it).
    let entrypoint = keeps_alive(spec).then(|| {
        vec![
            KEEP_ALIVE_SHELL.to_string(),
            "-c".to_string(),
            KEEP_ALIVE.to_string(),
        ]
    });
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint,
        cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
        env: Some(env),
        labels: Some(labels),
        user: Some(JOB_USER.into()),
        host_config: Some(host_config(spec, gpus, ckpt)),
        ..Default::default()
    }
}

/// The container's environment: the job's own variables, less those the agent sets; the
/// GPUs it may see; a writable home; who it is; where its checkpoint is.
fn job_env(
    job: JobId,
    attempt: Attempt,
    spec: &JobSpec,
    gpus: &[AssignedGpu],
    ckpt: &CheckpointMount,
) -> Vec<String> {
    let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    let visible = if uuids.is_empty() {
        "none".to_string()
    } else {
        uuids.join(",")
    };
    let mut env: Vec<String> = spec
        .env
        .iter()
        // The portal sets an array task's COMMONS_ARRAY_* (a user cannot: the API refuses
        // COMMONS_*); every other COMMONS_ variable is the agent's own.
        .filter(|(k, _)| {
            (!k.starts_with("COMMONS_") || k.starts_with("COMMONS_ARRAY_"))
                && !k.ends_with("_VISIBLE_DEVICES")
        })
        // A share's limits are the agent's, whatever the job says.
        .filter(|(k, _)| ckpt.share.is_none() || !k.starts_with("CUDA_MPS_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.push(format!("NVIDIA_VISIBLE_DEVICES={visible}"));
    env.push(format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")));
    // The image's filesystem is read-only (see `guest`): a home that can be written.
    if !spec.env.contains_key("HOME") {
        env.push("HOME=/tmp".into());
    }
    env.push(format!("COMMONS_JOB_ID={job}"));
    env.push(format!("COMMONS_ATTEMPT={attempt}"));
    env.push(format!(
        "{}={}",
        checkpoint::ENV_DIR,
        checkpoint::CONTAINER_DIR
    ));
    if ckpt.resumed {
        env.push(format!("{}=1", checkpoint::ENV_RESUME));
    }
    env.push(format!(
        "{}={}",
        crate::outputs::ENV_DIR,
        crate::outputs::CONTAINER_DIR
    ));
    if ckpt.inputs_dir.is_some() {
        env.push(format!(
            "{}={}",
            crate::inputs::ENV_DIR,
            crate::inputs::CONTAINER_DIR
        ));
    }
    if let Some(share) = &ckpt.share {
        env.retain(|v| {
            let name = v.split_once('=').map_or(v.as_str(), |(k, _)| k);
            !share.env.contains_key(name)
        });
        env.extend(share.env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    env
}

/// A read-write bind of the host directory `source` at `target`, private to the container.
fn bind(target: &str, source: &std::path::Path) -> Mount {
    Mount {
        target: Some(target.into()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(false),
        bind_options: Some(MountBindOptions {
            propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `/checkpoint` and `/outputs` read-write; `/inputs` read-only, when there are inputs.
fn mounts(ckpt: &CheckpointMount) -> Vec<Mount> {
    let mut m = vec![
        bind(checkpoint::CONTAINER_DIR, &ckpt.host_dir),
        bind(crate::outputs::CONTAINER_DIR, &ckpt.outputs_dir),
    ];
    if let Some(dir) = &ckpt.inputs_dir {
        m.push(Mount {
            read_only: Some(true),
            ..bind(crate::inputs::CONTAINER_DIR, dir)
        });
    }
    for (at, dir) in &ckpt.datasets {
        m.push(Mount {
            read_only: Some(true),
            ..bind(at, dir)
        });
    }
    if let Some(pipe) = ckpt.share.as_ref().and_then(|s| s.mps_pipe.as_ref()) {
        m.push(bind(commons_proto::share::MPS_PIPE_DIR, pipe));
    }
    m
}

/// The container's limits and lockdown, its GPUs' device request and its host paths (the
/// checkpoint and outputs directories, both in the attempt's volume).
fn host_config(spec: &JobSpec, gpus: &[AssignedGpu], ckpt: &CheckpointMount) -> HostConfig {
    let real: Vec<String> = gpus
        .iter()
        .filter(|g| !g.fake)
        .map(|g| g.uuid.clone())
        .collect();
    // Fake GPUs get no device request: no NVIDIA runtime could honour it.
    let device_requests = (!real.is_empty()).then(|| {
        vec![DeviceRequest {
            driver: Some("nvidia".into()),
            device_ids: Some(real),
            capabilities: Some(vec![vec!["gpu".into()]]),
            ..Default::default()
        }]
    });
    let memory = (spec.memory_mb as i64).saturating_mul(1024 * 1024);
    // The engine refuses a CPU limit above the host's CPUs; such a job gets all of them.
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpus = spec.cpus.min(host_cpus);
    HostConfig {
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some((cpus * 1e9) as i64),
        pids_limit: Some(PIDS_LIMIT),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        privileged: Some(false),
        init: Some(true),
        device_requests,
        mounts: Some(mounts(ckpt)),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            "rw,nosuid,nodev,size=1g".to_string(),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            inputs: Vec::new(),
            datasets: Vec::new(),
            image: "commons-demo:latest".into(),
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: [
                ("A".to_string(), "1".to_string()),
                ("COMMONS_JOB_ID".to_string(), "spoof".to_string()),
                ("COMMONS_ARRAY_INDEX".to_string(), "7".to_string()),
            ]
            .into(),
            cpus: 1.0,
            memory_mb: 1024,
            time_limit_s: 60,
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

    fn ckpt(resumed: bool) -> CheckpointMount {
        CheckpointMount {
            host_dir: "/var/lib/commons-agent/attempts/42-2/checkpoint".into(),
            resumed,
            outputs_dir: "/var/lib/commons-agent/attempts/42-2/outputs".into(),
            inputs_dir: None,
            datasets: Vec::new(),
            share: None,
        }
    }

    #[test]
    fn container_is_locked_down() {
        let gpus = [
            AssignedGpu {
                uuid: "GPU-a".into(),
                fake: false,
            },
            AssignedGpu {
                uuid: "GPU-b".into(),
                fake: false,
            },
        ];
        let body = container_body("ag", 42, 2, &spec(), &gpus, &ckpt(false));
        assert_eq!(body.user.as_deref(), Some(JOB_USER));
        let labels = body.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_JOB], "42");
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(labels[LABEL_AGENT], "ag");
        let hc = body.host_config.as_ref().unwrap();
        assert_eq!(hc.cap_drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(hc.memory, Some(1024 * 1024 * 1024));
        assert_eq!(hc.nano_cpus, Some(1_000_000_000));
        assert_eq!(hc.pids_limit, Some(PIDS_LIMIT));
        assert!(
            hc.binds.is_none(),
            "no host paths but the volume's two mounts"
        );
        let mounts = hc.mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[1].target.as_deref(), Some("/outputs"));
        assert_eq!(
            mounts[1].source.as_deref(),
            Some("/var/lib/commons-agent/attempts/42-2/outputs")
        );
        assert_eq!(mounts[1].read_only, Some(false));
        assert_eq!(mounts[0].typ, Some(MountType::BIND));
        assert_eq!(mounts[0].target.as_deref(), Some("/checkpoint"));
        assert_eq!(
            mounts[0].source.as_deref(),
            Some("/var/lib/commons-agent/attempts/42-2/checkpoint")
        );
        assert_eq!(mounts[0].read_only, Some(false));
        let dr = &hc.device_requests.as_ref().unwrap()[0];
        assert_eq!(
            dr.device_ids.as_deref(),
            Some(&["GPU-a".to_string(), "GPU-b".to_string()][..])
        );
        let env = body.env.as_ref().unwrap();
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
        assert!(env.contains(&"COMMONS_JOB_ID=42".to_string()));
        assert!(!env.contains(&"COMMONS_JOB_ID=spoof".to_string()));
        assert!(env.contains(&"COMMONS_ARRAY_INDEX=7".to_string()));
        assert!(env.contains(&"A=1".to_string()));
        assert!(env.contains(&"COMMONS_CHECKPOINT_DIR=/checkpoint".to_string()));
        assert!(env.contains(&"COMMONS_OUTPUTS_DIR=/outputs".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("COMMONS_RESUME")));
    }

    #[test]
    fn a_share_gets_the_agents_variables_over_the_jobs_and_its_mps_pipes() {
        let share = commons_proto::GpuShare {
            milli: 500,
            memory_mb: 20 * 1024,
        };
        let mut s = spec();
        s.gpu_share = Some(share);
        s.env
            .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "100".into());
        s.env
            .insert("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/mine".into());
        let mut c = ckpt(false);
        c.share = Some(crate::runtime::ShareMount {
            env: commons_proto::share_env(&share, commons_proto::ShareMode::Mps),
            mps_pipe: Some("/var/lib/commons-agent/mps/GPU-a/pipe".into()),
        });
        let gpus = [AssignedGpu {
            uuid: "GPU-a".into(),
            fake: false,
        }];
        let body = container_body("agent", 42, 2, &s, &gpus, &c);
        let env = body.env.as_ref().unwrap();
        let has = |v: &str| env.iter().filter(|e| e.as_str() == v).count() == 1;
        assert!(has("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"), "{env:?}");
        assert!(has("CUDA_MPS_PIPE_DIRECTORY=/run/commons-mps"), "{env:?}");
        assert!(has("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"), "{env:?}");
        assert!(has("COMMONS_GPU_FRACTION=0.5"), "{env:?}");
        assert!(has("COMMONS_GPU_MEMORY_LIMIT_MB=20480"), "{env:?}");
        assert!(has("CUDA_VISIBLE_DEVICES=GPU-a"), "{env:?}");
        assert!(!env
            .iter()
            .any(|e| e.contains("/tmp/mine") || e.ends_with("=100")));
        let mounts = body.host_config.unwrap().mounts.unwrap();
        let pipe = mounts
            .iter()
            .find(|m| m.target.as_deref() == Some(commons_proto::share::MPS_PIPE_DIR))
            .expect("the pipe directory is mounted");
        assert_eq!(
            pipe.source.as_deref(),
            Some("/var/lib/commons-agent/mps/GPU-a/pipe")
        );
        // A whole-GPU job keeps its own CUDA_MPS_ variables (nothing of the agent's).
        let body = container_body("agent", 42, 2, &s, &gpus, &ckpt(false));
        let env = body.env.unwrap();
        assert!(env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/mine".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("COMMONS_GPU_")));
    }

    #[test]
    fn a_restored_checkpoint_sets_commons_resume_and_the_job_cannot_spoof_it() {
        let mut s = spec();
        s.env.insert("COMMONS_RESUME".into(), "1".into());
        s.env.insert("COMMONS_CHECKPOINT_DIR".into(), "/tmp".into());
        let fresh = container_body("ag", 42, 2, &s, &[], &ckpt(false))
            .env
            .unwrap();
        assert!(
            !fresh.iter().any(|e| e.starts_with("COMMONS_RESUME")),
            "{fresh:?}"
        );
        assert!(!fresh.contains(&"COMMONS_CHECKPOINT_DIR=/tmp".to_string()));
        let resumed = container_body("ag", 42, 2, &s, &[], &ckpt(true))
            .env
            .unwrap();
        assert_eq!(
            resumed
                .iter()
                .filter(|e| e.starts_with("COMMONS_RESUME"))
                .count(),
            1
        );
        assert!(resumed.contains(&"COMMONS_RESUME=1".to_string()));
    }

    #[test]
    fn an_interactive_job_without_a_command_runs_the_keep_alive() {
        let mut s = spec();
        s.interactive = true;
        let with_command = container_body("ag", 1, 1, &s, &[], &ckpt(false));
        assert_eq!(with_command.entrypoint, None, "a command runs as given");
        assert_eq!(with_command.cmd.as_deref(), Some(&s.command[..]));
        s.command.clear();
        let body = container_body("ag", 1, 1, &s, &[], &ckpt(false));
        let entrypoint = body.entrypoint.unwrap();
        assert_eq!(entrypoint[..2], ["/bin/sh".to_string(), "-c".to_string()]);
        assert!(
            entrypoint[2].starts_with("trap 'exit 0' TERM"),
            "{entrypoint:?}"
        );
        assert!(
            entrypoint[2].contains("wait $!"),
            "SIGTERM must not wait for a sleep"
        );
        assert_eq!(body.cmd, None, "and not the image's default command");
        assert_eq!(
            body.user.as_deref(),
            Some(JOB_USER),
            "locked down as any job"
        );
        s.interactive = false;
        let batch = container_body("ag", 1, 1, &s, &[], &ckpt(false));
        assert_eq!(
            (batch.entrypoint, batch.cmd),
            (None, None),
            "a batch job without a command runs the image's default"
        );
    }

    #[test]
    fn fake_gpus_get_no_device_request() {
        let gpus = [AssignedGpu {
            uuid: "GPU-fake-00-A100-80GB".into(),
            fake: true,
        }];
        let body = container_body("ag", 1, 1, &spec(), &gpus, &ckpt(false));
        assert!(body.host_config.unwrap().device_requests.is_none());
        assert!(body
            .env
            .unwrap()
            .contains(&"NVIDIA_VISIBLE_DEVICES=GPU-fake-00-A100-80GB".to_string()));
    }
}
