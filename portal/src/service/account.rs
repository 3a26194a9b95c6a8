//! What a user may ask about themselves (`GET /api/v1/me`, `commons whoami`): who they
//! are, their labs and roles, and in each lab the quota that binds them and what they use
//! of it now; their GPU-hours by week (`GET /api/v1/usage`, `commons usage`), and, for a
//! lab's admins, the lab's (`?lab=SLUG`).
//!
//! Invariant: quotas and use are read exactly as the scheduler reads them (one
//! `db::snapshot::read`): a member without a quota of their own has the lab's default,
//! GPU-hours count over the same period, so what `whoami` shows is what binds.

use super::{lab_admin, Actor, Ctx};
use crate::db::{self, DbConn};
use crate::domain::Role;
use crate::error::AppError;
use commons_sched::{Policy, Quota};
use serde::Serialize;

/// A quota as users read it; `null` is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuotaView {
    pub max_gpus: Option<u32>,
    pub max_gpu_hours: Option<f64>,
    pub max_time_limit_minutes: Option<i64>,
}

impl From<&Quota> for QuotaView {
    fn from(q: &Quota) -> Self {
        QuotaView {
            max_gpus: q.max_gpus,
            max_gpu_hours: q.max_gpu_hours,
            max_time_limit_minutes: q.max_time_limit_s.map(|s| s / 60),
        }
    }
}

/// One of the user's labs, with their quota and use in it.
#[derive(Debug, Clone, Serialize)]
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
}

#[derive(Debug, Clone, Serialize)]
pub struct Account {
    pub username: String,
    pub email: String,
    pub name: String,
    pub operator: bool,
    /// The window GPU-hour quotas count over.
    pub quota_period_days: i64,
    pub labs: Vec<LabAccount>,
}

/// The actor's account (one snapshot read, in one transaction).
pub fn account(c: &mut DbConn, actor: &Actor, policy: &Policy) -> Result<Account, AppError> {
    let snap = db::snapshot::read(c, policy)?;
    let me = actor.user.id;
    let labs = actor
        .labs
        .iter()
        .map(|(lab, role)| {
            let member = snap
                .members
                .iter()
                .find(|m| m.lab == lab.id && m.user == me);
            let lab_info = snap.labs.iter().find(|l| l.id == lab.id);
            let mine = |lab_id: i64, user: i64| lab_id == lab.id && user == me;
            let running: Vec<_> = snap
                .running
                .iter()
                .filter(|r| mine(r.lab, r.user))
                .collect();
            LabAccount {
                slug: lab.slug.clone(),
                name: lab.name.clone(),
                role: *role,
                quota: member
                    .map(|m| QuotaView::from(&m.quota))
                    .unwrap_or_default(),
                lab_quota: QuotaView::from(&lab.quota.0),
                gpus_in_use: running.iter().map(|r| r.gpus.len() as u32).sum(),
                running_jobs: running.len() as u32,
                queued_jobs: snap.queue.iter().filter(|q| mine(q.lab, q.user)).count() as u32,
                gpu_hours_in_period: member.map(|m| m.period_gpu_hours).unwrap_or(0.0),
                lab_borrowed_gpu_hours_in_period: lab_info
                    .map(|l| l.period_gpu_hours)
                    .unwrap_or(0.0),
            }
        })
        .collect();
    Ok(Account {
        username: actor.user.username.clone(),
        email: actor.user.email.clone(),
        name: actor.user.display_name.clone(),
        operator: actor.user.is_operator,
        quota_period_days: db::snapshot::QUOTA_PERIOD_S / 86_400,
        labs,
    })
}

/// Weeks of usage shown.
pub const USAGE_WEEKS: usize = 6;

/// One week of a lab's usage, in GPU-hours.
#[derive(Debug, Clone, Serialize)]
pub struct WeekView {
    /// Monday of the week (UTC).
    pub week: chrono::NaiveDate,
    pub used: f64,
    pub borrowed: f64,
    pub lent: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemberUsage {
    pub username: String,
    /// GPU-hours per week, in the order of the lab's `weeks`.
    pub gpu_hours: Vec<f64>,
}

/// Usage in one lab: the lab's weeks and its members' (admins), or only the caller's.
#[derive(Debug, Clone, Serialize)]
pub struct LabUsageView {
    pub lab: String,
    /// Newest week first; absent for a member's own view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weeks: Option<Vec<WeekView>>,
    /// Mondays of the weeks, newest first.
    pub week_starts: Vec<chrono::NaiveDate>,
    pub members: Vec<MemberUsage>,
}

/// The caller's GPU-hours by week in each of their labs, or with `lab` the whole lab's
/// (its admins and operators only: 403 for others, 404 for an unknown lab).
pub async fn usage(
    ctx: &Ctx,
    actor: &Actor,
    lab: Option<String>,
) -> Result<Vec<LabUsageView>, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let now = db::now();
            if let Some(slug) = lab {
                let admin = lab_admin(c, &actor, &slug)?;
                let u = db::usage::lab_usage(c, admin.lab().id, now, USAGE_WEEKS)?;
                return Ok(vec![LabUsageView {
                    lab: slug,
                    week_starts: u.weeks.iter().map(|w| w.week).collect(),
                    weeks: Some(
                        u.weeks
                            .iter()
                            .map(|w| WeekView {
                                week: w.week,
                                used: w.used,
                                borrowed: w.borrowed,
                                lent: w.lent,
                            })
                            .collect(),
                    ),
                    members: u
                        .members
                        .into_iter()
                        .map(|(username, gpu_hours)| MemberUsage {
                            username,
                            gpu_hours,
                        })
                        .collect(),
                }]);
            }
            let mut out = Vec::new();
            for (l, _) in &actor.labs {
                let u = db::usage::lab_usage(c, l.id, now, USAGE_WEEKS)?;
                let mine = u
                    .members
                    .into_iter()
                    .find(|(name, _)| *name == actor.user.username)
                    .map(|(_, h)| h)
                    .unwrap_or_else(|| vec![0.0; u.weeks.len()]);
                out.push(LabUsageView {
                    lab: l.slug.clone(),
                    week_starts: u.weeks.iter().map(|w| w.week).collect(),
                    weeks: None,
                    members: vec![MemberUsage {
                        username: actor.user.username.clone(),
                        gpu_hours: mine,
                    }],
                });
            }
            Ok(out)
        })
        .await
}
