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
use chrono::NaiveDateTime;
use serde::Serialize;
use std::collections::BTreeMap;

/// One sample: the attempt's GPUs' mean utilisation over a sample interval (percent) and
/// the most memory they used together in it (MB).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// The end of the interval (UTC).
    pub at: NaiveDateTime,
    pub utilization_pct: f64,
    pub memory_used_mb: i64,
}

/// The samples of one attempt, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptSeries {
    pub attempt: i32,
    /// The server it ran on.
    pub node: Option<String>,
    pub samples: Vec<Point>,
}

/// Over every sample of the job; all `null` without samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub mean_pct: Option<f64>,
    pub peak_pct: Option<f64>,
    pub peak_memory_mb: Option<i64>,
}

impl Summary {
    /// In words, for everyone (and screen readers): "mean 73 %, peak 100 %, memory up
    /// to 58.6 GB", or "no samples yet".
    pub fn words(&self) -> String {
        match (self.mean_pct, self.peak_pct, self.peak_memory_mb) {
            (Some(mean), Some(peak), Some(mem)) => format!(
                "mean {mean:.0} %, peak {peak:.0} %, memory up to {}",
                memory(mem)
            ),
            _ => "no samples yet".to_string(),
        }
    }
}

/// MB as people read them: "512 MB", "58.6 GB".
pub fn memory(mb: i64) -> String {
    if mb < 1024 {
        format!("{mb} MB")
    } else {
        format!("{:.1} GB", mb as f64 / 1024.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Utilization {
    pub job: i64,
    /// At most one sample per attempt this often (seconds).
    pub sample_interval_s: u64,
    /// Samples older than this are deleted.
    pub retention_days: u64,
    pub summary: Summary,
    /// Attempts with samples, oldest first.
    pub attempts: Vec<AttemptSeries>,
}

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
