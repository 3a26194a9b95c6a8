//! The container runtime as the executor sees it: the [`ContainerRuntime`] trait, with the
//! Docker Engine ([`docker::DockerRuntime`], through bollard) as the production one.
//!
//! The trait is the whole of what the executor asks of a runtime, so the executor can be
//! tested with an in-memory double while the Docker tests keep the real engine honest.
//!
//! Invariants every implementation keeps:
//! - A container is labelled with its job, attempt and agent ([`LABEL_AGENT`]), and
//!   [`ContainerRuntime::list`] finds exactly this agent's containers by those labels, so
//!   agents that share one engine never touch each other's containers.
//! - Deadlines are not the runtime's business: they live on the boot clock in the attempt's
//!   `lease.json` (see `store`), which outlives the agent as well as any label would.
//! - [`ContainerRuntime::stop`] and [`ContainerRuntime::remove`] succeed on a container
//!   that is already stopped or gone: they are retried after restarts and races.
//! - An image runs only at the digest the portal's allow-list pinned (see [`images`]);
//!   it is pulled only from registries the node allows, by digest; otherwise a missing
//!   image is [`RuntimeError::ImageMissing`].
//! - [`ContainerRuntime::wait`] may fail while the container still runs (the engine
//!   restarted, the connection broke): [`ContainerRuntime::inspect`] tells the two apart.
//! - Every container gets its attempt's [`CheckpointMount`]: the host directory
//!   read-write at `/checkpoint`, `COMMONS_CHECKPOINT_DIR=/checkpoint`, and
//!   `COMMONS_RESUME=1` exactly when the directory holds a restored checkpoint; and the
//!   outputs directory beside it read-write at `/outputs` (`COMMONS_OUTPUTS_DIR`); and,
//!   when the job names inputs, their staged copy read-only at `/inputs`
//!   (`COMMONS_INPUTS_DIR`); a share attempt gets its [`ShareMount`]: the share's
//!   variables over any of the job's own, and, with MPS, its GPU's pipe directory.
//!
//! Everything else in the agent that touches containers goes through the trait too: the
//! guards, the start-up sweep of an earlier identity's containers (`host`) and the SSH
//! relays' processes (`relay`); only `session` and `main` name [`DockerRuntime`], to make
//! one.

pub mod body;
pub mod docker;
mod docker_exec;
pub mod guest;
pub mod images;

pub use body::{container_body, JOB_USER};
pub use docker::DockerRuntime;

use commons_proto::{Attempt, JobId, JobSpec};
use futures_util::stream::BoxStream;
use futures_util::Stream;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;
use thiserror::Error;

/// Label that marks a container as this agent's (see `state::NodeCredential::agent_id`).
pub const LABEL_AGENT: &str = "commons.agent";

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("the image {0} is missing on this server: it is not on this server's Docker Engine, and this node does not pull from its registry (a lab admin loads the allowed image, or lets the node pull it with --allow-pull REGISTRY)")]
    ImageMissing(String),
    #[error("the local image {image} is not the one the allow-list pins ({pinned}) (the lab admin loads the allowed image again, or updates the allow-list entry)")]
    ImageChanged { image: String, pinned: String },
    #[error("the image {image} is allowed by lab {lab}'s own allow-list, which serves that lab's servers: on this server (another lab's) it runs only when pulled by digest from a registry this server allows (--allow-pull), and {registry} is not one of them; ask an operator to allow the image campus-wide, or this server's admins to allow pulls from {registry}")]
    NotSharedHere {
        image: String,
        lab: String,
        registry: String,
    },
    #[error("the image {0} has no pinned digest from the allow-list; this agent runs allow-listed images only")]
    ImageNotPinned(String),
    #[error("the image {0} is not signed as this server requires: {1}")]
    ImageSignature(String, String),
    #[error("pulling {0} by digest failed: {1}")]
    PullFailed(String, String),
    #[error("image {0:?} has no /bin/sh, which an interactive job without a command needs to stay up; give the job a command that keeps running (a server such as `jupyter lab`)")]
    NoShell(String),
    #[error("no such container {0}")]
    NoSuchContainer(String),
    #[error("container engine: {0}")]
    Engine(String),
    #[error("Docker Engine: {0}")]
    Docker(#[from] bollard::errors::Error),
}

/// A GPU given to an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignedGpu {
    pub uuid: String,
    /// Fake GPUs get no device request: no NVIDIA runtime could honour it.
    pub fake: bool,
}

/// An attempt's checkpoint directory, as its container gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointMount {
    /// The directory on the host (`<attempt dir>/checkpoint`), bind-mounted read-write at
    /// `/checkpoint`.
    pub host_dir: PathBuf,
    /// It holds a restored checkpoint: the job sees `COMMONS_RESUME=1`.
    pub resumed: bool,
    /// The outputs directory on the host (beside `host_dir`, in the same volume),
    /// bind-mounted read-write at `/outputs`; it must exist.
    pub outputs_dir: PathBuf,
    /// The staged inputs on the host (beside `host_dir`, in the same volume),
    /// bind-mounted read-only at `/inputs`; none when the job names no inputs.
    pub inputs_dir: Option<PathBuf>,
    /// The job's datasets: (mount in the container, directory on the host), each
    /// bind-mounted read-only.
    pub datasets: Vec<(String, PathBuf)>,
    /// A share attempt's variables and MPS pipes; `None` for whole GPUs.
    pub share: Option<ShareMount>,
}

/// What a share attempt's container gets besides its GPU (`executor/shares.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMount {
    /// `commons_proto::share_env`: set by the agent over any of the job's own.
    pub env: std::collections::BTreeMap<String, String>,
    /// `mps` mode: the GPU's MPS pipe directory on the host, bind-mounted at
    /// `commons_proto::share::MPS_PIPE_DIR`.
    pub mps_pipe: Option<PathBuf>,
}

/// A container of ours found on the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundContainer {
    pub id: String,
    pub job: JobId,
    pub attempt: Attempt,
    pub running: bool,
}

/// What the engine says of a container now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerStatus {
    /// Running (or paused, or restarting): not ended.
    Running,
    /// Ended with this exit code.
    Exited(i64),
    /// The engine has no such container.
    Gone,
}

/// A container found with this runtime's host id, whichever agent made it (see `host`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostContainer {
    pub id: String,
    /// Its agent id (`commons.agent`).
    pub agent: String,
    pub job: Option<JobId>,
    pub attempt: Option<Attempt>,
    pub running: bool,
}

/// A process to start in a running container (`docker exec`), as the container's user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub cmd: Vec<String>,
    /// `NAME=value`s added to the container's environment.
    pub env: Vec<String>,
    /// With a terminal: one output stream, and [`ContainerRuntime::exec_resize`] works.
    pub tty: bool,
}

/// A piece of an exec's output, and the stream it came on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutput {
    /// stdout (or, with a terminal, everything).
    Out(bytes::Bytes),
    Err(bytes::Bytes),
}

/// An exec's process, attached: its output until it ends, and its stdin.
pub struct ExecIo {
    pub output: BoxStream<'static, Result<ExecOutput, RuntimeError>>,
    pub input: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

/// What the engine says of an exec now (each `None` when the engine did not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecState {
    pub running: Option<bool>,
    /// Its process's pid on the host.
    pub pid: Option<i64>,
    pub exit_code: Option<i64>,
}

/// The container's name: unique per agent and attempt, so a retried create finds the
/// leftover of an earlier try instead of making a second container.
pub fn container_name(agent_id: &str, job: JobId, attempt: Attempt) -> String {
    format!("commons-{agent_id}-job{job}-a{attempt}")
}

/// What the executor needs from a container engine.
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Creates and starts the container of one attempt; returns its id. A leftover of the
    /// same attempt is replaced; a container that cannot start is removed again.
    fn create_and_start(
        &self,
        job: JobId,
        attempt: Attempt,
        spec: &JobSpec,
        gpus: &[AssignedGpu],
        checkpoint: &CheckpointMount,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// Every container of this agent, running or not, in (job, attempt) order.
    fn list(&self) -> impl Future<Output = Result<Vec<FoundContainer>, RuntimeError>> + Send;

    /// Waits until the container stops; returns its exit code. An error says nothing about
    /// the container: ask [`ContainerRuntime::inspect`].
    fn wait(&self, id: &str) -> impl Future<Output = Result<i64, RuntimeError>> + Send;

    /// Whether the container runs, ended (with its code) or is gone.
    fn inspect(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<ContainerStatus, RuntimeError>> + Send;

    /// The container's environment as it was created (`NAME=value`s): what its main
    /// process and every exec start with.
    fn env(&self, id: &str) -> impl Future<Output = Result<Vec<String>, RuntimeError>> + Send;

    /// Sends SIGTERM, then SIGKILL after `grace`. Already stopped or gone is success.
    fn stop(
        &self,
        id: &str,
        grace: Duration,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Removes the container, running or not. Already gone is success.
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// stdout and stderr, interleaved, followed until the container ends; from `since`, a
    /// wall-clock time since the Unix epoch as the engine's filter wants (`None`: from the
    /// beginning).
    fn logs(
        &self,
        id: &str,
        since: Option<Duration>,
    ) -> impl Stream<Item = String> + Send + 'static;

    /// Host pids of the processes inside a container (to tell our GPU use from the
    /// owner's); empty when they cannot be read.
    fn pids(&self, id: &str) -> impl Future<Output = BTreeSet<u32>> + Send;

    /// This agent's id, the [`LABEL_AGENT`] on its containers.
    fn agent_id(&self) -> &str;

    /// The host's id its containers are labelled with (see `host`); `None`: none.
    fn host_id(&self) -> Option<&str>;

    /// Every container labelled with [`ContainerRuntime::host_id`], whichever agent made
    /// it, running or not; none without a host id.
    fn list_host(&self) -> impl Future<Output = Result<Vec<HostContainer>, RuntimeError>> + Send;

    /// The host pid of a running container's main process; `None` when it does not run.
    fn main_pid(&self, id: &str) -> impl Future<Output = Option<i64>> + Send;

    /// Makes (does not start) a process in a running container; returns the exec's id.
    fn exec_create(
        &self,
        container: &str,
        req: &ExecRequest,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// Starts an exec made by [`ContainerRuntime::exec_create`], attached; `tty` as it
    /// was made.
    fn exec_start(
        &self,
        exec: &str,
        tty: bool,
    ) -> impl Future<Output = Result<ExecIo, RuntimeError>> + Send;

    /// Sets the size of an exec's terminal.
    fn exec_resize(
        &self,
        exec: &str,
        cols: u16,
        rows: u16,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Whether an exec runs, with what pid, and how it ended.
    fn exec_inspect(
        &self,
        exec: &str,
    ) -> impl Future<Output = Result<ExecState, RuntimeError>> + Send;
}
