//! The job page's GPU utilisation section: the chart of the job's samples (server-drawn
//! SVG), its summary in words and a legend of the attempts. The full page includes it;
//! `GET /jobs/{id}/utilization` serves it alone, which the page's script fetches again
//! while the job runs (every sample interval, at least every minute, and whenever the
//! job's state changes).

use super::charts;
use crate::auth::CurrentUser;
use crate::error::WebError;
use crate::service::utilization::{self, memory};
use crate::state::AppState;
use actix_web::web;
use askama::Template;
use askama_web::WebTemplate;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs/{id}/utilization", web::get().to(fragment));
}

/// What the section shows.
pub(super) struct UtilizationBlock {
    /// The chart, when there are samples.
    pub svg: Option<String>,
    /// "mean 73 %, peak 100 %, memory up to 58.6 GB", or "no samples yet".
    pub summary: String,
    /// Each attempt: its words and its line's colour.
    pub legend: Vec<(String, &'static str)>,
    pub interval: String,
    pub retention_days: u64,
    /// How often the script fetches the section again (milliseconds).
    pub refresh_ms: u64,
}

/// The section for job `id` (404 unless `user` may see the job).
pub(super) async fn block(
    state: &AppState,
    user: &CurrentUser,
    id: i64,
) -> Result<UtilizationBlock, WebError> {
    let config = &state.config.utilization;
    let u = utilization::of_job(state, user, id, config).await?;
    let legend = u
        .attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let n = a.samples.len() as f64;
            let mean = a.samples.iter().map(|p| p.utilization_pct).sum::<f64>() / n;
            let peak = a
                .samples
                .iter()
                .map(|p| p.memory_used_mb)
                .max()
                .unwrap_or(0);
            let on = a
                .node
                .as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default();
            (
                format!(
                    "attempt {}{on}: mean {mean:.0} %, memory up to {}",
                    a.attempt,
                    memory(peak)
                ),
                charts::attempt_colour(i),
            )
        })
        .collect();
    Ok(UtilizationBlock {
        svg: charts::utilization_svg(&u),
        summary: u.summary.words(),
        legend,
        interval: super::human::duration(config.sample_interval_s as i64),
        retention_days: config.retention_days,
        refresh_ms: (config.sample_interval_s * 1000).clamp(5_000, 60_000),
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "job_utilization.html")]
struct Fragment {
    utilization: UtilizationBlock,
}

async fn fragment(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<Fragment, WebError> {
    Ok(Fragment {
        utilization: block(&state, &user, id.into_inner()).await?,
    })
}
