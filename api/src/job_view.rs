//! A job as the API shows it (`GET /api/v1/jobs[/{id}]`, and what submit, cancel and
//! extend answer), its history (`GET /api/v1/jobs/{id}/events`) and the states it moves
//! through.
//!
//! Invariant: a field that is absent in the JSON is `None` here, and one that the portal
//! writes as `null` is `null` in the document too (`estimated_start_at` is the one field
//! that tells the two apart).

use chrono::NaiveDateTime;
use serde::{Deserialize, Deserializer, Serialize};

use crate::JobKind;

/// A job's state, as users and the API see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for GPUs (`reason` says what for).
    Queued,
    /// Placed on a server, its container starting.
    Starting,
    Running,
    /// Being stopped to give its GPUs back; it resumes from its checkpoint later.
    Preempting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Starting,
        JobState::Running,
        JobState::Preempting,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The state as the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Preempting => "preempting",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The job has ended and will not change again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// Not running yet, or between two runs.
    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            JobState::Queued | JobState::Starting | JobState::Preempting
        )
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobState {
    type Err = crate::Invalid;
    fn from_str(s: &str) -> Result<Self, crate::Invalid> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                crate::Invalid::new(
                    "state",
                    format!("{s:?} is not a job state (queued, starting, running, preempting, succeeded, failed, cancelled)"),
                )
            })
    }
}

/// One GPU a job holds (or held, on its last attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuView {
    pub uuid: String,
    /// Its index on the server (what `nvidia-smi` numbers it).
    pub index: i32,
    pub model: String,
    /// The share of this GPU the job holds, when it holds a share and not the whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<GpuShareView>,
}

/// A share of one GPU that a job holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuShareView {
    /// Its compute share (0.25: a quarter of the GPU).
    pub fraction: f64,
    /// Its GPU memory in MiB.
    pub memory_mb: u64,
    /// GPU memory its processes use now, in MiB, as the server's agent measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mb: Option<u64>,
}

/// How far a starting attempt's inputs have been copied to its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Staging {
    /// Bytes on the server so far.
    pub done_bytes: u64,
    /// Bytes of all its inputs.
    pub total_bytes: u64,
}

impl Staging {
    /// Percent done, 0 to 100.
    pub fn percent(&self) -> u64 {
        (self.done_bytes.min(self.total_bytes) * 100)
            .checked_div(self.total_bytes)
            .unwrap_or(0)
    }

    /// "12 MB of 40 MB (30 %)".
    pub fn summary(&self) -> String {
        use crate::files::human_bytes;
        format!(
            "{} of {} ({} %)",
            human_bytes(self.done_bytes),
            human_bytes(self.total_bytes),
            self.percent()
        )
    }
}

/// A job as the API shows it. Times are UTC, without a zone (`2026-12-03T08:12:00.123`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub id: i64,
    /// The array it is a task of (`GET /api/v1/arrays/{id}`), and its index there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<i64>,
    /// The name it was given, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its tags, `{"key": "value"}`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// The jobs it waits for (or waited for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<crate::flows::After>,
    /// The files and folders it reads under `/inputs`, as submitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// The datasets it mounts read-only, as submitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<crate::datasets::JobDataset>,
    /// While its inputs are being copied to the server (before its container starts):
    /// how far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<Staging>,
    pub state: JobState,
    /// Why it is in this state, in words ("waiting: lab quota of 4 GPUs in use").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    /// While the job waits: when the scheduler expects it to start (UTC), `null` when
    /// it cannot tell. Absent for jobs that do not wait.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<NaiveDateTime>))]
    pub estimated_start_at: Option<Option<NaiveDateTime>>,
    /// The server it runs (or last ran) on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The GPUs of its last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<GpuView>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// How many times it was placed on a server.
    pub attempts: i32,
    pub image: String,
    pub command: Vec<String>,
    pub gpus_requested: i32,
    pub gpu_models: Vec<String>,
    pub time_limit_minutes: i64,
    /// The disk it asked for in GiB; absent: the campus default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<i64>,
    pub kind: JobKind,
    /// The slug of the lab it is charged to.
    pub lab: String,
    pub created_at: NaiveDateTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<NaiveDateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<NaiveDateTime>,
    /// When the checkpoint the job would resume from was stored (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_at: Option<NaiveDateTime>,
    /// Seconds until the running attempt reaches the time limit (counted from when it
    /// started running); only while the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_left_s: Option<i64>,
    /// Where its web app is served (its own origin), while it runs and once the app
    /// answered on its port during this attempt (the portal probes it every 2 s); only for
    /// jobs that asked for one (`app`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_url: Option<String>,
    /// When its web app ends for want of use (UTC), once the portal has warned that it
    /// is idle; absent while it is in use or has no idle limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_idle_ends_at: Option<NaiveDateTime>,
}

/// A field that may be absent (`None`) or `null` (`Some(None)`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl JobView {
    /// The estimated start in words, while the job waits: a UTC time, or "unknown".
    pub fn estimated_start(&self) -> Option<String> {
        let at = self.estimated_start_at?;
        Some(at.map_or("unknown".to_string(), |t| {
            t.format("%Y-%m-%d %H:%M UTC").to_string()
        }))
    }

    /// The time left in words ("1 h 05 min"), while the job runs.
    pub fn time_left(&self) -> Option<String> {
        let s = self.time_left_s?;
        let m = s / 60;
        Some(if s < 60 {
            "under a minute".to_string()
        } else if m < 60 {
            format!("{m} min")
        } else {
            format!("{} h {:02} min", m / 60, m % 60)
        })
    }
}

/// A job of a lab as its admins see it (`GET /api/v1/jobs?lab=SLUG`): the job and whose
/// it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabJobView {
    #[serde(flatten)]
    pub job: JobView,
    /// The owner's username.
    pub user: String,
}

/// One entry of a job's history: the state it entered, when, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobEvent {
    pub at: NaiveDateTime,
    pub state: JobState,
    pub message: String,
}

/// `POST /api/v1/jobs/{id}/extend`: more time for a queued or running interactive job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    /// Minutes to add to the job's time limit.
    pub minutes: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(json: &str) -> JobView {
        serde_json::from_str(json).unwrap()
    }

    const BASE: &str = r#""id":7,"state":"queued","attempts":0,"image":"x:1","command":[],"gpus_requested":1,"gpu_models":[],"time_limit_minutes":5,"kind":"batch","lab":"vision","created_at":"2026-12-03T08:12:00.123456""#;

    #[test]
    fn an_unknown_estimate_is_null_and_a_running_job_has_none() {
        let v = view(&format!("{{{BASE},\"estimated_start_at\":null}}"));
        assert_eq!(v.estimated_start_at, Some(None));
        assert_eq!(v.estimated_start().as_deref(), Some("unknown"));
        let back = serde_json::to_value(&v).unwrap();
        assert_eq!(back["estimated_start_at"], serde_json::Value::Null);
        let v = view(&format!("{{{BASE}}}"));
        assert_eq!(v.estimated_start_at, None);
        assert!(serde_json::to_value(&v)
            .unwrap()
            .get("estimated_start_at")
            .is_none());
        let v = view(&format!(
            "{{{BASE},\"estimated_start_at\":\"2027-01-15T08:00:00\"}}"
        ));
        assert_eq!(v.estimated_start().as_deref(), Some("2027-01-15 08:00 UTC"));
    }

    #[test]
    fn states_read_and_write_as_the_api_spells_them() {
        for s in JobState::ALL {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(s.as_str().parse::<JobState>(), Ok(s));
        }
        assert!("finished".parse::<JobState>().is_err());
        assert!(serde_json::from_str::<JobState>("\"finished\"").is_err());
    }

    #[test]
    fn a_lab_listing_is_the_job_and_its_owner() {
        let v: LabJobView =
            serde_json::from_str(&format!("{{{BASE},\"user\":\"alice\"}}")).unwrap();
        assert_eq!((v.job.id, v.user.as_str()), (7, "alice"));
        let back = serde_json::to_value(&v).unwrap();
        assert_eq!(back["user"], "alice");
        assert_eq!(back["lab"], "vision");
    }

    #[test]
    fn time_left_reads_in_hours_and_minutes() {
        let mut v = view(&format!("{{{BASE}}}"));
        assert_eq!(v.time_left(), None, "only while it runs");
        for (s, text) in [
            (30, "under a minute"),
            (600, "10 min"),
            (3900, "1 h 05 min"),
        ] {
            v.time_left_s = Some(s);
            assert_eq!(v.time_left().as_deref(), Some(text));
        }
    }
}
