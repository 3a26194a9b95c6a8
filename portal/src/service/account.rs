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
use crate::error::AppError;
use commons_sched::{Policy, Quota};

pub use commons_api::account::{
    Account, LabAccount, LabUsageView, MemberUsage, QuotaView, WeekView,
};

/// A quota as users read it.
pub fn quota_view(q: &Quota) -> QuotaView {
    QuotaView {
        max_gpus: q.max_gpus,
        max_gpu_hours: q.max_gpu_hours,
        max_time_limit_minutes: q.max_time_limit_s.map(|s| s / 60),
    }
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
                role: super::views::api_role(*role),
                quota: member.map(|m| quota_view(&m.quota)).unwrap_or_default(),
                lab_quota: quota_view(&lab.quota.0),
                gpus_in_use: running.iter().map(|r| r.gpus.len() as u32).sum(),
                running_jobs: running.len() as u32,
                queued_jobs: snap.queue.iter().filter(|q| mine(q.lab, q.user)).count() as u32,
                gpu_hours_in_period: member.map(|m| m.period_gpu_hours).unwrap_or(0.0),
                lab_borrowed_gpu_hours_in_period: lab_info
                    .map(|l| l.period_gpu_hours)
                    .unwrap_or(0.0),
                lab_files: None,
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
        files: None,
    })
}

/// The actor's account with the use of their file spaces (their own, their labs'):
/// what `GET /api/v1/me` answers and *My usage* shows.
pub async fn me(ctx: &Ctx, actor: &Actor, policy: Policy) -> Result<Account, AppError> {
    let (actor, quotas) = (actor.clone(), ctx.files.quotas);
    ctx.db
        .run(move |c| {
            let mut acc = account(c, &actor, &policy)?;
            let (mine, labs) = super::files::uses(c, &quotas, &actor)?;
            acc.files = Some(mine);
            for (l, (lab, _)) in acc.labs.iter_mut().zip(&actor.labs) {
                l.lab_files = labs.iter().find(|(id, _)| *id == lab.id).map(|(_, u)| *u);
            }
            Ok(acc)
        })
        .await
}

/// Weeks of usage shown.
pub const USAGE_WEEKS: usize = 6;

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
