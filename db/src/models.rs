//! Rows as Rust structs. Enum and JSON columns are typed ([`super::types`]): a row that
//! does not parse fails its query.

use super::schema::*;
use super::types::Json;
pub use crate::domain::{AttemptStatus, JobKind, JobState, MembershipSource, Role};
use chrono::NaiveDateTime;
use commons_sched::{Lending, Quota};
use diesel::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = labs)]
pub struct Lab {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub created_at: NaiveDateTime,
    /// The operators' limit on what the lab borrows.
    pub quota: Json<Quota>,
    /// The lab admins' default for members without a quota of their own.
    pub member_quota: Json<Quota>,
    /// The lab's interactive jobs go ahead of its batch jobs (`sched::LabInfo`).
    pub interactive_boost: bool,
    /// The lab's jobs may use signed allow-list entries only.
    pub require_signed_images: bool,
}

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = users)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub email: String,
    pub display_name: String,
    pub is_operator: bool,
    pub created_at: NaiveDateTime,
    #[serde(skip)]
    pub oidc_issuer: Option<String>,
    #[serde(skip)]
    pub oidc_subject: Option<String>,
    /// Operator by the CLI (kept), as opposed to by an SSO group (refreshed at login).
    #[serde(skip)]
    pub operator_manual: bool,
}

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = nodes)]
pub struct Node {
    pub id: i64,
    pub lab_id: i64,
    pub name: String,
    #[serde(skip)]
    pub credential_hash: String,
    pub agent_version: String,
    pub online: bool,
    pub last_seen_at: Option<NaiveDateTime>,
    pub created_at: NaiveDateTime,
    pub revoked_at: Option<NaiveDateTime>,
    /// Set by the lab admin.
    pub lending: Json<Lending>,
    /// Seconds a preempted guest gets to checkpoint and stop.
    pub grace_s: i32,
    /// The owner takes every GPU back now.
    pub reclaim: bool,
    /// The agent process's `Hello.session` (its bits; the wire has a u64).
    #[serde(skip)]
    pub agent_session: i64,
    /// The agent's last message number the portal received, and when: leases count
    /// from it.
    #[serde(skip)]
    pub agent_seq: i64,
    #[serde(skip)]
    pub agent_seq_at: Option<NaiveDateTime>,
    /// Drained: no new job starts here, guests move elsewhere, owner jobs finish.
    pub draining: bool,
    /// CPUs, memory and free disk its agent reports (0: unknown).
    pub cpus: f64,
    pub memory_mb: i64,
    pub disk_gb: i64,
    /// The largest `disk_gb` its agent gives a job; none: not reported, no limit.
    pub max_job_disk_gb: Option<i64>,
    /// Why it takes no new guests now (its agent's disk is under its floor); none: it
    /// takes them.
    pub disk_low: Option<String>,
    /// Where the agent that holds the credential connects from (its TCP peer, and the
    /// address a proxy says it forwards for).
    pub agent_addr: String,
    /// A second agent with this credential, refused while the first lived: its session,
    /// address and when; flagged once the first proves alive after it.
    #[serde(skip)]
    pub contender_session: Option<i64>,
    #[serde(skip)]
    pub contender_addr: Option<String>,
    #[serde(skip)]
    pub contender_at: Option<NaiveDateTime>,
    /// Two agents used this credential at once (a cloned VM or state dir): when it was
    /// seen, where the one that kept it connects from, and where the refused one came from.
    pub shared_at: Option<NaiveDateTime>,
    pub shared_connected_from: Option<String>,
    pub shared_refused_from: Option<String>,
    /// The GPU models and counts the node first reported (JSON `{"model": count}`).
    #[serde(skip)]
    pub gpu_baseline: Option<String>,
    /// It reports more GPUs, or other models, than its baseline: no guests until its
    /// lab admin approves.
    pub inventory_unapproved: bool,
    /// What its agent last said it offers for datasets (exports, cache).
    #[serde(skip)]
    pub datasets: Json<commons_proto::NodeDatasets>,
    /// How its agent enforces shares of one GPU (`mps`, `timeslice`); none: it takes
    /// no shares.
    pub share_mode: Option<String>,
}

impl Node {
    /// Its lending rules as the scheduler applies them: shares only where the lab lends
    /// them and the agent enforces them.
    pub fn effective_lending(&self) -> Lending {
        let mut l = self.lending.0.clone();
        l.share_gpus &= self.share_mode.is_some();
        l
    }

    /// The last agent message a lease can count from: (session, seq, received at).
    pub fn agent_clock(&self) -> Option<AgentClock> {
        self.agent_seq_at.map(|at| AgentClock {
            session: self.agent_session as u64,
            seq: self.agent_seq as u64,
            received_at: at,
        })
    }
}

/// An agent message a lease counts from: the agent's (session, seq), and when the portal
/// received it. A lease of `ttl` ends at `received_at + ttl` for the portal, and earlier
/// for the agent (which counts from when it sent the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentClock {
    pub session: u64,
    pub seq: u64,
    pub received_at: NaiveDateTime,
}

impl AgentClock {
    pub fn lease(&self, ttl_s: u64) -> commons_proto::Lease {
        commons_proto::Lease {
            session: self.session,
            seq: self.seq,
            valid_for_s: ttl_s,
        }
    }
    pub fn lease_until(&self, ttl_s: u64) -> NaiveDateTime {
        self.received_at + chrono::Duration::seconds(ttl_s.min(i64::MAX as u64) as i64)
    }
}

impl Node {
    pub fn lending_rules(&self) -> Lending {
        self.lending.0.clone()
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = gpus)]
pub struct Gpu {
    pub id: i64,
    pub node_id: i64,
    pub uuid: String,
    pub idx: i32,
    pub model: String,
    pub memory_mb: i64,
    pub is_fake: bool,
    pub present: bool,
    pub local_use: bool,
    pub utilization_pct: i32,
    /// Last time the owner used it directly.
    pub idle_since: Option<NaiveDateTime>,
    /// Why the agent reports it faulty; withdrawn while set.
    pub fault: Option<String>,
}

#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = jobs)]
pub struct Job {
    pub id: i64,
    pub user_id: i64,
    pub lab_id: i64,
    pub image: String,
    pub command: Json<Vec<String>>,
    pub env: Json<BTreeMap<String, String>>,
    pub gpus: i32,
    pub gpu_models: Json<Vec<String>>,
    pub min_gpu_memory_mb: i64,
    pub cpus: f64,
    pub memory_mb: i64,
    pub time_limit_s: i64,
    pub kind: JobKind,
    pub state: JobState,
    pub reason: Option<String>,
    pub exit_code: Option<i64>,
    pub attempts: i32,
    pub node_id: Option<i64>,
    pub log_bytes: i64,
    pub created_at: NaiveDateTime,
    pub started_at: Option<NaiveDateTime>,
    pub finished_at: Option<NaiveDateTime>,
    /// Periodic checkpoints while it runs; none: only when it is stopped.
    pub checkpoint_interval_s: Option<i64>,
    /// `/dev/shm` in MiB; none: the agent's default.
    pub shm_mb: Option<i64>,
    /// The digest the allow-list pinned the image to when the job was submitted; the
    /// agent runs that image ID only. None for jobs older than the allow-list.
    pub image_digest: Option<String>,
    /// The allow-list entry's signature, if it had one (the agent may check it again).
    pub image_signature: Option<String>,
    /// The pin is the campus allow-list's; false: the job's lab's own entry, which runs
    /// from a local image on that lab's servers only.
    pub image_campus: bool,
    /// Its disk cap in GiB; none: the campus default (`[policy] default_disk_gb`).
    pub disk_gb: Option<i64>,
    /// The name its user gave it.
    pub name: Option<String>,
    /// Its tags, `{"key": "value"}`.
    pub tags: Json<BTreeMap<String, String>>,
    /// The jobs it waits for.
    pub after_jobs: Json<Vec<commons_api::flows::After>>,
    /// Queued but kept out of the scheduler's queue until its waits are met.
    pub held: bool,
    /// Its inputs as submitted (`commons_api::files::parse_input` reads each).
    pub inputs: Json<Vec<String>>,
    /// The datasets it mounts, as submitted.
    pub datasets: Json<Vec<commons_api::datasets::JobDataset>>,
    /// The array it is a task of, and its index there.
    pub array_id: Option<i64>,
    pub array_index: Option<i64>,
    /// A share of its one GPU: compute in thousandths (0: from its memory) and memory
    /// in MiB (0: from its compute); both none: whole GPUs.
    pub gpu_milli: Option<i32>,
    pub gpu_share_memory_mb: Option<i64>,
}

impl Job {
    /// The share of one GPU it asks for, if any.
    pub fn share_request(&self) -> Option<commons_sched::GpuShare> {
        if self.gpu_milli.is_none() && self.gpu_share_memory_mb.is_none() {
            return None;
        }
        Some(commons_sched::GpuShare {
            milli: self.gpu_milli.unwrap_or(0).max(0) as u32,
            memory_mb: self.gpu_share_memory_mb.unwrap_or(0).max(0) as u64,
        })
    }
}

impl Job {
    pub fn state(&self) -> JobState {
        self.state
    }
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = job_attempts)]
pub struct Attempt {
    pub id: i64,
    pub job_id: i64,
    pub attempt: i32,
    pub node_id: i64,
    /// Ids of the `gpus` rows it holds.
    pub gpu_ids: Json<Vec<i64>>,
    pub state: AttemptStatus,
    pub lease_until: NaiveDateTime,
    pub created_at: NaiveDateTime,
    pub started_at: Option<NaiveDateTime>,
    pub ended_at: Option<NaiveDateTime>,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    /// The share of its one GPU it holds (compute in thousandths, memory in MiB); none:
    /// its GPUs are its own.
    pub share_milli: Option<i32>,
    pub share_memory_mb: Option<i64>,
    /// GPU memory its processes use, as its agent last measured it (MiB).
    pub gpu_memory_used_mb: Option<i64>,
}

impl Attempt {
    pub fn gpu_id_list(&self) -> Vec<i64> {
        self.gpu_ids.0.clone()
    }
    /// The share of one GPU it holds, if it holds a share.
    pub fn share(&self) -> Option<commons_sched::GpuShare> {
        Some(commons_sched::GpuShare {
            milli: self.share_milli?.max(0) as u32,
            memory_mb: self.share_memory_mb.unwrap_or(0).max(0) as u64,
        })
    }
    /// How many GPUs it counts for in usage and quotas: its share's fraction, or its
    /// GPUs.
    pub fn gpu_amount(&self) -> f64 {
        match self.share() {
            Some(s) => f64::from(s.milli) / 1000.0,
            None => self.gpu_ids.0.len() as f64,
        }
    }
    pub fn status(&self) -> AttemptStatus {
        self.state
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = job_events)]
pub struct JobEvent {
    #[serde(skip)]
    pub id: i64,
    #[serde(skip)]
    pub job_id: i64,
    pub at: NaiveDateTime,
    pub state: JobState,
    pub message: String,
}

/// A user's SSH public key (`pubkey::parse` checked it before it was stored).
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = ssh_keys)]
pub struct SshKey {
    pub id: i64,
    #[serde(skip)]
    pub user_id: i64,
    pub name: String,
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`, ...
    pub algorithm: String,
    /// `SHA256:...` as `ssh-keygen -l` prints it; unique across all users.
    pub fingerprint: String,
    /// The canonical OpenSSH one-line form `algo base64 [comment]`.
    pub public_key: String,
    pub created_at: NaiveDateTime,
    /// Last time the SSH gateway let someone in with it.
    pub last_used_at: Option<NaiveDateTime>,
}

/// An allow-list entry: `name_tag` pinned to `digest`, for the campus (`lab_id` none) or
/// one lab.
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = image_allows)]
pub struct ImageAllow {
    pub id: i64,
    #[serde(skip)]
    pub lab_id: Option<i64>,
    pub name_tag: String,
    pub digest: String,
    pub description: String,
    pub signature: Option<String>,
    /// Fingerprint of the authority key that signed it.
    pub signed_by: Option<String>,
    pub created_by: String,
    pub created_at: NaiveDateTime,
}
