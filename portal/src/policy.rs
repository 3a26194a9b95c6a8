//! Lending rules (set by lab admins per node) and quotas (operators for labs, lab admins
//! for members): the requests, their rules, and the use cases the API and the UI share.
//! Each call replaces the whole setting; a rule that breaks is refused with its field
//! named and nothing changes.

use crate::auth::CurrentUser;
use crate::db::schema::{labs, memberships, nodes};
use crate::db::{users, DbConn};
use crate::error::AppError;
use crate::state::AppState;
use commons_sched::{LendMode, Lending, Quota, WeeklyWindow};
use diesel::prelude::*;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowRequest {
    /// Weekdays, 0 = Monday.
    pub days: Vec<u32>,
    /// "HH:MM" local campus time.
    pub from: String,
    pub to: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LendingRequest {
    /// never | always | windows
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
}

fn hhmm(field: &str, s: &str) -> Result<u32, AppError> {
    let bad = || AppError::invalid(field, format!("{s:?} is not a time of day HH:MM"));
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 24 || m > 59 || (h == 24 && m > 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

fn in_range(field: &str, v: Option<i64>, max: i64) -> Result<Option<i64>, AppError> {
    match v {
        Some(x) if !(0..=max).contains(&x) => Err(AppError::invalid(
            field,
            format!("must be between 0 and {max}"),
        )),
        v => Ok(v),
    }
}

/// Checks a lending request and turns it into the scheduler's rules.
pub fn lending_rules(
    c: &mut DbConn,
    req: LendingRequest,
) -> Result<(Lending, i32, bool), AppError> {
    let mode = match req.mode.as_str() {
        "never" => LendMode::Never,
        "always" => LendMode::Always,
        "windows" => LendMode::Windows,
        _ => {
            return Err(AppError::invalid(
                "mode",
                "must be never, always or windows",
            ))
        }
    };
    let mut windows = Vec::new();
    for (i, w) in req.windows.iter().enumerate() {
        let field = format!("windows[{i}]");
        if w.days.is_empty() || w.days.iter().any(|d| *d > 6) {
            return Err(AppError::invalid(
                &format!("{field}.days"),
                "weekdays are 0 (Monday) to 6 (Sunday)",
            ));
        }
        let from = hhmm(&format!("{field}.from"), &w.from)?;
        let to = hhmm(&format!("{field}.to"), &w.to)?;
        if from == to {
            return Err(AppError::invalid(
                &format!("{field}.to"),
                "a window needs a length",
            ));
        }
        windows.extend(WeeklyWindow::daily(&w.days, from % 1440, to % 1440));
    }
    if mode == LendMode::Windows && windows.is_empty() {
        return Err(AppError::invalid(
            "windows",
            "mode windows needs at least one window",
        ));
    }
    let max_lent = in_range("max_lent_gpus", req.max_lent_gpus, 1024)?;
    let idle = in_range("min_idle_minutes", req.min_idle_minutes, 7 * 24 * 60)?;
    let longest = in_range("max_guest_minutes", req.max_guest_minutes, 30 * 24 * 60)?;
    let grace = in_range("grace_seconds", req.grace_seconds, 3600)?;
    let mut borrowers = Vec::new();
    for slug in &req.borrowers {
        let lab = users::lab_by_slug(c, slug)
            .map_err(|_| AppError::invalid("borrowers", format!("no lab {slug:?}")))?;
        borrowers.push(lab.id);
    }
    borrowers.sort_unstable();
    borrowers.dedup();
    Ok((
        Lending {
            mode,
            windows,
            max_lent_gpus: max_lent.map(|v| v as u32),
            min_idle_s: idle.unwrap_or(0) * 60,
            max_guest_time_limit_s: longest.map(|m| m * 60),
            borrowers,
        },
        grace.unwrap_or(300) as i32,
        req.reclaim,
    ))
}

#[derive(Debug, Deserialize)]
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

pub fn quota(req: &QuotaRequest) -> Result<Quota, AppError> {
    let gpus = in_range("max_gpus", req.max_gpus, 100_000)?;
    let minutes = in_range("max_job_minutes", req.max_job_minutes, 365 * 24 * 60)?;
    if let Some(h) = req.max_gpu_hours {
        if !(0.0..=10_000_000.0).contains(&h) {
            return Err(AppError::invalid(
                "max_gpu_hours",
                "must be between 0 and 10000000",
            ));
        }
    }
    Ok(Quota {
        max_gpus: gpus.map(|g| g as u32),
        max_gpu_hours: req.max_gpu_hours,
        max_time_limit_s: minutes.map(|m| m * 60),
    })
}

/// Replaces a node's lending rules (its lab's admins or operators).
pub async fn set_lending(
    state: &AppState,
    user: CurrentUser,
    node: i64,
    req: LendingRequest,
) -> Result<serde_json::Value, AppError> {
    let saved = state
        .db
        .run(move |c| {
            let n = crate::db::nodes::node_by_id(c, node)?;
            user.require_admin_of(n.lab_id)?;
            let (lending, grace, reclaim) = lending_rules(c, req)?;
            let json = serde_json::to_string(&lending).map_err(|e| AppError::Internal(e.into()))?;
            let before = serde_json::json!({"lending": n.lending_rules(), "grace_s": n.grace_s, "reclaim": n.reclaim});
            let after = serde_json::json!({"lending": lending, "grace_s": grace, "reclaim": reclaim});
            c.transaction(|c| {
                diesel::update(nodes::table.find(node))
                    .set((nodes::lending.eq(&json), nodes::grace_s.eq(grace), nodes::reclaim.eq(reclaim)))
                    .execute(c)?;
                crate::db::audit::record(c, &user.user, Some(n.lab_id), "set_lending", &format!("node {}", n.name), &before.to_string(), &after.to_string())
            })?;
            tracing::info!(node, by = %user.user.username, "lending rules changed");
            Ok::<_, AppError>(serde_json::json!({"node": node, "lending": lending, "grace_s": grace, "reclaim": reclaim}))
        })
        .await?;
    state.wake.notify_one();
    Ok(saved)
}

/// Replaces a lab's quota on borrowing (operators).
pub async fn set_lab_quota(
    state: &AppState,
    user: CurrentUser,
    slug: String,
    req: QuotaRequest,
) -> Result<Quota, AppError> {
    user.require_operator()?;
    set_lab_setting(state, user, slug, req, LabSetting::BorrowQuota).await
}

/// Replaces the lab's default quota for members without one of their own (the lab's
/// admins or operators).
pub async fn set_member_default_quota(
    state: &AppState,
    user: CurrentUser,
    slug: String,
    req: QuotaRequest,
) -> Result<Quota, AppError> {
    set_lab_setting(state, user, slug, req, LabSetting::MemberDefault).await
}

/// The two quotas a lab row holds.
#[derive(Clone, Copy)]
enum LabSetting {
    BorrowQuota,
    MemberDefault,
}

/// Stores one of the lab's quotas with its audit entry; the caller checked the role
/// that is not the lab admin's (operators for the borrowing quota).
async fn set_lab_setting(
    state: &AppState,
    user: CurrentUser,
    slug: String,
    req: QuotaRequest,
    which: LabSetting,
) -> Result<Quota, AppError> {
    let q = quota(&req)?;
    let json = serde_json::to_string(&q).map_err(|e| AppError::Internal(e.into()))?;
    state
        .db
        .run(move |c| {
            let lab = users::lab_by_slug(c, &slug).map_err(|_| AppError::NotFound("lab"))?;
            user.require_admin_of(lab.id)?;
            let (action, before) = match which {
                LabSetting::BorrowQuota => ("set_lab_quota", lab.quota.clone()),
                LabSetting::MemberDefault => ("set_member_default_quota", lab.member_quota.clone()),
            };
            c.transaction(|c| {
                let row = diesel::update(labs::table.find(lab.id));
                match which {
                    LabSetting::BorrowQuota => row.set(labs::quota.eq(&json)).execute(c)?,
                    LabSetting::MemberDefault => {
                        row.set(labs::member_quota.eq(&json)).execute(c)?
                    }
                };
                crate::db::audit::record(
                    c,
                    &user.user,
                    Some(lab.id),
                    action,
                    &format!("lab {slug}"),
                    &before,
                    &json,
                )
            })?;
            tracing::info!(lab = %slug, by = %user.user.username, action, "lab quota changed");
            Ok::<_, AppError>(())
        })
        .await?;
    state.wake.notify_one();
    Ok(q)
}

/// Replaces a member's quota in a lab (the lab's admins or operators).
pub async fn set_member_quota(
    state: &AppState,
    user: CurrentUser,
    slug: String,
    username: String,
    req: QuotaRequest,
) -> Result<Quota, AppError> {
    let q = quota(&req)?;
    let json = serde_json::to_string(&q).map_err(|e| AppError::Internal(e.into()))?;
    state
        .db
        .run(move |c| {
            let lab = users::lab_by_slug(c, &slug).map_err(|_| AppError::NotFound("lab"))?;
            user.require_admin_of(lab.id)?;
            let member = users::user_by_name(c, &username)?.ok_or(AppError::NotFound("member"))?;
            let before: Option<String> = memberships::table
                .filter(memberships::lab_id.eq(lab.id))
                .filter(memberships::user_id.eq(member.id))
                .select(memberships::quota)
                .first(c)
                .optional()?;
            let Some(before) = before else {
                return Err(AppError::NotFound("member"));
            };
            c.transaction(|c| {
                diesel::update(
                    memberships::table
                        .filter(memberships::lab_id.eq(lab.id))
                        .filter(memberships::user_id.eq(member.id)),
                )
                .set(memberships::quota.eq(&json))
                .execute(c)?;
                crate::db::audit::record(c, &user.user, Some(lab.id), "set_member_quota", &format!("member {username}"), &before, &json)
            })?;
            tracing::info!(lab = %slug, member = %username, by = %user.user.username, "member quota changed");
            Ok(())
        })
        .await?;
    state.wake.notify_one();
    Ok(q)
}

/// Makes a one-time enrolment token for one of the lab's servers (the lab's admins or
/// operators); returns the secret, shown once.
pub async fn create_enrol_token(
    state: &AppState,
    user: CurrentUser,
    slug: String,
) -> Result<String, AppError> {
    state
        .db
        .run(move |c| {
            let lab = users::lab_by_slug(c, &slug).map_err(|_| AppError::NotFound("lab"))?;
            user.require_admin_of(lab.id)?;
            c.transaction(|c| {
                let token = users::create_enrol_token(c, lab.id)?;
                crate::db::audit::record(
                    c,
                    &user.user,
                    Some(lab.id),
                    "create_enrol_token",
                    &format!("lab {slug}"),
                    "",
                    &format!("valid {} h", users::ENROL_TOKEN_TTL_H),
                )?;
                Ok(token)
            })
        })
        .await
}
