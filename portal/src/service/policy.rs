//! Lending rules (set by lab admins per node) and quotas (operators for labs, lab admins
//! for members): the requests, their rules, and the use cases the API and the UI share.
//! Each call replaces the whole setting; a rule that breaks is refused with its field
//! named and nothing changes. Every change is audited in the same transaction.

use super::Ctx;
use super::{lab_admin, node_admin, Actor};
use crate::db::types::to_json;
use crate::db::{self, users, DbConn};
use crate::error::AppError;
use commons_sched::{LendMode, Lending, Quota, WeeklyWindow};

pub use commons_api::node::{
    LendingRequest, LendingSaved, QuotaRequest, StoredQuota, WindowRequest,
};

/// Where a lending change takes its windows from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// From the request.
    Given,
    /// Keep the node's current windows (the web form's "custom" choice, for windows set
    /// through the API that no preset describes).
    Keep,
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

/// Checks a lending request and turns it into the scheduler's rules and the node's grace
/// period (0: the campus default).
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
        let lab = users::find_lab(c, slug)?
            .ok_or_else(|| AppError::invalid("borrowers", format!("no lab {slug:?}")))?;
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
            share_gpus: req.share_gpus.unwrap_or(false),
        },
        // No grace given: the campus default applies, whatever it is when a guest is
        // preempted.
        grace.unwrap_or(0) as i32,
        req.reclaim,
    ))
}

/// A quota as the API shows what was stored.
pub fn stored_quota(q: &Quota) -> StoredQuota {
    StoredQuota {
        max_gpus: q.max_gpus,
        max_gpu_hours: q.max_gpu_hours,
        max_time_limit_s: q.max_time_limit_s,
    }
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

/// Turns shares of one GPU on or off on a node (its lab's admins or operators): with it
/// on, jobs that ask for a fraction of a GPU may be placed there (where its agent
/// enforces shares). Running shares are left to finish when it goes off.
pub async fn set_sharing(state: &Ctx, actor: &Actor, node: i64, on: bool) -> Result<(), AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            let mut lending = n.lending.0.clone();
            lending.share_gpus = on;
            let json = to_json(&lending).map_err(|e| AppError::Internal(e.into()))?;
            db::transaction(c, |c| {
                db::nodes::set_lending(c, node, &json, n.grace_s, n.reclaim)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(n.lab_id),
                    "set_sharing",
                    &format!("node {}", n.name),
                    &serde_json::json!({"share_gpus": n.lending.share_gpus}).to_string(),
                    &serde_json::json!({"share_gpus": on}).to_string(),
                )
            })?;
            Ok::<_, AppError>(())
        })
        .await?;
    state.wake.notify_one();
    Ok(())
}

/// Replaces a node's lending rules (its lab's admins or operators).
pub async fn set_lending(
    state: &Ctx,
    actor: &Actor,
    node: i64,
    mut req: LendingRequest,
    windows: Windows,
) -> Result<LendingSaved, AppError> {
    let actor = actor.clone();
    let saved = state
        .db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            let keep = windows == Windows::Keep;
            if keep {
                // The windows stay as stored; the mode must stay "windows" for them to apply.
                req.windows.clear();
                req.mode = "always".into();
            }
            let keep_sharing = req.share_gpus.is_none();
            let (mut lending, grace, reclaim) = lending_rules(c, req)?;
            if keep_sharing {
                lending.share_gpus = n.lending.share_gpus;
            }
            if keep {
                lending.mode = LendMode::Windows;
                lending.windows = n.lending.windows.clone();
                if lending.windows.is_empty() {
                    return Err(AppError::invalid(
                        "mode",
                        "this server has no lending windows to keep; pick a preset",
                    ));
                }
            }
            let json = to_json(&lending).map_err(|e| AppError::Internal(e.into()))?;
            let before = serde_json::json!({"lending": n.lending, "grace_s": n.grace_s, "reclaim": n.reclaim});
            let after = serde_json::json!({"lending": lending, "grace_s": grace, "reclaim": reclaim});
            db::transaction(c, |c| {
                db::nodes::set_lending(c, node, &json, grace, reclaim)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(n.lab_id),
                    "set_lending",
                    &format!("node {}", n.name),
                    &before.to_string(),
                    &after.to_string(),
                )
            })?;
            tracing::info!(node, by = %admin.user().username, "lending rules changed");
            Ok::<_, AppError>(LendingSaved {
                node,
                lending: super::nodes::lending_view(lending),
                grace_s: grace,
                reclaim,
            })
        })
        .await?;
    state.wake.notify_one();
    Ok(saved)
}

/// The two quotas a lab row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabQuota {
    /// What the lab may borrow (operators set it).
    Borrowing,
    /// The default for members without a quota of their own (lab admins set it).
    MemberDefault,
}

/// Replaces one of a lab's quotas: the borrowing quota (operators) or the members'
/// default (the lab's admins or operators).
pub async fn set_lab_quota(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    req: QuotaRequest,
    which: LabQuota,
) -> Result<Quota, AppError> {
    if which == LabQuota::Borrowing {
        actor.require_operator()?;
    }
    let q = quota(&req)?;
    let json = to_json(&q).map_err(|e| AppError::Internal(e.into()))?;
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab();
            let (action, before) = match which {
                LabQuota::Borrowing => ("set_lab_quota", &lab.quota),
                LabQuota::MemberDefault => ("set_member_default_quota", &lab.member_quota),
            };
            let before = to_json(before).map_err(|e| AppError::Internal(e.into()))?;
            db::transaction(c, |c| {
                db::users::set_lab_quota(c, lab.id, which == LabQuota::Borrowing, &json)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(lab.id),
                    action,
                    &format!("lab {slug}"),
                    &before,
                    &json,
                )
            })?;
            tracing::info!(lab = %slug, by = %admin.user().username, action, "lab quota changed");
            Ok::<_, AppError>(())
        })
        .await?;
    state.wake.notify_one();
    Ok(q)
}

/// Replaces a member's quota in a lab (the lab's admins or operators).
pub async fn set_member_quota(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    username: String,
    req: QuotaRequest,
) -> Result<Quota, AppError> {
    let q = quota(&req)?;
    let json = to_json(&q).map_err(|e| AppError::Internal(e.into()))?;
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab().id;
            let member = users::user_by_name(c, &username)?.ok_or(AppError::NotFound("member"))?;
            let Some(m) = db::users::membership(c, lab, member.id)? else {
                return Err(AppError::NotFound("member"));
            };
            let before = to_json(&m.quota).map_err(|e| AppError::Internal(e.into()))?;
            db::transaction(c, |c| {
                db::users::set_member_quota(c, lab, member.id, &json)?;
                db::audit::record(c, admin.user(), Some(lab), "set_member_quota", &format!("member {username}"), &before, &json)
            })?;
            tracing::info!(lab = %slug, member = %username, by = %admin.user().username, "member quota changed");
            Ok(())
        })
        .await?;
    state.wake.notify_one();
    Ok(q)
}

/// Sets several members' quotas at once (the console's one Save). Every quota is
/// checked first (a refusal names the field and the member, `max_gpus:alice`); then the
/// ones that change are written in one transaction, each with its audit entry. Returns
/// how many changed.
pub async fn set_member_quotas(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    reqs: Vec<(String, QuotaRequest)>,
) -> Result<usize, AppError> {
    let mut quotas = Vec::new();
    for (user, req) in &reqs {
        let q = quota(req).map_err(|e| match e {
            AppError::Invalid {
                code,
                field,
                message,
            } => AppError::Invalid {
                code,
                field: format!("{field}:{user}"),
                message: format!("{user}: {message}"),
            },
            other => other,
        })?;
        quotas.push((user.clone(), q));
    }
    let actor = actor.clone();
    let changed = state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab().id;
            let mut rows = Vec::new();
            for (username, q) in &quotas {
                let member =
                    users::user_by_name(c, username)?.ok_or(AppError::NotFound("member"))?;
                let m = db::users::membership(c, lab, member.id)?
                    .ok_or(AppError::NotFound("member"))?;
                if m.quota.0 != *q {
                    let before = to_json(&m.quota).map_err(|e| AppError::Internal(e.into()))?;
                    let after = to_json(q).map_err(|e| AppError::Internal(e.into()))?;
                    rows.push((username.clone(), member.id, before, after));
                }
            }
            db::transaction(c, |c| {
                for (username, id, before, after) in &rows {
                    db::users::set_member_quota(c, lab, *id, after)?;
                    db::audit::record(
                        c,
                        admin.user(),
                        Some(lab),
                        "set_member_quota",
                        &format!("member {username}"),
                        before,
                        after,
                    )?;
                }
                Ok::<_, AppError>(())
            })?;
            tracing::info!(lab = %slug, changed = rows.len(), by = %admin.user().username, "member quotas changed");
            Ok::<_, AppError>(rows.len())
        })
        .await?;
    if changed > 0 {
        state.wake.notify_one();
    }
    Ok(changed)
}

/// Turns the lab's priority boost for interactive jobs on or off (the lab's admins or
/// operators): its interactive jobs then go ahead of its batch jobs (`sched::LabInfo`).
pub async fn set_interactive_boost(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    on: bool,
) -> Result<bool, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab();
            let before = lab.interactive_boost;
            db::transaction(c, |c| {
                db::users::set_interactive_boost(c, lab.id, on)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(lab.id),
                    "set_interactive_boost",
                    &format!("lab {slug}"),
                    &format!("interactive_boost {before}"),
                    &format!("interactive_boost {on}"),
                )
            })?;
            tracing::info!(lab = %slug, by = %admin.user().username, on, "interactive boost changed");
            Ok::<_, AppError>(())
        })
        .await?;
    state.wake.notify_one();
    Ok(on)
}

/// Makes a one-time enrolment token for one of the lab's servers (the lab's admins or
/// operators); returns the secret, shown once.
pub async fn create_enrol_token(
    state: &Ctx,
    actor: &Actor,
    slug: String,
) -> Result<String, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            db::transaction(c, |c| {
                let token = users::create_enrol_token(c, admin.lab().id)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(admin.lab().id),
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
