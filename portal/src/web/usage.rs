//! "My usage": the signed-in user's GPU use in each of their labs against every quota
//! that binds it (their member quota, and the operators' quota on what the whole lab
//! borrows), as bars, and their GPU-hours by week.
//!
//! Read through the same use cases as `GET /api/v1/me` and `GET /api/v1/usage`
//! (`service::account`): the page and the API cannot disagree, and the figures are
//! the scheduler's own.

use super::charts::UseBar;
use super::{human, Banner};
use crate::auth::CurrentUser;
use crate::error::WebError;
use crate::service::account::{self, LabAccount, LabUsageView};
use crate::state::AppState;
use actix_session::Session;
use actix_web::web;
use askama::Template;
use askama_web::WebTemplate;
use commons_api::files::{human_bytes, SpaceUse};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/usage", web::get().to(page));
}

/// One use against one quota: its label, its element id, and the bar.
struct Row {
    label: &'static str,
    id: String,
    bar: UseBar,
}

/// One week of the user's GPU-hours: Monday, the hours in words, the bar's width.
struct Week {
    monday: String,
    hours: String,
    pct: String,
}

struct LabBlock {
    slug: String,
    name: String,
    role: String,
    rows: Vec<Row>,
    running: u32,
    queued: u32,
    /// Newest first.
    weeks: Vec<Week>,
    /// The user administers the lab: the page links to its console.
    console: bool,
}

#[derive(Template, WebTemplate)]
#[template(path = "usage.html")]
struct UsagePage {
    banner: Banner,
    /// The window GPU-hour quotas count over.
    period_days: i64,
    /// The user's own file space against its quota.
    files: Option<UseBar>,
    labs: Vec<LabBlock>,
}

/// A file space's use against its quota ("1.2 GB used of 50 GB").
fn files_bar(u: &SpaceUse) -> UseBar {
    UseBar::new(
        format!("{} used", human_bytes(u.used_bytes)),
        u.used_bytes as f64,
        Some(u.quota_bytes as f64),
        |q| format!("of {}", human_bytes(q as u64)),
    )
}

fn block(
    a: &LabAccount,
    usage: Option<&LabUsageView>,
    period_days: i64,
    console: bool,
) -> LabBlock {
    let mine = a.gpu_hours_in_period;
    let borrowed = a.lab_borrowed_gpu_hours_in_period;
    let mut rows = vec![
        Row {
            label: "Your GPU-hours",
            id: format!("mine-hours-{}", a.slug),
            bar: UseBar::hours(
                format!("{} used in {period_days} days", human::hours(mine)),
                mine,
                a.quota.max_gpu_hours,
            ),
        },
        Row {
            label: "Your GPUs at once",
            id: format!("mine-gpus-{}", a.slug),
            bar: UseBar::gpus(
                format!("{} in use", a.gpus_in_use),
                f64::from(a.gpus_in_use),
                a.quota.max_gpus.map(f64::from),
            ),
        },
        Row {
            label: "The lab's borrowed GPU-hours",
            id: format!("lab-hours-{}", a.slug),
            bar: UseBar::hours(
                format!("{} borrowed in {period_days} days", human::hours(borrowed)),
                borrowed,
                a.lab_quota.max_gpu_hours,
            ),
        },
    ];
    if let Some(u) = &a.lab_files {
        rows.push(Row {
            label: "The lab's shared files",
            id: format!("lab-files-{}", a.slug),
            bar: files_bar(u),
        });
    }
    let hours: Vec<(chrono::NaiveDate, f64)> = usage
        .map(|u| {
            let mine = u.members.first().map(|m| m.gpu_hours.as_slice());
            u.week_starts
                .iter()
                .enumerate()
                .map(|(i, w)| (*w, mine.and_then(|h| h.get(i)).copied().unwrap_or(0.0)))
                .collect()
        })
        .unwrap_or_default();
    let top = hours.iter().map(|(_, h)| *h).fold(0.0, f64::max);
    LabBlock {
        slug: a.slug.clone(),
        name: a.name.clone(),
        role: a.role.as_str().to_string(),
        rows,
        console,
        running: a.running_jobs,
        queued: a.queued_jobs,
        weeks: hours
            .into_iter()
            .map(|(w, h)| Week {
                monday: w.format("%Y-%m-%d").to_string(),
                hours: human::hours(h),
                pct: format!("{:.0}", if top > 0.0 { h / top * 100.0 } else { 0.0 }),
            })
            .collect(),
    }
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<UsagePage, WebError> {
    let banner = Banner::new(&state, &session, Some(&user));
    let acc = account::me(&state, &user, state.config.policy.clone()).await?;
    let weeks = account::usage(&state, &user, None).await?;
    let labs = acc
        .labs
        .iter()
        .map(|a| {
            let u = weeks.iter().find(|w| w.lab == a.slug);
            let console = banner.admin_labs.contains(&a.slug);
            block(a, u, acc.quota_period_days, console)
        })
        .collect();
    Ok(UsagePage {
        banner,
        period_days: acc.quota_period_days,
        files: acc.files.as_ref().map(files_bar),
        labs,
    })
}
