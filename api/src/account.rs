//! Who the caller is and what they use: `GET /api/v1/me` (labs, roles, quotas and use, as
//! the scheduler reads them), `GET /api/v1/usage[?lab=SLUG]` (GPU-hours by week) and
//! `POST /api/v1/users/{username}/sign-out`.

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

/// A member's role in a lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Member,
    /// Manages the lab: its members, quotas, servers and image allow-list.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A quota as users read it; `null` is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaView {
    /// GPUs held at once.
    pub max_gpus: Option<u32>,
    /// GPU-hours over the quota period.
    pub max_gpu_hours: Option<f64>,
    /// The longest time limit of one job.
    pub max_time_limit_minutes: Option<i64>,
}

/// One of the user's labs, with their quota and use in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabAccount {
    pub slug: String,
    pub name: String,
    pub role: Role,
    /// The member's quota in this lab (their own, else the lab's default for members).
    pub quota: QuotaView,
    /// The operators' quota on what the whole lab borrows from other labs.
    pub lab_quota: QuotaView,
    /// GPUs the user's jobs charged to this lab hold now.
    pub gpus_in_use: u32,
    pub running_jobs: u32,
    pub queued_jobs: u32,
    /// GPU-hours of the user's jobs charged to this lab in the quota period.
    pub gpu_hours_in_period: f64,
    /// GPU-hours the lab borrowed in the quota period (what `lab_quota` counts).
    pub lab_borrowed_gpu_hours_in_period: f64,
    /// The lab's shared file space against its quota (absent from older portals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab_files: Option<crate::files::SpaceUse>,
}

/// `GET /api/v1/me`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Account {
    pub username: String,
    pub email: String,
    /// The display name.
    pub name: String,
    /// A campus operator (may see and manage every lab).
    pub operator: bool,
    /// The window GPU-hour quotas count over.
    pub quota_period_days: i64,
    pub labs: Vec<LabAccount>,
    /// The user's own file space against its quota (absent from older portals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<crate::files::SpaceUse>,
}

impl Account {
    /// The slugs of the labs the user administers.
    pub fn admin_labs(&self) -> Vec<&str> {
        self.labs
            .iter()
            .filter(|l| l.role == Role::Admin)
            .map(|l| l.slug.as_str())
            .collect()
    }
}

/// One week of a lab's usage, in GPU-hours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WeekView {
    /// Monday of the week (UTC).
    pub week: NaiveDate,
    /// By the lab's jobs, wherever they ran.
    pub used: f64,
    /// By the lab's jobs on other labs' servers.
    pub borrowed: f64,
    /// By other labs' jobs on this lab's servers.
    pub lent: f64,
}

/// One member's GPU-hours per week.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberUsage {
    pub username: String,
    /// GPU-hours per week, in the order of the lab's `week_starts`.
    pub gpu_hours: Vec<f64>,
}

/// Usage in one lab: the lab's weeks and its members' (admins), or only the caller's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabUsageView {
    pub lab: String,
    /// Newest week first; absent for a member's own view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weeks: Option<Vec<WeekView>>,
    /// Mondays of the weeks, newest first.
    pub week_starts: Vec<NaiveDate>,
    pub members: Vec<MemberUsage>,
}

/// `POST /api/v1/users/{username}/sign-out`: how many browser sessions were ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionsEnded {
    pub sessions_ended: u64,
}
