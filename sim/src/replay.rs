//! Several policies over one workload: what `commons-sim replay` runs.
//!
//! The result is a [`RunSummary`] (the JSON output; a pure function of the inputs and
//! the seed, so the same seed gives byte-identical JSON) plus the raw outputs that the
//! report plots.

use crate::campus::Campus;
use crate::engine::{simulate, SimError, SimOptions, SimOutput};
use crate::metrics::{self, PolicyMetrics, Target};
use crate::policy::PolicyKind;
use crate::trace::Workload;
use serde::Serialize;
use std::collections::BTreeMap;

/// What to run.
#[derive(Debug, Clone)]
pub struct ReplaySettings {
    pub policies: Vec<PolicyKind>,
    /// See [`SimOptions::window_per_lab`].
    pub window_per_lab: usize,
    /// Seed of the random departures.
    pub seed: u64,
    /// Random node departures added to those of the campus file.
    pub random_departures: u32,
    /// See [`SimOptions::tick_s`].
    pub tick_s: i64,
    /// See [`SimOptions::limit_seed`].
    pub limit_seed: Option<u64>,
}

impl Default for ReplaySettings {
    fn default() -> Self {
        ReplaySettings {
            policies: PolicyKind::ALL.to_vec(),
            window_per_lab: SimOptions::new(PolicyKind::Commons).window_per_lab,
            seed: 1,
            random_departures: 0,
            tick_s: 30,
            limit_seed: None,
        }
    }
}

/// The campus as simulated, in the JSON output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CampusSummary {
    pub labs: usize,
    pub nodes: usize,
    pub gpus: u64,
    pub grace_seconds: i64,
    /// `null`: no checkpoints.
    pub checkpoint_interval_minutes: Option<i64>,
    pub checkpoint_on_stop: bool,
    pub departures: usize,
}

/// The JSON output of a replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub jobs: usize,
    /// Jobs wider than any node, capped to the widest node (duration unchanged).
    pub capped_jobs: u64,
    pub span_s: i64,
    pub seed: u64,
    pub random_departures: u32,
    pub window_per_lab: usize,
    pub tick_s: i64,
    /// `null`: time limits are the true run times; else the seed of the overestimates.
    pub limit_seed: Option<u64>,
    pub campus: CampusSummary,
    pub policies: BTreeMap<String, PolicyMetrics>,
    pub targets: Vec<Target>,
}

/// A finished replay.
#[derive(Debug, Clone)]
pub struct Replay {
    pub summary: RunSummary,
    /// One per policy, in the order asked for.
    pub outputs: Vec<SimOutput>,
    /// The campus as simulated (with the random departures).
    pub campus: Campus,
}

/// Simulate every policy of `settings` over `work`. `progress(policy, t)` reports the
/// virtual time reached.
pub fn replay(
    campus: &Campus,
    work: &Workload,
    settings: &ReplaySettings,
    progress: &mut dyn FnMut(PolicyKind, i64),
) -> Result<Replay, SimError> {
    let mut campus = campus.clone();
    let span = work.span.1 - work.span.0;
    campus.add_random_departures(settings.random_departures, span, settings.seed);
    let mut outputs = Vec::new();
    let mut policies = BTreeMap::new();
    for &p in &settings.policies {
        let opts = SimOptions {
            policy: p,
            window_per_lab: settings.window_per_lab,
            tick_s: settings.tick_s,
            limit_seed: settings.limit_seed,
        };
        let out = simulate(&campus, work, &opts, &mut |t| progress(p, t))?;
        policies.insert(
            p.name().to_string(),
            metrics::summarize(&campus, work, &out),
        );
        outputs.push(out);
    }
    metrics::fill_labs_worse_off(&mut policies, campus.grace_s);
    let targets = metrics::targets(&policies, campus.grace_s);
    let summary = RunSummary {
        jobs: work.jobs.len(),
        capped_jobs: work.capped,
        span_s: span,
        seed: settings.seed,
        random_departures: settings.random_departures,
        window_per_lab: settings.window_per_lab,
        tick_s: settings.tick_s,
        limit_seed: settings.limit_seed,
        campus: CampusSummary {
            labs: campus.labs.len(),
            nodes: campus.nodes.len(),
            gpus: campus.total_gpus(),
            grace_seconds: campus.grace_s,
            checkpoint_interval_minutes: campus.checkpoint_interval_s.map(|s| s / 60),
            checkpoint_on_stop: campus.checkpoint_on_stop,
            departures: campus.departures.len(),
        },
        policies,
        targets,
    };
    Ok(Replay {
        summary,
        outputs,
        campus,
    })
}
