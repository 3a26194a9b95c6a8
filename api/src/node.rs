//! The campus's servers (`GET /api/v1/nodes`, and what drain, undrain, inventory approval
//! and the shared-credential dismissal answer), and their lab admins' lending rules and
//! quotas (`PUT /api/v1/nodes/{id}/lending`, `PUT /api/v1/labs/{slug}/...`).

use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One GPU of a server, as its agent last reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeGpu {
    pub id: i64,
    pub node_id: i64,
    pub uuid: String,
    /// Its index on the server.
    pub idx: i32,
    pub model: String,
    pub memory_mb: i64,
    /// A simulated GPU (the agent's `--fake-gpus`).
    pub is_fake: bool,
    /// Reported by the agent's last inventory.
    pub present: bool,
    /// The owner uses it directly (a process outside GPU Commons).
    pub local_use: bool,
    pub utilization_pct: i32,
    /// Last time the owner used it directly.
    pub idle_since: Option<NaiveDateTime>,
    /// Why the agent reports it faulty; withdrawn while set.
    pub fault: Option<String>,
}

/// When a node lends its GPUs to other labs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LendMode {
    /// Whenever the GPUs are idle.
    #[default]
    Always,
    /// Never: only the owner's jobs run here.
    Never,
    /// Only inside `windows`; a guest must end before its window does.
    Windows,
}

/// A weekly window in campus local time, in minutes from Monday 00:00 (0 to 10080);
/// `end_minute <= start_minute` wraps over the end of the week.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WeeklyWindow {
    pub start_minute: u32,
    /// The first minute after the window.
    pub end_minute: u32,
}

/// A node's lending rules as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lending {
    pub mode: LendMode,
    /// Used when `mode` is `windows`.
    pub windows: Vec<WeeklyWindow>,
    /// At most this many GPUs of the node held by guests at once.
    pub max_lent_gpus: Option<u32>,
    /// A GPU is lent only after it was idle this long.
    pub min_idle_s: i64,
    /// The longest time limit of a guest job here, in seconds.
    pub max_guest_time_limit_s: Option<i64>,
    /// Ids of the labs that may borrow; empty: every lab.
    pub borrowers: Vec<i64>,
    /// Its GPUs may carry shares of one GPU (`gpu_fraction`, `gpu_memory_gb`), for
    /// guests and its own lab alike, where its agent enforces them (`--share-mode`).
    #[serde(default)]
    pub share_gpus: bool,
}

/// Two agents with one node credential at once, as seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SharedCredential {
    /// When the second was refused (UTC).
    pub seen_at: NaiveDateTime,
    /// Where the agent that kept the node connects from.
    pub connected_from: String,
    /// Where the refused one came from.
    pub refused_from: String,
}

/// A server, its owner lab, GPUs and lending state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    pub id: i64,
    pub name: String,
    /// The owner lab's slug.
    pub lab: String,
    pub online: bool,
    pub agent_version: String,
    pub last_seen_at: Option<NaiveDateTime>,
    pub gpus: Vec<NodeGpu>,
    pub lending: Lending,
    /// Seconds a preempted guest gets here; 0: the campus default.
    pub grace_s: i32,
    /// The owner takes every GPU back now.
    pub reclaim: bool,
    /// No new job starts here; guests move elsewhere; owner jobs finish.
    pub draining: bool,
    /// CPUs, memory (MiB) and free disk (GiB) the agent reports; 0: not reported.
    pub cpus: f64,
    pub memory_mb: i64,
    pub disk_gb: i64,
    /// The largest disk (GiB) its agent gives one job; absent: not reported (no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_job_disk_gb: Option<i64>,
    /// Why it takes no new guests now (its agent's disk is under its floor); absent: it
    /// takes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_low: Option<String>,
    /// Where its agent connects from (its TCP peer; what a proxy says it forwards for).
    pub connected_from: String,
    /// The GPU models and counts it enrolled with (its first inventory), or that its lab
    /// admin last approved.
    pub approved_gpus: BTreeMap<String, u32>,
    /// It reports more GPUs, or other models, than that: no guest is placed here until
    /// a lab admin approves (`POST /api/v1/nodes/{id}/inventory/approve`).
    pub inventory_unapproved: bool,
    /// Two agents used its credential at once (a cloned server or state dir); `null`
    /// when never seen (or dismissed: `POST /api/v1/nodes/{id}/shared-credential/dismiss`).
    pub shared_credential: Option<SharedCredential>,
}

/// One weekly lending window as a lab admin writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WindowRequest {
    /// Weekdays, 0 = Monday.
    pub days: Vec<u32>,
    /// "HH:MM" local campus time.
    pub from: String,
    pub to: String,
}

/// `PUT /api/v1/nodes/{id}/lending`: a node's lending rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LendingRequest {
    /// `never`, `always` or `windows`.
    pub mode: String,
    #[serde(default)]
    pub windows: Vec<WindowRequest>,
    #[serde(default)]
    pub max_lent_gpus: Option<i64>,
    #[serde(default)]
    pub min_idle_minutes: Option<i64>,
    #[serde(default)]
    pub max_guest_minutes: Option<i64>,
    /// Slugs of the labs that may borrow; empty: every lab.
    #[serde(default)]
    pub borrowers: Vec<String>,
    #[serde(default)]
    pub grace_seconds: Option<i64>,
    /// The owner takes every GPU back now (guests are preempted; nothing is lent).
    #[serde(default)]
    pub reclaim: bool,
    /// Its GPUs may carry shares of one GPU (the agent must run with `--share-mode`);
    /// left out: as it was.
    #[serde(default)]
    pub share_gpus: Option<bool>,
}

/// What `PUT /api/v1/nodes/{id}/lending` stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LendingSaved {
    pub node: i64,
    pub lending: Lending,
    pub grace_s: i32,
    pub reclaim: bool,
}

/// `PUT /api/v1/labs/{slug}/quota`, `.../member-default-quota` and
/// `.../members/{username}/quota`; a limit left out (or `null`) is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QuotaRequest {
    #[serde(default)]
    pub max_gpus: Option<i64>,
    /// GPU-hours per 7 days.
    #[serde(default)]
    pub max_gpu_hours: Option<f64>,
    #[serde(default)]
    pub max_job_minutes: Option<i64>,
}

/// A quota as stored; `null` is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredQuota {
    pub max_gpus: Option<u32>,
    pub max_gpu_hours: Option<f64>,
    /// The longest time limit of one job, in seconds.
    pub max_time_limit_s: Option<i64>,
}

/// `PUT /api/v1/labs/{slug}/interactive`: whether the lab's interactive jobs go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InteractiveBoost {
    pub interactive_boost: bool,
}
