//! A lab's console as its admins see it: servers with their lending rules, members with
//! their roles and quotas, usage by week, the lab's audit log. A read model, built in a
//! fixed number of queries.

use super::{lab_admin, Actor};
use crate::db::models::{Lab, Node, Role};
use crate::db::{self, DbConn};
use crate::domain::MembershipSource;
use crate::error::AppError;
use commons_sched::{LendMode, Lending, Quota};

/// One server as the console shows it.
pub struct NodeRow {
    pub node: Node,
    /// The web form's choice that describes the stored rule: never, always, nights,
    /// weekends, nights_weekends, or custom (windows no preset describes).
    pub preset: &'static str,
    pub lending: Lending,
    /// Slugs of the labs that may borrow, comma-separated.
    pub borrowers: String,
    /// The rules in one sentence.
    pub sentence: String,
}

pub struct MemberRow {
    pub username: String,
    pub role: Role,
    pub source: MembershipSource,
    pub quota: Quota,
    /// GPUs the member's running jobs hold now, and GPU-hours over the quota period.
    pub gpus_now: u32,
    pub gpu_hours: f64,
}

pub struct LabConsole {
    pub lab: Lab,
    pub nodes: Vec<NodeRow>,
    pub members: Vec<MemberRow>,
    pub audit: Vec<AuditEntry>,
    pub usage: LabUsage,
}

/// Weeks of usage the console shows.
const USAGE_WEEKS: usize = 6;
/// Audit entries the console shows.
const AUDIT_ROWS: i64 = 100;

/// The console of lab `slug`, for its admins and operators.
pub fn console(c: &mut DbConn, actor: &Actor, slug: &str) -> Result<LabConsole, AppError> {
    let admin = lab_admin(c, actor, slug)?;
    let lab = admin.lab().clone();
    let all_labs = db::users::all_lab_slugs(c)?;
    let nodes = db::nodes::of_lab(c, lab.id)?
        .into_iter()
        .map(|node| {
            let lending = node.lending.0.clone();
            let borrowers = lending
                .borrowers
                .iter()
                .filter_map(|id| {
                    all_labs
                        .iter()
                        .find(|(l, _)| l == id)
                        .map(|(_, s)| s.clone())
                })
                .collect::<Vec<_>>()
                .join(", ");
            NodeRow {
                sentence: lending_sentence(&lending, &borrowers),
                preset: preset(&lending),
                lending,
                borrowers,
                node,
            }
        })
        .collect();
    let used = db::usage::member_use(c, lab.id, db::now(), db::snapshot::QUOTA_PERIOD_S)?;
    let members = db::users::members_of(c, lab.id)?
        .into_iter()
        .map(|(username, m)| {
            let (gpus_now, gpu_hours) = used.get(&username).copied().unwrap_or_default();
            MemberRow {
                username,
                role: m.role,
                source: m.source,
                quota: m.quota.0,
                gpus_now,
                gpu_hours,
            }
        })
        .collect();
    Ok(LabConsole {
        audit: db::audit::list(c, Some(lab.id), AUDIT_ROWS)?,
        usage: db::usage::lab_usage(c, lab.id, db::now(), USAGE_WEEKS)?,
        lab,
        nodes,
        members,
    })
}

/// Lab `slug`'s usage by week over `weeks` weeks, for its admins and operators (the
/// CSV export).
pub fn usage(
    c: &mut DbConn,
    actor: &Actor,
    slug: &str,
    weeks: usize,
) -> Result<LabUsage, AppError> {
    let admin = lab_admin(c, actor, slug)?;
    Ok(db::usage::lab_usage(c, admin.lab().id, db::now(), weeks)?)
}

/// A node's lending rules in one sentence: "lends up to 4 GPUs on nights and weekends
/// to every lab, after 15 idle minutes, guest jobs of at most 2 h".
pub fn lending_sentence(l: &Lending, borrowers: &str) -> String {
    let when = match preset(l) {
        "never" => return "lends nothing: only the lab's own jobs run here".to_string(),
        "always" => "whenever idle".to_string(),
        "nights" => "at night (19:00 to 07:00)".to_string(),
        "weekends" => "on weekends".to_string(),
        "nights_weekends" => "on nights and weekends".to_string(),
        _ => format!("in {} weekly windows", l.windows.len()),
    };
    let how_many = match l.max_lent_gpus {
        Some(1) => "up to 1 GPU".to_string(),
        Some(n) => format!("up to {n} GPUs"),
        None => "its GPUs".to_string(),
    };
    let to = if borrowers.is_empty() {
        "every lab".to_string()
    } else {
        format!("labs {borrowers}")
    };
    let mut s = format!("lends {how_many} {when} to {to}");
    if l.min_idle_s > 0 {
        s.push_str(&format!(", after {} idle minutes", l.min_idle_s / 60));
    }
    if let Some(t) = l.max_guest_time_limit_s {
        s.push_str(&format!(", guest jobs of at most {} min", t / 60));
    }
    s
}

/// Nights: 19:00 to 07:00 every day.
pub const NIGHTS: (u32, u32) = (19 * 60, 7 * 60);
const EVERY_DAY: [u32; 7] = [0, 1, 2, 3, 4, 5, 6];
const WEEKEND: [u32; 2] = [5, 6];

/// The weekly windows of a form preset (days, from, to in minutes of the day).
pub fn preset_windows(name: &str) -> Option<Vec<(&'static [u32], u32, u32)>> {
    let nights: (&'static [u32], u32, u32) = (&EVERY_DAY, NIGHTS.0, NIGHTS.1);
    let weekends: (&'static [u32], u32, u32) = (&WEEKEND, 0, 0);
    match name {
        "nights" => Some(vec![nights]),
        "weekends" => Some(vec![weekends]),
        "nights_weekends" => Some(vec![nights, weekends]),
        _ => None,
    }
}

fn windows_of(preset: &[(&[u32], u32, u32)]) -> Vec<commons_sched::WeeklyWindow> {
    let mut w: Vec<_> = preset
        .iter()
        .flat_map(|(days, from, to)| commons_sched::WeeklyWindow::daily(days, *from, *to))
        .collect();
    w.sort_by_key(|w| (w.start_minute, w.end_minute));
    w
}

/// Which form choice the stored rule is; `custom` when its windows are none of the
/// presets (set through the API), so saving the form does not replace them.
pub fn preset(l: &Lending) -> &'static str {
    match l.mode {
        LendMode::Never => "never",
        LendMode::Always => "always",
        LendMode::Windows => {
            let mut stored = l.windows.clone();
            stored.sort_by_key(|w| (w.start_minute, w.end_minute));
            ["nights", "weekends", "nights_weekends"]
                .into_iter()
                .find(|p| preset_windows(p).is_some_and(|w| windows_of(&w) == stored))
                .unwrap_or("custom")
        }
    }
}

pub use crate::db::audit::AuditEntry;
pub use crate::db::usage::LabUsage;
/// The whole campus's audit log, newest first (operators only; lab admins read their
/// lab's in its console).
pub async fn campus_audit(ctx: &super::Ctx, actor: &Actor) -> Result<Vec<AuditEntry>, AppError> {
    actor.require_operator()?;
    ctx.db
        .run(|c| crate::db::audit::list(c, None, 500))
        .await
        .map_err(AppError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lending_rules_read_as_a_sentence() {
        let mut l = Lending {
            mode: LendMode::Windows,
            windows: windows_of(&preset_windows("nights_weekends").unwrap_or_default()),
            max_lent_gpus: Some(4),
            min_idle_s: 15 * 60,
            ..Default::default()
        };
        assert_eq!(
            lending_sentence(&l, ""),
            "lends up to 4 GPUs on nights and weekends to every lab, after 15 idle minutes"
        );
        l.max_guest_time_limit_s = Some(7200);
        l.max_lent_gpus = None;
        assert!(lending_sentence(&l, "physics")
            .contains("its GPUs on nights and weekends to labs physics"));
        assert!(lending_sentence(&l, "").ends_with("guest jobs of at most 120 min"));
        l.mode = LendMode::Never;
        assert!(lending_sentence(&l, "").starts_with("lends nothing"));
    }
}
