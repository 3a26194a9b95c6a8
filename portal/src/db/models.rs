//! Rows as Rust structs, and the enums stored as text.

use super::schema::*;
use chrono::NaiveDateTime;
use diesel::prelude::*;
use serde::Serialize;

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = labs)]
pub struct Lab {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub created_at: NaiveDateTime,
    /// JSON of `commons_sched::Quota`: the operators' limit on what the lab borrows.
    pub quota: String,
    /// JSON of `commons_sched::Quota`: the lab admins' default for members without one.
    pub member_quota: String,
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
    /// JSON of `commons_sched::Lending`, set by the lab admin.
    pub lending: String,
    /// Seconds a preempted guest gets to checkpoint and stop.
    pub grace_s: i32,
    /// The owner takes every GPU back now.
    pub reclaim: bool,
}

impl Node {
    pub fn lending_rules(&self) -> commons_sched::Lending {
        serde_json::from_str(&self.lending).unwrap_or_default()
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
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = jobs)]
pub struct Job {
    pub id: i64,
    pub user_id: i64,
    pub lab_id: i64,
    pub image: String,
    pub command: String,
    pub env: String,
    pub gpus: i32,
    pub gpu_models: String,
    pub min_gpu_memory_mb: i64,
    pub cpus: f64,
    pub memory_mb: i64,
    pub time_limit_s: i64,
    pub kind: String,
    pub state: String,
    pub reason: Option<String>,
    pub queue_position: Option<i32>,
    pub exit_code: Option<i64>,
    pub attempts: i32,
    pub node_id: Option<i64>,
    pub log_bytes: i64,
    pub created_at: NaiveDateTime,
    pub started_at: Option<NaiveDateTime>,
    pub finished_at: Option<NaiveDateTime>,
}

impl Job {
    pub fn state(&self) -> JobState {
        JobState::parse(&self.state)
    }
    pub fn command_vec(&self) -> Vec<String> {
        serde_json::from_str(&self.command).unwrap_or_default()
    }
    pub fn env_map(&self) -> std::collections::BTreeMap<String, String> {
        serde_json::from_str(&self.env).unwrap_or_default()
    }
    pub fn models_vec(&self) -> Vec<String> {
        serde_json::from_str(&self.gpu_models).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = job_attempts)]
pub struct Attempt {
    pub id: i64,
    pub job_id: i64,
    pub attempt: i32,
    pub node_id: i64,
    pub gpu_ids: String,
    pub state: String,
    pub lease_until: NaiveDateTime,
    pub created_at: NaiveDateTime,
    pub started_at: Option<NaiveDateTime>,
    pub ended_at: Option<NaiveDateTime>,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
}

impl Attempt {
    pub fn gpu_id_list(&self) -> Vec<i64> {
        self.gpu_ids
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    }
    pub fn status(&self) -> AttemptStatus {
        AttemptStatus::parse(&self.state)
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
    pub state: String,
    pub message: String,
}

macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? } default $default:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            /// Unknown text (a newer portal's state) reads as the default.
            pub fn parse(s: &str) -> Self {
                match s { $($text => $name::$variant,)+ _ => $name::$default }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(
    /// A job's state, as users and the API see it.
    JobState {
        Queued => "queued",
        Starting => "starting",
        Running => "running",
        Preempting => "preempting",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
    } default Failed
);

impl JobState {
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

text_enum!(
    /// An attempt's state in the portal. Active attempts hold their GPUs.
    AttemptStatus {
        Starting => "starting",
        Running => "running",
        Stopping => "stopping",
        Exited => "exited",
        Stopped => "stopped",
        Failed => "failed",
        Lost => "lost",
    } default Lost
);

impl AttemptStatus {
    pub const ACTIVE: [&'static str; 3] = ["starting", "running", "stopping"];
    pub fn is_active(self) -> bool {
        matches!(self, Self::Starting | Self::Running | Self::Stopping)
    }
}

text_enum!(
    /// A member's role in a lab.
    Role {
        Member => "member",
        Admin => "admin",
    } default Member
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_enums_round_trip() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), *s);
        }
        for s in AttemptStatus::ALL {
            assert_eq!(AttemptStatus::parse(s.as_str()), *s);
        }
        assert!(JobState::Cancelled.is_final());
        assert!(!JobState::Preempting.is_final());
        assert!(AttemptStatus::Stopping.is_active());
    }
}
