//! A job's GPU utilisation over time: one read model for the job page's chart and
//! `GET /api/v1/jobs/{id}/utilization`, so the two always agree.
//!
//! Who may read it is who may see the job (its owner, their lab's admins, operators);
//! anyone else gets "not found", as for the job itself.

use super::{jobs::visible, Actor, Ctx};
use crate::config::UtilizationConfig;
pub use crate::db::samples::Sample;
pub use crate::db::usage::WeekUsage;
use crate::db::{self, DbConn};
use crate::domain::AttemptStatus;
use crate::error::AppError;
pub use commons_api::utilization::{memory, AttemptSeries, Point, Summary, Utilization};
use std::collections::BTreeMap;

/// Groups `samples` (ordered by attempt, then time) by attempt and sums them up.
pub fn build(
    job: i64,
    samples: Vec<Sample>,
    nodes: &BTreeMap<i32, String>,
    config: &UtilizationConfig,
) -> Utilization {
    let mut summary = Summary {
        samples: samples.len(),
        ..Summary::default()
    };
    if !samples.is_empty() {
        let n = samples.len() as f64;
        summary.mean_pct = Some(samples.iter().map(|s| s.utilization_pct).sum::<f64>() / n);
        summary.peak_pct = samples.iter().map(|s| s.utilization_pct).reduce(f64::max);
        summary.peak_memory_mb = samples.iter().map(|s| s.memory_used_mb).max();
    }
    let mut attempts: Vec<AttemptSeries> = Vec::new();
    for s in samples {
        let point = Point {
            at: s.at,
            utilization_pct: s.utilization_pct,
            memory_used_mb: s.memory_used_mb,
        };
        match attempts.last_mut() {
            Some(a) if a.attempt == s.attempt => a.samples.push(point),
            _ => attempts.push(AttemptSeries {
                attempt: s.attempt,
                node: nodes.get(&s.attempt).cloned(),
                samples: vec![point],
            }),
        }
    }
    Utilization {
        job,
        sample_interval_s: config.sample_interval_s,
        retention_days: config.retention_days,
        summary,
        attempts,
    }
}

/// Job `id`'s utilisation, read in one go (the job, its samples, its attempts' servers).
pub fn read(
    c: &mut DbConn,
    actor: &Actor,
    id: i64,
    config: &UtilizationConfig,
) -> Result<Utilization, AppError> {
    visible(c, actor, id)?;
    let samples = db::samples::for_job(c, id)?;
    let attempts = db::attempts::on_job(c, id, &ALL_ATTEMPTS)?;
    let names = db::nodes::names(c, &attempts.iter().map(|a| a.node_id).collect::<Vec<_>>())?;
    let nodes: BTreeMap<i32, String> = attempts
        .iter()
        .filter_map(|a| Some((a.attempt, names.get(&a.node_id)?.clone())))
        .collect();
    Ok(build(id, samples, &nodes, config))
}

const ALL_ATTEMPTS: [AttemptStatus; 7] = [
    AttemptStatus::Starting,
    AttemptStatus::Running,
    AttemptStatus::Stopping,
    AttemptStatus::Exited,
    AttemptStatus::Stopped,
    AttemptStatus::Failed,
    AttemptStatus::Lost,
];

/// The same, on the database pool.
pub async fn of_job(
    ctx: &Ctx,
    actor: &Actor,
    id: i64,
    config: &UtilizationConfig,
) -> Result<Utilization, AppError> {
    let (actor, config) = (actor.clone(), config.clone());
    ctx.db.run(move |c| read(c, &actor, id, &config)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_grouped_and_summed_up_in_words() {
        let t = |m: i64| {
            chrono::NaiveDate::from_ymd_opt(2026, 12, 8)
                .unwrap()
                .and_hms_opt(10, 0, 0)
                .unwrap()
                + chrono::Duration::minutes(m)
        };
        let s = |attempt, m, util, mem| Sample {
            job_id: 7,
            attempt,
            at: t(m),
            utilization_pct: util,
            memory_used_mb: mem,
        };
        let nodes = BTreeMap::from([(2, "physics-server".to_string())]);
        let u = build(
            7,
            vec![
                s(1, 0, 46.0, 512),
                s(1, 1, 100.0, 60_000),
                s(2, 9, 73.0, 1000),
            ],
            &nodes,
            &UtilizationConfig::default(),
        );
        assert_eq!(u.attempts.len(), 2);
        assert_eq!(u.attempts[0].samples.len(), 2);
        assert_eq!(u.attempts[1].node.as_deref(), Some("physics-server"));
        assert_eq!(
            u.summary.words(),
            "mean 73 %, peak 100 %, memory up to 58.6 GB"
        );
        let none = build(7, vec![], &nodes, &UtilizationConfig::default());
        assert_eq!(none.summary.words(), "no samples yet");
        assert!(none.attempts.is_empty());
        assert_eq!(memory(512), "512 MB");
    }
}
