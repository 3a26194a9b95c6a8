//! One attempt on the agent: what to run ([`JobSpec`]), how long it may ([`Lease`],
//! [`TimeLimit`]), and what the agent reports of it ([`AttemptReport`]).

use crate::{Attempt, JobId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where an attempt stands on the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Accepted; the container is being created.
    Starting,
    Running,
    /// The container's main process ended by itself (`exit_code` says how).
    Exited,
    /// The agent stopped it (cancel, preemption, lease lost, time limit; `reason` says).
    Stopped,
    /// It never ran: the image is missing or the container could not be created.
    Failed,
}

impl AttemptState {
    pub fn is_final(self) -> bool {
        matches!(self, Self::Exited | Self::Stopped | Self::Failed)
    }
}

/// Why an attempt is stopped: the portal's orders and the agent's own decisions alike.
/// The portal decides from this (not from words) whether a job is requeued or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Its owner (or an admin) cancelled the job. The job ends.
    Cancelled,
    /// The owner lab needs the GPUs, or a lending rule or a drain moved the guest: the
    /// job goes back to the queue.
    Preempted,
    /// The agent could not renew the attempt's lease in time (lost the portal): the
    /// portal has requeued it or will.
    LeaseExpired,
    /// The job ran past its time limit. The job ends.
    TimeLimit,
    /// The portal does not expect this attempt to run (a late or duplicate one).
    NotExpected,
    /// The container vanished or the engine lost it: the job goes back to the queue.
    Lost,
}

impl StopReason {
    /// Whether the job goes back to the queue (true) or ends (false).
    pub fn requeues(self) -> bool {
        matches!(
            self,
            Self::Preempted | Self::LeaseExpired | Self::NotExpected | Self::Lost
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::Preempted => "preempted",
            Self::LeaseExpired => "lease expired",
            Self::TimeLimit => "time limit reached",
            Self::NotExpected => "not expected to run",
            Self::Lost => "lost by the container engine",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lease: valid for `valid_for_s` seconds after the agent sent its message `seq`
/// (see the crate docs). A lease naming a `seq` the agent does not know (another agent
/// process, or too old) is worth nothing: the agent treats it as expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The agent process's `Hello.session`.
    pub session: u64,
    /// The agent's message (`Hello` or `Heartbeat`) the lease counts from.
    pub seq: u64,
    pub valid_for_s: u64,
}

/// What the agent knows about one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptReport {
    pub job: JobId,
    pub attempt: Attempt,
    pub state: AttemptState,
    /// Set once the container ended by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it was stopped (state `stopped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopReason>,
    /// Why it stopped or failed, in words for the job's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// GPU memory its processes use now, in MiB, as the agent measured it (per process,
    /// through NVML); absent where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_used_mb: Option<u64>,
}

/// What to run. Validated by the portal; the agent re-checks what it enforces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub image: String,
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub time_limit_s: u64,
    /// The submitting user's name, for labels and logs.
    pub user: String,
    /// The size of the container's `/dev/shm` in MiB (data loaders use it); none: the
    /// agent's default (64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_mb: Option<u64>,
    /// Snapshot `/checkpoint` to the portal every this many seconds while the attempt
    /// runs (besides the upload after it stops); none: only after it stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_s: Option<u64>,
    /// An interactive job: with an empty `command` the agent keeps the container alive
    /// (a shell loop that ends at once on SIGTERM) until its time limit, a `Stop`, or
    /// the lease runs out, instead of running the image's default command. With a
    /// command it runs as given. An agent that predates this field ignores it and runs
    /// the image's default command.
    #[serde(default, skip_serializing_if = "is_false")]
    pub interactive: bool,
    /// The job is a guest here (charged to another lab than the server's owner): the
    /// agent takes the GPU back from it at once when the owner uses it directly, stops it
    /// when its GPUs sit idle, and `reclaim --now` stops it. Absent: an owner job (what
    /// an older portal sends; the portal still preempts guests itself).
    #[serde(default, skip_serializing_if = "is_false")]
    pub guest: bool,
    /// The lab the job is charged to (for `commons-agent status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<String>,
    /// The node's grace period for a guest the agent stops on its own (local use,
    /// `reclaim --now`, idle GPUs); absent: the agent's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_s: Option<u64>,
    /// The job's disk cap in GiB (`disk_gb`): every host path it can write (today
    /// `/checkpoint`) holds at most this much, and so does its checkpoint archive,
    /// counting files at their apparent size. Absent (an older portal, or a job from
    /// before the field): the node's largest (`--max-job-disk-gb`); a larger one gets
    /// that too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<u64>,
    /// The allow-list's pin for `image`: `sha256:...`, the image's ID in the Docker
    /// Engine. The agent runs the container from this ID, and only if `image` resolves to
    /// it locally; without a pin it runs nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The allow-list entry's signature (armored SSHSIG over
    /// `gpu-commons-image-v1 IMAGE@DIGEST`), for nodes that check signatures themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_signature: Option<String>,
    /// The pin is the campus allow-list's. Absent or false: it is the allow-list of
    /// `lab` (the job's lab), which vouches for images on that lab's own servers only: on
    /// another lab's server the agent runs such an image only when it pulls it there by
    /// digest from a registry the server allows, never a copy that merely sits in the
    /// server's engine (its owners may keep private images there).
    #[serde(default, skip_serializing_if = "is_false")]
    pub image_campus: bool,
    /// The job's inputs as its owner wrote them (`data/train.tar`, `lab:vision/code/`):
    /// the agent stages them read-only under `/inputs` before the container starts,
    /// through the inputs API (`inputs::INPUTS_PATH`). Absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// The lab datasets the job mounts read-only, in the order its owner named them
    /// (their index is their place in the datasets API). Absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<crate::DatasetMount>,
    /// A share of its one GPU, not the whole GPU (`crate::share`); sent only to an agent
    /// that reported a share mode. Absent: the attempt's GPUs are its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_share: Option<crate::GpuShare>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An attempt's time limit as the portal has it now, in seconds from the attempt's start
/// (`JobSpec::time_limit_s` at the `Start`, more once its owner extended the job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeLimit {
    pub job: JobId,
    pub attempt: Attempt,
    pub time_limit_s: u64,
}
