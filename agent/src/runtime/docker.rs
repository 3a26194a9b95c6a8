//! The production [`ContainerRuntime`]: the Docker Engine through bollard.
//!
//! Containers are made as [`container_body`] says. The image runs only at its pinned
//! digest and is created from that ID, never from the tag (see [`super::images`]); it is
//! pulled only from registries the node allows, and only by digest. An interactive job
//! without a command runs [`KEEP_ALIVE`](super::body::KEEP_ALIVE), which needs [`KEEP_ALIVE_SHELL`]: an image
//! without it is removed before it starts and the job fails with
//! [`RuntimeError::NoShell`]. The SSH relays' processes are execs (`docker_exec`).

use super::body::{container_body, keeps_alive, KEEP_ALIVE_SHELL};
use super::images::{self, ImagePolicy};
use super::{
    container_name, docker_exec, guest, AssignedGpu, CheckpointMount, ContainerRuntime,
    ContainerStatus, ExecIo, ExecRequest, ExecState, FoundContainer, HostContainer, RuntimeError,
    LABEL_AGENT,
};
use crate::host::LABEL_HOST;
use bollard::query_parameters::{
    ContainerArchiveInfoOptions, CreateContainerOptions, ListContainersOptions, LogsOptions,
    RemoveContainerOptions, StopContainerOptions, TopOptions, WaitContainerOptions,
};
use bollard::Docker;
use commons_proto::{Attempt, JobId, JobSpec, LABEL_ATTEMPT, LABEL_JOB};
use futures_util::{Stream, StreamExt};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

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

    async fn env(&self, id: &str) -> Result<Vec<String>, RuntimeError> {
        let info = self.docker.inspect_container(id, None).await?;
        Ok(info.config.and_then(|c| c.env).unwrap_or_default())
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

    fn agent_id(&self) -> &str {
        &self.agent_id
    }

    fn host_id(&self) -> Option<&str> {
        self.host_id.as_deref()
    }

    async fn list_host(&self) -> Result<Vec<HostContainer>, RuntimeError> {
        let Some(host) = &self.host_id else {
            return Ok(Vec::new());
        };
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_HOST}={host}")])]);
        let found = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        Ok(found
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(HostContainer {
                    id: c.id?,
                    agent: labels.get(LABEL_AGENT).cloned().unwrap_or_default(),
                    job: labels.get(LABEL_JOB).and_then(|j| j.parse().ok()),
                    attempt: labels.get(LABEL_ATTEMPT).and_then(|a| a.parse().ok()),
                    running: matches!(
                        c.state,
                        Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                    ),
                })
            })
            .collect())
    }

    async fn main_pid(&self, id: &str) -> Option<i64> {
        docker_exec::main_pid(&self.docker, id).await
    }

    async fn exec_create(
        &self,
        container: &str,
        req: &ExecRequest,
    ) -> Result<String, RuntimeError> {
        docker_exec::create(&self.docker, container, req).await
    }

    async fn exec_start(&self, exec: &str, tty: bool) -> Result<ExecIo, RuntimeError> {
        docker_exec::start(&self.docker, exec, tty).await
    }

    async fn exec_resize(&self, exec: &str, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        docker_exec::resize(&self.docker, exec, cols, rows).await
    }

    async fn exec_inspect(&self, exec: &str) -> Result<ExecState, RuntimeError> {
        docker_exec::inspect(&self.docker, exec).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grace_is_rounded_up_to_whole_seconds() {
        assert_eq!(grace_secs_i32(Duration::from_secs(30)), 30);
        assert_eq!(grace_secs_i32(Duration::from_millis(9_001)), 10);
        assert_eq!(grace_secs_i32(Duration::ZERO), 0);
    }
}
