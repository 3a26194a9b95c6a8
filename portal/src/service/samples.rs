//! Jobs' GPU utilisation over time, sampled from the agents' heartbeats.
//!
//! Every heartbeat carries each GPU's utilisation and memory used. Per agent connection a
//! [`Sampler`] folds them, per running attempt, into a window: the mean over the
//! attempt's GPUs of their utilisation, averaged over the heartbeats of the window, and
//! the peak of the memory they use together. A window is written as one sample when the
//! attempt's last sample is at least `sample_interval_s` old (the first one at once, so
//! a new job's chart fills soon).
//!
//! Invariants:
//! - An attempt gets at most one sample per interval, also across reconnects: an attempt
//!   first seen by a connection starts from its last stored sample's time.
//! - A heartbeat writes at most one statement, a multi-row INSERT; a heartbeat of a
//!   server with no running attempt reads and writes nothing, and one whose attempts are
//!   all known and not due reads nothing either. Only an attempt the connection has not
//!   seen yet costs reads (its GPUs and last sample), once.
//! - Only attempts the portal itself runs on this node (running, or stopping within their
//!   grace) are sampled; others the agent reports are ignored.
//! - Samples older than `retention_days` are deleted, hourly ([`expire_loop`]).

use super::Ctx;
use crate::config::UtilizationConfig;
use crate::db::samples::Sample;
use crate::db::{self, DbConn};
use crate::domain::AttemptStatus;
use crate::error::AppError;
use chrono::NaiveDateTime;
use commons_proto::{AttemptReport, AttemptState, GpuStat};
use std::collections::{BTreeMap, BTreeSet};

/// What one agent connection knows of its node's running attempts.
#[derive(Debug)]
pub struct Sampler {
    interval: chrono::Duration,
    tracks: BTreeMap<(i64, i32), Track>,
}

#[derive(Debug)]
enum Track {
    /// Not an attempt the portal runs on this node.
    Foreign,
    Sampling(Window),
}

/// One attempt's heartbeats since its last sample.
#[derive(Debug, Default)]
struct Window {
    /// UUIDs of the attempt's GPUs.
    gpus: Vec<String>,
    last: Option<NaiveDateTime>,
    util_sum: f64,
    beats: u32,
    memory_peak_mb: i64,
}

impl Sampler {
    pub fn new(interval_s: u64) -> Self {
        Sampler {
            interval: chrono::Duration::seconds(interval_s.max(1) as i64),
            tracks: BTreeMap::new(),
        }
    }

    /// Learns the attempts in `keys` (one read each of attempts, GPUs and last samples).
    fn learn(&mut self, c: &mut DbConn, node: i64, keys: &[(i64, i32)]) -> Result<(), AppError> {
        let ours: Vec<_> =
            db::attempts::on_node(c, node, &[AttemptStatus::Running, AttemptStatus::Stopping])?
                .into_iter()
                .filter(|a| keys.contains(&(a.job_id, a.attempt)))
                .collect();
        let gpu_ids: Vec<i64> = ours.iter().flat_map(|a| a.gpu_id_list()).collect();
        let uuids: BTreeMap<i64, String> = if gpu_ids.is_empty() {
            BTreeMap::new()
        } else {
            db::nodes::gpus_by_ids(c, &gpu_ids)?
                .into_iter()
                .map(|g| (g.id, g.uuid))
                .collect()
        };
        let jobs: Vec<i64> = ours.iter().map(|a| a.job_id).collect();
        let last = if jobs.is_empty() {
            BTreeMap::new()
        } else {
            db::samples::last_at(c, &jobs)?
        };
        for key in keys {
            let track = match ours.iter().find(|a| (a.job_id, a.attempt) == *key) {
                Some(a) => Track::Sampling(Window {
                    gpus: a
                        .gpu_id_list()
                        .iter()
                        .filter_map(|g| uuids.get(g).cloned())
                        .collect(),
                    last: last.get(key).copied(),
                    ..Window::default()
                }),
                None => Track::Foreign,
            };
            self.tracks.insert(*key, track);
        }
        Ok(())
    }
}

/// Folds one heartbeat (received at `at`) into the sampler and writes the samples that
/// are due, in one INSERT; returns how many.
pub fn record(
    c: &mut DbConn,
    sampler: &mut Sampler,
    node: i64,
    stats: &[GpuStat],
    reports: &[AttemptReport],
    at: NaiveDateTime,
) -> Result<usize, AppError> {
    let running: BTreeSet<(i64, i32)> = reports
        .iter()
        .filter(|r| r.state == AttemptState::Running)
        .map(|r| (r.job, r.attempt))
        .collect();
    sampler.tracks.retain(|k, _| running.contains(k));
    let new: Vec<(i64, i32)> = running
        .iter()
        .filter(|k| !sampler.tracks.contains_key(k))
        .copied()
        .collect();
    if !new.is_empty() {
        sampler.learn(c, node, &new)?;
    }
    let by_uuid: BTreeMap<&str, &GpuStat> = stats.iter().map(|s| (s.uuid.as_str(), s)).collect();
    let mut due = Vec::new();
    for (&(job, attempt), track) in sampler.tracks.iter_mut() {
        let Track::Sampling(w) = track else { continue };
        let seen: Vec<&GpuStat> = w
            .gpus
            .iter()
            .filter_map(|u| by_uuid.get(u.as_str()).copied())
            .collect();
        if seen.is_empty() {
            continue;
        }
        let util = seen
            .iter()
            .map(|s| f64::from(s.utilization_pct.min(100)))
            .sum::<f64>()
            / seen.len() as f64;
        let memory: u64 = seen.iter().map(|s| s.memory_used_mb).sum();
        w.util_sum += util;
        w.beats += 1;
        w.memory_peak_mb = w
            .memory_peak_mb
            .max(i64::try_from(memory).unwrap_or(i64::MAX));
        if w.last.is_some_and(|l| at - l < sampler.interval) {
            continue;
        }
        due.push(Sample {
            job_id: job,
            attempt,
            at,
            utilization_pct: w.util_sum / f64::from(w.beats),
            memory_used_mb: w.memory_peak_mb,
        });
        *w = Window {
            gpus: std::mem::take(&mut w.gpus),
            last: Some(at),
            ..Window::default()
        };
    }
    Ok(db::samples::insert(c, &due)?)
}

/// Deletes samples older than the retention, now and then every hour, for as long as
/// the portal runs.
pub async fn expire_loop(ctx: Ctx, config: UtilizationConfig) {
    let keep = chrono::Duration::days(config.retention_days as i64);
    loop {
        let before = db::now() - keep;
        match ctx.db.run(move |c| db::samples::expire(c, before)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "expired utilisation samples"),
            Err(e) => tracing::warn!("expiring utilisation samples: {e:#}"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
}

#[cfg(test)]
#[path = "samples_tests.rs"]
mod tests;
