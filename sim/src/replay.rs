//! Several policies over one workload: what `commons-sim replay` runs.
//!
//! The result is a [`RunSummary`] (the JSON output; a pure function of the inputs and
//! the seed, so the same seed gives byte-identical JSON) plus the raw outputs that the
//! report plots.

use crate::campus::Campus;
use crate::checkpoint::CheckpointModel;
use crate::engine::{simulate, SimError, SimOptions, SimOutput, Tuning};
use crate::metrics::{self, PolicyMetrics, Target};
use crate::policy::PolicyKind;
use crate::trace::Workload;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
    /// Policies simulated at once, each on a thread of its own (the results do not
    /// depend on it).
    pub threads: usize,
    /// See [`SimOptions::tuning`].
    pub tuning: Tuning,
    /// See [`SimOptions::checkpoints`].
    pub checkpoints: Option<CheckpointModel>,
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
            threads: 1,
            tuning: Tuning::default(),
            checkpoints: None,
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
    /// The checkpoint model with failures, when it is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_model: Option<CheckpointModel>,
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
    progress: &mut (dyn FnMut(PolicyKind, i64) + Send),
) -> Result<Replay, SimError> {
    let mut campus = campus.clone();
    let span = work.span.1 - work.span.0;
    campus.add_random_departures(settings.random_departures, span, settings.seed);
    let progress = Mutex::new(progress);
    let run = |p: PolicyKind| {
        let opts = SimOptions {
            policy: p,
            window_per_lab: settings.window_per_lab,
            tick_s: settings.tick_s,
            limit_seed: settings.limit_seed,
            tuning: settings.tuning,
            checkpoints: settings.checkpoints,
        };
        simulate(&campus, work, &opts, &mut |t| {
            if let Ok(mut f) = progress.lock() {
                f(p, t);
            }
        })
    };
    let results = run_all(&settings.policies, settings.threads, run);
    let mut outputs = Vec::new();
    let mut policies = BTreeMap::new();
    for out in results {
        let out = out?;
        policies.insert(
            out.policy.name().to_string(),
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
        checkpoint_model: settings.checkpoints,
        policies,
        targets,
    };
    Ok(Replay {
        summary,
        outputs,
        campus,
    })
}

/// `run` over every policy, on up to `threads` threads taking the next policy in
/// turn; the results are in the order of `policies` whatever the threads.
fn run_all<F>(policies: &[PolicyKind], threads: usize, run: F) -> Vec<Result<SimOutput, SimError>>
where
    F: Fn(PolicyKind) -> Result<SimOutput, SimError> + Sync,
{
    let threads = threads.clamp(1, policies.len().max(1));
    if threads == 1 {
        return policies.iter().map(|&p| run(p)).collect();
    }
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<SimOutput, SimError>>>> =
        Mutex::new(policies.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&p) = policies.get(i) else { break };
                let out = run(p);
                if let Ok(mut d) = done.lock() {
                    d[i] = Some(out);
                }
            });
        }
    });
    done.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}
