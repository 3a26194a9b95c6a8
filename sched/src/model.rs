//! The snapshot the scheduler reads and the plan it returns.
//!
//! Every snapshot struct derives `Default` so callers build them with
//! `..Default::default()`, and a default value always means "no restriction": a node
//! lends always, a lab or member has no quota, a GPU has been idle forever, a job has
//! never checkpointed. New fields can therefore be added without touching callers.

use serde::{Deserialize, Serialize};

use crate::policy::Lending;

/// Database id of a job.
pub type JobId = i64;
/// Database id of a node (a lab server with an agent).
pub type NodeId = i64;
/// Database id of a GPU or of a MIG instance.
pub type GpuId = i64;
/// Database id of a lab.
pub type LabId = i64;
/// Database id of a user.
pub type UserId = i64;
/// Seconds on the caller's clock: Unix time in the portal, virtual time in the simulator.
pub type Time = i64;

/// Everything the scheduler may look at, frozen at one instant.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// Every enrolled node, online or not.
    pub nodes: Vec<Node>,
    /// Every job that holds GPUs now (starting, running or preempting).
    pub running: Vec<RunningJob>,
    /// Every job that waits to start.
    pub queue: Vec<QueuedJob>,
    /// Quotas and ledgers of labs. A lab that is missing has no quota, no usage, no
    /// contribution and the policy's base share.
    pub labs: Vec<LabInfo>,
    /// Quotas and ledgers of lab members, per (lab, user). A member that is missing has
    /// no quota and no usage.
    pub members: Vec<MemberInfo>,
}

/// A lab server that an agent reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    /// Node id.
    pub id: NodeId,
    /// Host name shown to researchers in reasons ("owner of node gpu7 reserved it").
    pub name: String,
    /// The lab that owns the server; its jobs outrank every guest here.
    pub lab: LabId,
    /// False when the agent is offline or draining: nothing new starts here.
    pub schedulable: bool,
    /// GPUs and MIG instances of the node.
    pub gpus: Vec<Gpu>,
    /// The lab admin's lending rules for this node (default: lend always, no limits).
    pub lending: Lending,
    /// Seconds a guest gets to checkpoint and stop when it is preempted here; 0 means
    /// [`crate::Policy::default_grace_s`].
    pub grace_s: u32,
    /// The owner reclaims the whole node now (`commons-agent reclaim --now`): every
    /// guest is preempted and nothing is lent.
    pub reclaim: bool,
    /// How often the owner lab takes this node's GPUs back from guests, as expected
    /// take-backs per hour for each hour of the week in campus local time (168 values,
    /// index 0 = Monday 00:00-01:00; [`crate::Policy::utc_offset_s`]). The caller learns
    /// it from the node's history (the portal's ledger, the simulator's replay); empty
    /// means unknown and counts as zero. Guests are placed where the owner is least
    /// likely to come back within their time limit, and a GPU the owner just released
    /// is not lent again for [`crate::Policy::relend_delay_s`] while the owner tends to
    /// come back ([`crate::Policy::relend_min_rate`]).
    pub owner_return_rate: Vec<f64>,
    /// CPUs of the server (from its agent); 0: unknown, no limit.
    pub cpus: f64,
    /// Memory of the server in MiB (from its agent); 0: unknown, no limit.
    pub memory_mb: u64,
    /// The largest disk (GiB) its agent gives one job ([`QueuedJob::disk_gb`]); 0:
    /// unknown, no limit.
    pub max_job_disk_gb: u64,
    /// Its agent's disk is under its free-space floor: it takes no new guest (owner
    /// jobs still start; running guests stay).
    pub low_disk: bool,
    /// The datasets (`LAB/NAME`) this server provides from a folder its owner exports
    /// ([`QueuedJob::needs_exports`]).
    pub exports: Vec<String>,
    /// The datasets (`LAB/NAME`) its dataset cache holds now.
    pub cached: Vec<String>,
    /// How fast its agent last fetched inputs or a dataset, in bytes per second; 0:
    /// not measured ([`crate::Policy`]'s default speed is assumed).
    pub fetch_bytes_per_s: u64,
    /// Its agent reports more GPUs, or other models, than the node enrolled with, and its
    /// lab admin has not approved them yet: no guest is placed here (its own lab's jobs
    /// may run). Guests already running stay.
    pub inventory_unapproved: bool,
}

/// One schedulable GPU: a whole GPU or a MIG instance (a GPU of its own size).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Gpu {
    /// GPU id (unique on campus).
    pub id: GpuId,
    /// Marketing model name as reported, e.g. "A100-80GB"; for a MIG instance the
    /// model of the parent GPU.
    pub model: String,
    /// Memory of the GPU, or of the MIG instance.
    pub memory_mb: u64,
    /// The owner uses this GPU directly (a process we did not start): nothing is placed
    /// on it, and a guest that holds it is preempted.
    pub local_use: bool,
    /// Since when the GPU has been free of owner work (owner job or local process).
    /// Lending rules may require it to be idle some minutes before a guest gets it.
    /// The default (0) means idle since forever.
    pub idle_since: Time,
    /// The MIG profile when this is a MIG instance, e.g. "3g.40gb"; `None` for a whole
    /// GPU. Only jobs that ask for this profile are placed on it.
    pub mig_profile: Option<String>,
}

/// A share of one GPU. In a request: `milli` of its compute (0: as much as `memory_mb` is of
/// the GPU's memory, rounded up to 0.05) and `memory_mb` (0: the same fraction of its memory).
/// In a running job or a start: the amounts actually held on that GPU (both non-zero).
///
/// Several shares sit on one GPU while their compute (at most 1000 milli in all) and memory
/// fit; a GPU that carries any share takes no whole-GPU job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuShare {
    /// Compute share in thousandths of the GPU (500: half of it); 0 in a request: in
    /// proportion to `memory_mb`.
    pub milli: u32,
    /// GPU memory in MiB; 0 in a request: the same fraction of the GPU's memory as
    /// `milli`.
    pub memory_mb: u64,
}

/// A job that waits to start (or to restart after a preemption).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct QueuedJob {
    /// Job id.
    pub id: JobId,
    /// The member who submitted it.
    pub user: UserId,
    /// The lab the job is charged to.
    pub lab: LabId,
    /// Number of GPUs (or MIG instances), all on one node.
    pub gpus: u32,
    /// Acceptable GPU models; empty means any.
    pub models: Vec<String>,
    /// Minimum memory of each GPU.
    pub min_memory_mb: u64,
    /// MIG profile wanted, e.g. "1g.10gb". `None` asks for whole GPUs.
    pub mig_profile: Option<String>,
    /// Wall-clock limit in seconds; 0 means unknown (such a job cannot backfill, cannot
    /// run in a lending window, and cannot start under a GPU-hour quota).
    pub time_limit_s: i64,
    /// When it was submitted (first-come order inside one member's jobs).
    pub submitted_at: Time,
    /// An interactive job (someone waits for it at the screen); goes ahead of its lab's
    /// batch jobs when the lab sets [`LabInfo::interactive_boost`].
    pub interactive: bool,
    /// CPUs the job asks for; placed against the node's [`Node::cpus`].
    pub cpus: f64,
    /// Memory the job asks for in MiB; placed against the node's [`Node::memory_mb`].
    pub memory_mb: u64,
    /// Disk the job asks for in GiB (its cap on the server); placed only where
    /// [`Node::max_job_disk_gb`] allows it. 0: no ask.
    pub disk_gb: u64,
    /// How many earlier attempts of this job an owner took back (guest attempts stopped
    /// so the node's owner lab could use its GPUs). Such a job borrows again only on
    /// nodes where another take-back is unlikely, see
    /// [`crate::Policy::taken_back_max_risk`].
    pub take_backs: u32,
    /// When the last of those take-backs ended (0: unknown or none).
    pub taken_back_at: Time,
    /// Datasets only some servers provide (a folder their owner exports, `LAB/NAME`):
    /// placed only on a node whose [`Node::exports`] has every one.
    pub needs_exports: Vec<String>,
    /// Every dataset it mounts (`LAB/NAME`): among otherwise equal nodes, one whose
    /// [`Node::cached`] holds more of them wins (it starts without fetching them).
    pub datasets: Vec<String>,
    /// Bytes its start fetches (inputs and datasets); the start estimate adds the time
    /// to fetch them ([`Node::fetch_bytes_per_s`]).
    pub stage_bytes: u64,
    /// A share of one GPU instead of whole GPUs (with `gpus == 1`); `None` asks for whole
    /// GPUs. A share goes only to a node whose [`crate::Lending::share_gpus`] is on, on a
    /// whole GPU (not a MIG instance) that matches `models` and `min_memory_mb`.
    pub share: Option<GpuShare>,
}

/// A job that holds GPUs now (starting, running or preempting).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunningJob {
    /// Job id.
    pub id: JobId,
    /// The member who submitted it.
    pub user: UserId,
    /// The lab it is charged to; it is a guest wherever this differs from the node's lab.
    pub lab: LabId,
    /// The node it runs on.
    pub node: NodeId,
    /// The GPUs it holds.
    pub gpus: Vec<GpuId>,
    /// When this attempt started.
    pub started_at: Time,
    /// Wall-clock limit of the attempt; 0 means unknown.
    pub time_limit_s: i64,
    /// Already told to stop; its GPUs free up within the grace period.
    pub preempting: bool,
    /// When its latest checkpoint was stored; `None` if it has none in this attempt.
    /// Work since then is what a preemption loses.
    pub last_checkpoint_at: Option<Time>,
    /// Seconds its latest checkpoint took to write, in this attempt or an earlier one;
    /// `None` if it never stored one (or the caller does not know). A job that wrote
    /// one in less than the grace period is expected to save on stop and lose nothing
    /// (see [`crate::Policy::grace_covers_checkpoint_s`]).
    pub checkpoint_write_s: Option<i64>,
    /// CPUs it was given (counted against its node's capacity).
    pub cpus: f64,
    /// Memory it was given in MiB (counted against its node's capacity).
    pub memory_mb: u64,
    /// What it holds on its one GPU when it runs on a share of it (both amounts
    /// non-zero, as [`Start::share`] gave them); `None` when it holds whole GPUs.
    pub share: Option<GpuShare>,
}

/// A quota; every limit is optional and `None` means no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Quota {
    /// GPUs held at once.
    pub max_gpus: Option<u32>,
    /// GPU-hours per quota period (the period is the portal's; it passes the usage).
    pub max_gpu_hours: Option<f64>,
    /// Longest time limit of one job, in seconds.
    pub max_time_limit_s: Option<i64>,
}

/// A lab's quota (set by operators) and ledgers (kept by the portal).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LabInfo {
    /// Lab id.
    pub id: LabId,
    /// Operator quota on what the lab *borrows*: it counts only the lab's jobs on other
    /// labs' nodes. A lab is never limited on its own servers.
    pub quota: Quota,
    /// GPU-hours borrowed in the current quota period, including what running guest
    /// jobs used so far (running jobs' remaining time is added by the scheduler).
    pub period_gpu_hours: f64,
    /// Contribution: GPU-hours others used on this lab's nodes, weighted by GPU class
    /// ([`crate::Policy::gpu_weight`]), decayed to `ledger_at`.
    pub lent_gpu_hours: f64,
    /// GPU-hours this lab's jobs used on other labs' nodes, weighted by GPU class,
    /// decayed to `ledger_at` (include running jobs' use so far).
    pub used_gpu_hours: f64,
    /// When `lent_gpu_hours` and `used_gpu_hours` were last decayed; the scheduler
    /// decays them further to `now` with the policy's half-life.
    pub ledger_at: Time,
    /// Operator override of [`crate::Policy::base_share_gpu_hours`] for this lab.
    pub base_share_gpu_hours: Option<f64>,
    /// The lab admin's priority boost for interactive jobs: the lab's interactive jobs go
    /// ahead of all its batch jobs, whichever member submitted them, on the lab's own
    /// nodes (owner phase) and in the lab's turn among guests (fair share). It reorders
    /// only the lab's own queue: the lab's standing among labs is unchanged, so a
    /// setting each lab controls cannot take a turn from another lab.
    pub interactive_boost: bool,
}

/// A member's quota inside one lab (set by the lab admin) and ledgers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MemberInfo {
    /// The lab.
    pub lab: LabId,
    /// The member.
    pub user: UserId,
    /// Quota on all the member's jobs charged to this lab, on any node.
    pub quota: Quota,
    /// GPU-hours used in the current quota period by jobs charged to this lab,
    /// including what running jobs used so far.
    pub period_gpu_hours: f64,
    /// GPU-hours used (any node, charged to this lab), decayed to `ledger_at`; orders
    /// members inside the lab.
    pub used_gpu_hours: f64,
    /// When `used_gpu_hours` was last decayed.
    pub ledger_at: Time,
}

/// What the scheduler decided.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Jobs to start now.
    pub start: Vec<Start>,
    /// Guest jobs to stop (checkpoint, then stop within `grace_s`, then requeue).
    pub preempt: Vec<Preempt>,
    /// Every queued job that does not start, with the reason, in queue order.
    pub pending: Vec<Pending>,
}

/// Start a job on these GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    /// The job.
    pub job: JobId,
    /// The node it starts on.
    pub node: NodeId,
    /// The GPUs it gets, all on `node`, in id order.
    pub gpus: Vec<GpuId>,
    /// For a share job: the amounts it was given on its one GPU (both non-zero: a
    /// request that named only one of them gets the other resolved against that GPU).
    /// `None` for whole GPUs.
    pub share: Option<GpuShare>,
}

/// Stop a guest job so that its GPUs go back to the owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preempt {
    /// The running job.
    pub job: JobId,
    /// Seconds it gets to checkpoint and stop (the node's grace period).
    pub grace_s: u32,
    /// Why, in words the job's owner understands.
    pub reason: String,
}

/// A queued job that does not start in this plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The job.
    pub job: JobId,
    /// Why it waits.
    pub reason: crate::Reason,
    /// 1-based place in the queue among the jobs that wait.
    pub position: u32,
    /// When the job is expected to start: its reservation (guests), its expected start
    /// on its own lab's nodes (owner jobs), or else a bound from the jobs ahead of it
    /// and the time limits of the running jobs (see `estimate`). `None` when nothing
    /// bounds it (a rule or quota blocks it, or a job ahead has no time limit).
    pub estimated_start: Option<Time>,
}
