//! The production [`ContainerRuntime`]: the Docker Engine through bollard.
//!
//! [`container_body`] is the one place that decides how a job's container looks (pure,
//! unit-tested): labelled with its job and attempt, non-root, no privileges, every
//! capability dropped, `no-new-privileges`, memory/CPU/pid limits, and the assigned GPUs
//! as an NVIDIA device request plus `NVIDIA_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES`, and
//! the attempt's checkpoint directory as its one host path (a bind mount at `/checkpoint`).
//! The image runs only at its pinned digest and is created from that ID, never from the
//! tag (see [`super::images`]); it is pulled only from registries the node allows, and
//! only by digest.
//!
//! An interactive job without a command gets [`KEEP_ALIVE`] as its entrypoint: the
//! container stays up (for its owner to SSH in) until its time limit, a stop or its lease,
//! and ends at once and cleanly on SIGTERM. An image without `/bin/sh` cannot run it: the
//! container is removed before it starts and the job fails with [`RuntimeError::NoShell`].

use super::images::{self, ImagePolicy};
use super::{
    container_name, guest, AssignedGpu, CheckpointMount, ContainerRuntime, ContainerStatus,
    FoundContainer, RuntimeError, LABEL_AGENT,
};
use crate::checkpoint;
use crate::host::LABEL_HOST;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountType,
};
use bollard::query_parameters::{
    ContainerArchiveInfoOptions, CreateContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StopContainerOptions, TopOptions, WaitContainerOptions,
};
use bollard::Docker;
use commons_proto::{Attempt, JobId, JobSpec, LABEL_ATTEMPT, LABEL_JOB};
use futures_util::{Stream, StreamExt};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

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
    let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    let visible = if uuids.is_empty() {
        "none".to_string()
    } else {
        uuids.join(",")
    };
    let mut env: Vec<String> = spec
        .env
        .iter()
        .filter(|(k, _)| !k.starts_with("COMMONS_") && !k.ends_with("_VISIBLE_DEVICES"))
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
    let real: Vec<String> = gpus
        .iter()
        .filter(|g| !g.fake)
        .map(|g| g.uuid.clone())
        .collect();
    let device_requests = (!real.is_empty()).then(|| {
        vec![DeviceRequest {
            driver: Some("nvidia".into()),
            device_ids: Some(real),
            capabilities: Some(vec![vec!["gpu".into()]]),
            ..Default::default()
        }]
    });
    let labels = HashMap::from([
        (LABEL_JOB.to_string(), job.to_string()),
        (LABEL_ATTEMPT.to_string(), attempt.to_string()),
        (LABEL_AGENT.to_string(), agent_id.to_string()),
        ("commons.user".to_string(), spec.user.clone()),
    ]);
    let memory = (spec.memory_mb as i64).saturating_mul(1024 * 1024);
    // The engine refuses a CPU limit above the host's CPUs; such a job gets all of them.
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpus = spec.cpus.min(host_cpus);
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
        host_config: Some(HostConfig {
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some((cpus * 1e9) as i64),
            pids_limit: Some(PIDS_LIMIT),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            privileged: Some(false),
            init: Some(true),
            device_requests,
            mounts: Some(vec![Mount {
                target: Some(checkpoint::CONTAINER_DIR.into()),
                source: Some(ckpt.host_dir.to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(false),
                bind_options: Some(MountBindOptions {
                    propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                "rw,nosuid,nodev,size=1g".to_string(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    agent_id: String,
    /// The host's id (`host`), put on every container as [`LABEL_HOST`]; `None`: none
    /// (the guards, and tests that run the runtime alone).
    host_id: Option<String>,
    /// The network and write caps of every container (see `guest`).
    isolation: guest::Isolation,
    /// Pulls and signatures (see `images`).
    images: ImagePolicy,
}

impl DockerRuntime {
    /// Connects to the local engine and negotiates the API version (Debian's engine may be
    /// older than bollard's default).
    pub async fn connect(agent_id: String) -> Result<Self, RuntimeError> {
        let docker = Docker::connect_with_local_defaults()?
            .negotiate_version()
            .await?;
        docker.ping().await?;
        Ok(Self {
            docker,
            agent_id,
            host_id: None,
            isolation: guest::Isolation::default(),
            images: ImagePolicy::default(),
        })
    }

    /// The same runtime, labelling every container with the host's id (see `host`).
    pub fn with_host_id(mut self, host_id: String) -> Self {
        self.host_id = Some(host_id);
        self
    }

    /// The host's id, if the runtime labels containers with one.
    pub fn host_id(&self) -> Option<&str> {
        self.host_id.as_deref()
    }

    /// This agent's id (`commons.agent` on its containers).
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The same runtime, with the node's image settings.
    pub fn with_images(mut self, images: ImagePolicy) -> Self {
        self.images = images;
        self
    }

    /// The same runtime, with containers isolated as `iso` says; makes what that needs
    /// (the guests' bridge and its firewall rules for `egress`).
    pub async fn with_isolation(mut self, iso: guest::Isolation) -> Result<Self, RuntimeError> {
        guest::prepare(&self.docker, &iso).await?;
        self.isolation = iso;
        Ok(self)
    }

    /// The engine client, for what is not the executor's business (SSH relays).
    pub fn docker(&self) -> Docker {
        self.docker.clone()
    }
}

impl DockerRuntime {
    /// Whether a created (not started) container's image has [`KEEP_ALIVE_SHELL`]. The
    /// engine would start a container without it all the same, and the init process
    /// would exit 127 with a message only the logs hold; asking first gives the job's
    /// owner a reason that says what to do.
    async fn check_shell(&self, id: &str, image: &str) -> Result<(), RuntimeError> {
        let options = ContainerArchiveInfoOptions {
            path: KEEP_ALIVE_SHELL.into(),
        };
        match self
            .docker
            .get_container_archive_info(id, Some(options))
            .await
        {
            Ok(_) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Err(RuntimeError::NoShell(image.to_string())),
            Err(e) => Err(e.into()),
        }
    }
}

impl DockerRuntime {
    /// The image ID to create the container from, after the checks of `images` (pin,
    /// signature, whose pins a local copy serves, local ID, pulls only where allowed and
    /// only by digest).
    async fn resolve_image(&self, spec: &JobSpec) -> Result<String, RuntimeError> {
        let pin = self.images.check_spec(spec)?;
        if !self.images.local_ok(spec) {
            // Another lab's own entry: never look at (or reveal) what this engine holds.
            if !self.images.may_pull(&spec.image) {
                return Err(RuntimeError::NotSharedHere {
                    image: spec.image.clone(),
                    lab: spec.lab.clone().unwrap_or_else(|| "another".into()),
                    registry: images::registry_of(&spec.image).to_string(),
                });
            }
            return self.pull_by_digest(spec, pin).await;
        }
        match self.docker.inspect_image(&spec.image).await {
            Ok(info) => {
                let local = info.id.unwrap_or_default();
                images::compare(&spec.image, &local, pin)?;
                return Ok(local);
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => return Err(e.into()),
        }
        if !self.images.may_pull(&spec.image) {
            return Err(RuntimeError::ImageMissing(spec.image.clone()));
        }
        self.pull_by_digest(spec, pin).await
    }

    /// Pulls `REPOSITORY@pin` from the image's registry (the caller checked the node
    /// allows it) and answers the pulled image's ID, once it is shown to be the pin.
    async fn pull_by_digest(&self, spec: &JobSpec, pin: &str) -> Result<String, RuntimeError> {
        let by_digest = format!("{}@{pin}", images::repository_of(&spec.image));
        tracing::info!(image = %by_digest, "pulling an allowed image by digest");
        let mut pull = self.docker.create_image(
            Some(bollard::query_parameters::CreateImageOptions {
                from_image: Some(by_digest.clone()),
                ..Default::default()
            }),
            None,
            None,
        );
        while let Some(step) = pull.next().await {
            step.map_err(|e| RuntimeError::PullFailed(by_digest.clone(), e.to_string()))?;
        }
        let info = self
            .docker
            .inspect_image(&by_digest)
            .await
            .map_err(|e| RuntimeError::PullFailed(by_digest.clone(), e.to_string()))?;
        let local = info.id.unwrap_or_default();
        let digests = info.repo_digests.unwrap_or_default();
        if !images::pulled_is_pin(&local, &digests, &by_digest, pin) {
            // Neither its ID nor a registry digest of this pull: refused, as a local
            // image that is not the pin is.
            images::compare(&spec.image, &local, pin)?;
        }
        Ok(local)
    }
}

/// What the log stream of [`DockerRuntime`] is made of.
enum LogPiece {
    /// Output as the engine's follow delivered it.
    Followed(String),
    /// The last entry, read once the follow ended.
    Last(String),
}

/// The longest end of the output kept to compare the last entry with.
const SEEN_END: usize = 64 * 1024;

/// Keeps the last [`SEEN_END`] bytes (at a character boundary) of the output so far.
fn remember_end(seen: &mut String, s: &str) {
    seen.push_str(s);
    if seen.len() > 2 * SEEN_END {
        let mut cut = seen.len() - SEEN_END;
        while !seen.is_char_boundary(cut) {
            cut += 1;
        }
        seen.drain(..cut);
    }
}

/// Whole seconds for the engine's APIs, saturating instead of wrapping.
fn whole_secs_i32(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// A grace in the engine's whole seconds, rounded up: never less than promised.
fn grace_secs_i32(d: Duration) -> i32 {
    let up = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(up).unwrap_or(i32::MAX)
}

impl ContainerRuntime for DockerRuntime {
    async fn create_and_start(
        &self,
        job: JobId,
        attempt: Attempt,
        spec: &JobSpec,
        gpus: &[AssignedGpu],
        checkpoint: &CheckpointMount,
    ) -> Result<String, RuntimeError> {
        let id = self.resolve_image(spec).await?;
        let name = container_name(&self.agent_id, job, attempt);
        // A leftover of the same attempt (agent crashed between create and report) goes.
        let _ = self
            .docker
            .remove_container(
                &name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        let mut body = container_body(&self.agent_id, job, attempt, spec, gpus, checkpoint);
        if let (Some(host), Some(labels)) = (&self.host_id, body.labels.as_mut()) {
            labels.insert(LABEL_HOST.to_string(), host.clone());
        }
        // By ID: what was checked is what runs, whatever the tag points at by now.
        body.image = Some(id);
        if let Some(h) = body.host_config.as_mut() {
            guest::apply(h, &self.isolation, spec.shm_mb);
        }
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name),
                    ..Default::default()
                }),
                body,
            )
            .await?;
        if keeps_alive(spec) {
            if let Err(e) = self.check_shell(&created.id, &spec.image).await {
                let _ = self.remove(&created.id).await;
                return Err(e);
            }
        }
        if let Err(e) = self.docker.start_container(&created.id, None).await {
            let _ = self.remove(&created.id).await;
            return Err(e.into());
        }
        Ok(created.id)
    }

    async fn wait(&self, id: &str) -> Result<i64, RuntimeError> {
        let mut s = self.docker.wait_container(
            id,
            Some(WaitContainerOptions {
                condition: "not-running".into(),
            }),
        );
        // One answer comes when the container stops; bollard reports a non-zero exit as
        // an error carrying the code.
        match s.next().await {
            Some(Ok(w)) => return Ok(w.status_code),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                return Ok(code)
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
        let info = self.docker.inspect_container(id, None).await?;
        Ok(info.state.and_then(|s| s.exit_code).unwrap_or(-1))
    }

    async fn inspect(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        match self.docker.inspect_container(id, None).await {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                let live = [state.running, state.paused, state.restarting]
                    .into_iter()
                    .any(|b| b == Some(true));
                Ok(if live {
                    ContainerStatus::Running
                } else {
                    ContainerStatus::Exited(state.exit_code.unwrap_or(-1))
                })
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(ContainerStatus::Gone),
            Err(e) => Err(e.into()),
        }
    }

    fn logs(
        &self,
        id: &str,
        since: Option<Duration>,
    ) -> impl Stream<Item = String> + Send + 'static {
        let since = since.map_or(0, whole_secs_i32);
        let follow = self
            .docker
            .logs(
                id,
                Some(LogsOptions {
                    follow: true,
                    stdout: true,
                    stderr: true,
                    since,
                    ..Default::default()
                }),
            )
            .filter_map(|r| async move { r.ok().map(|l| LogPiece::Followed(l.to_string())) });
        // The engine's follow can end with the container before its last line reaches it
        // when that line has no newline (`printf done; exit`): one plain read of the last
        // entry afterwards, sent unless the follow already ended with it.
        let (docker, id) = (self.docker.clone(), id.to_string());
        let last = futures_util::stream::once(async move {
            let mut read = docker.logs(
                &id,
                Some(LogsOptions {
                    follow: false,
                    stdout: true,
                    stderr: true,
                    since,
                    tail: "1".into(),
                    ..Default::default()
                }),
            );
            let mut text = String::new();
            while let Some(Ok(l)) = read.next().await {
                text.push_str(&l.to_string());
            }
            LogPiece::Last(text)
        });
        follow
            .chain(last)
            .scan(String::new(), |seen, piece| {
                let out = match piece {
                    LogPiece::Followed(s) => {
                        remember_end(seen, &s);
                        Some(s)
                    }
                    LogPiece::Last(t) => {
                        Some(t).filter(|t| !t.is_empty() && !seen.ends_with(t.as_str()))
                    }
                };
                futures_util::future::ready(Some(out))
            })
            .filter_map(futures_util::future::ready)
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        match self
            .docker
            .stop_container(
                id,
                Some(StopContainerOptions {
                    t: Some(grace_secs_i32(grace)),
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            // 304: already stopped; 404: already gone. Both mean "stopped".
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304 | 404,
                ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        match self
            .docker
            .remove_container(
                id,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn list(&self) -> Result<Vec<FoundContainer>, RuntimeError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_AGENT}={}", self.agent_id)],
        )]);
        let found = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        let mut out: Vec<FoundContainer> = found
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(FoundContainer {
                    id: c.id?,
                    job: labels.get(LABEL_JOB)?.parse().ok()?,
                    attempt: labels.get(LABEL_ATTEMPT)?.parse().ok()?,
                    running: matches!(
                        c.state,
                        Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                    ),
                })
            })
            .collect();
        out.sort_by_key(|c| (c.job, c.attempt));
        Ok(out)
    }

    async fn pids(&self, id: &str) -> BTreeSet<u32> {
        let Ok(top) = self
            .docker
            .top_processes(
                id,
                Some(TopOptions {
                    ps_args: "-o pid".into(),
                }),
            )
            .await
        else {
            return BTreeSet::new();
        };
        top.processes
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.first()?.trim().parse().ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            image: "commons-demo:latest".into(),
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: [
                ("A".to_string(), "1".to_string()),
                ("COMMONS_JOB_ID".to_string(), "spoof".to_string()),
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
        }
    }

    fn ckpt(resumed: bool) -> CheckpointMount {
        CheckpointMount {
            host_dir: "/var/lib/commons-agent/attempts/42-2/checkpoint".into(),
            resumed,
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
        assert!(hc.binds.is_none(), "no host paths but the checkpoint mount");
        let mounts = hc.mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 1);
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
        assert!(env.contains(&"A=1".to_string()));
        assert!(env.contains(&"COMMONS_CHECKPOINT_DIR=/checkpoint".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("COMMONS_RESUME")));
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
    fn a_grace_is_rounded_up_to_whole_seconds() {
        assert_eq!(grace_secs_i32(Duration::from_secs(30)), 30);
        assert_eq!(grace_secs_i32(Duration::from_millis(9_001)), 10);
        assert_eq!(grace_secs_i32(Duration::ZERO), 0);
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
