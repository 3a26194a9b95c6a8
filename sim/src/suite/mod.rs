//! The robustness suite: policies over many generated campuses and windows of the
//! shipped trace instead of one, with the distribution of each ratio against the
//! baselines (`commons-sim suite`).
//!
//! 1. Case `seed` (0, 1, 2, ...) is generated from the trace and its seed alone
//!    ([`generate`]): window, thinning, labs, GPUs, models, owner load, grace,
//!    departures.
//! 2. The cases are split once and for all by seed parity: even seeds are the
//!    **tuning set**, odd seeds the **test set**. Defaults are chosen by looking at the
//!    tuning set only; the test set is reported, never tuned on.
//! 3. On every case the evaluated policies and the baselines ([`BASELINES`]: `isolated`
//!    for labs worse off, `share-fairshare`, `commons-old`) are replayed with the same
//!    settings (tick, window, checkpoint model); cases run on threads of their own.
//! 4. Per case and policy the ratios of [`stats::RATIOS`] are computed, and per set
//!    their median, 10th and 90th percentile and worst case.
//!
//! A case's figures are a pure function of (trace, spec, seed, settings): the report is
//! the same whatever the threads. Baseline figures of an earlier report may be reused
//! for the cases and settings they were measured with (`--reuse`), since no tuning
//! knob changes a baseline.

pub mod generate;
pub mod stats;

use crate::checkpoint::CheckpointModel;
use crate::engine::{SimError, Tuning};
use crate::metrics::PolicyMetrics;
use crate::policy::PolicyKind;
use crate::replay::{replay, ReplaySettings};
use crate::trace::TraceJob;
use generate::CaseInfo;
use serde::{Deserialize, Serialize};
use stats::{Dist, SuiteTarget};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The baselines every case replays besides the evaluated policies.
pub const BASELINES: [PolicyKind; 3] = [
    PolicyKind::Isolated,
    PolicyKind::ShareFairshare,
    PolicyKind::CommonsOld,
];

/// What can go wrong in the suite.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("suite window {0} holds no job of the trace")]
    EmptyWindow(String),
    #[error("a generated campus is not valid: {0}")]
    Campus(crate::campus::CampusError),
    #[error("a generated workload is not valid: {0}")]
    Trace(crate::trace::TraceError),
    #[error("case {seed}: {source}")]
    Sim { seed: u64, source: SimError },
    #[error("cannot write case {seed}: {source}")]
    Dump { seed: u64, source: std::io::Error },
}

/// Which set a case belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Set {
    Tuning,
    Test,
}

impl Set {
    /// Even seeds tune, odd seeds test.
    pub fn of(seed: u64) -> Set {
        if seed.is_multiple_of(2) {
            Set::Tuning
        } else {
            Set::Test
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Set::Tuning => "tuning",
            Set::Test => "test",
        }
    }
}

/// The size of a suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteSpec {
    pub name: String,
    /// Cases, seeds `0..cases`.
    pub cases: u64,
    /// Labs per campus, drawn uniformly from this range.
    pub labs: (usize, usize),
    /// The largest campus drawn, in GPUs.
    pub gpus: u32,
    /// The most jobs a case replays (the window is thinned to it).
    pub max_jobs: u32,
    /// Replay only this many days of each window (from a random hour of it).
    pub window_days: Option<f64>,
}

impl SuiteSpec {
    /// The suite of the README's tables: 40 cases, 5-30 labs, up to 800 GPUs and
    /// 20,000 jobs.
    pub fn full() -> SuiteSpec {
        SuiteSpec {
            name: "full".into(),
            cases: 40,
            labs: (5, 30),
            gpus: 800,
            max_jobs: 20_000,
            window_days: None,
        }
    }

    /// A quick look (`--small`): 8 cases, 5-30 labs, up to 320 GPUs and 2,000 jobs.
    pub fn small() -> SuiteSpec {
        SuiteSpec {
            name: "small".into(),
            cases: 8,
            labs: (5, 30),
            gpus: 320,
            max_jobs: 2_000,
            window_days: None,
        }
    }

    /// The tests' suite: 4 cases, 5-8 labs, up to 64 GPUs and 150 jobs submitted
    /// within two days.
    pub fn tiny() -> SuiteSpec {
        SuiteSpec {
            name: "tiny".into(),
            cases: 4,
            labs: (5, 8),
            gpus: 64,
            max_jobs: 150,
            window_days: Some(2.0),
        }
    }
}

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct SuiteSettings {
    pub spec: SuiteSpec,
    /// `None`: both sets.
    pub set: Option<Set>,
    /// The evaluated policies (the baselines are added).
    pub policies: Vec<PolicyKind>,
    pub tuning: Tuning,
    pub checkpoints: Option<CheckpointModel>,
    pub tick_s: i64,
    pub window_per_lab: usize,
    /// Cases replayed at once, each on a thread.
    pub threads: usize,
    /// Write each case's campus and trace into this directory (see
    /// [`generate::Generated::dump`]).
    pub dump: Option<std::path::PathBuf>,
}

/// The figures of one policy on one case that the ratios need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub jct_mean_s: Option<f64>,
    pub jct_p95_s: Option<f64>,
    pub owner_wait_mean_s: Option<f64>,
    pub preemptions: u64,
    pub lost_gpu_hours: f64,
    pub utilization: f64,
    /// Each lab's mean JCT over its jobs that fit its own nodes (labs worse off than
    /// alone are counted from these, see [`crate::metrics`]).
    pub lab_jct_mean_s: BTreeMap<String, Option<f64>>,
}

impl Figures {
    fn of(m: &PolicyMetrics) -> Figures {
        Figures {
            jct_mean_s: m.jct_mean_s,
            jct_p95_s: m.jct_p95_s,
            owner_wait_mean_s: m.owner_wait_mean_s,
            preemptions: m.preemptions,
            lost_gpu_hours: m.lost_gpu_hours,
            utilization: m.utilization,
            lab_jct_mean_s: m
                .per_lab
                .iter()
                .map(|(lab, l)| (lab.clone(), l.jct_mean_fitting_s))
                .collect(),
        }
    }
}

/// One case: what it is and every policy's figures on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub info: CaseInfo,
    pub policies: BTreeMap<String, Figures>,
    /// Wall seconds it took (not part of the comparison).
    pub wall_s: f64,
}

/// The settings a report's figures depend on, besides the cases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunKey {
    pub tick_s: i64,
    pub window_per_lab: usize,
    pub checkpoint_model: Option<CheckpointModel>,
}

/// The JSON of `commons-sim suite`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteReport {
    pub spec: SuiteSpec,
    /// "tuning", "test" or "all".
    pub set: String,
    pub policies: Vec<String>,
    pub tuning: Tuning,
    pub key: RunKey,
    pub cases: Vec<CaseResult>,
    /// Set ("tuning", "test") -> policy -> ratio -> distribution.
    pub distributions: BTreeMap<String, BTreeMap<String, BTreeMap<String, Dist>>>,
    pub targets: Vec<SuiteTarget>,
}

/// Run the suite. `reuse`: an earlier report whose baseline figures are taken for
/// the cases and settings they match. `done` is called after each case.
pub fn run_suite(
    trace: &[TraceJob],
    settings: &SuiteSettings,
    reuse: Option<&SuiteReport>,
    done: &(dyn Fn(&CaseResult) + Sync),
) -> Result<SuiteReport, SuiteError> {
    let key = RunKey {
        tick_s: settings.tick_s,
        window_per_lab: settings.window_per_lab,
        checkpoint_model: settings.checkpoints,
    };
    let reuse = reuse.filter(|r| r.key == key);
    let seeds: Vec<u64> = (0..settings.spec.cases)
        .filter(|&s| settings.set.is_none_or(|set| Set::of(s) == set))
        .collect();
    let results = parallel(&seeds, settings.threads, |seed| {
        let case = run_case(trace, settings, seed, reuse)?;
        done(&case);
        Ok(case)
    });
    let cases = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let policies: Vec<String> = settings.policies.iter().map(|p| p.to_string()).collect();
    let mut distributions = BTreeMap::new();
    for set in [Set::Tuning, Set::Test] {
        let of_set: Vec<&CaseResult> = cases.iter().filter(|c| c.info.set == set.name()).collect();
        if !of_set.is_empty() {
            let d = stats::distributions(&of_set, &policies);
            distributions.insert(set.name().to_string(), d);
        }
    }
    let targets = stats::targets(&distributions);
    Ok(SuiteReport {
        spec: settings.spec.clone(),
        set: settings.set.map_or("all", Set::name).to_string(),
        policies,
        tuning: settings.tuning,
        key,
        cases,
        distributions,
        targets,
    })
}

/// Generate and replay one case.
fn run_case(
    trace: &[TraceJob],
    settings: &SuiteSettings,
    seed: u64,
    reuse: Option<&SuiteReport>,
) -> Result<CaseResult, SuiteError> {
    let started = std::time::Instant::now();
    let g = generate::generate(trace, &settings.spec, seed)?;
    if let Some(dir) = &settings.dump {
        g.dump(dir)
            .map_err(|source| SuiteError::Dump { seed, source })?;
    }
    let earlier = reuse.and_then(|r| r.cases.iter().find(|c| c.info == g.info));
    let mut policies: BTreeMap<String, Figures> = BTreeMap::new();
    let mut to_run = Vec::new();
    for p in BASELINES.iter().chain(&settings.policies) {
        let kept = earlier
            .filter(|_| BASELINES.contains(p))
            .and_then(|c| c.policies.get(p.name()));
        match kept {
            Some(f) => {
                policies.insert(p.name().to_string(), f.clone());
            }
            None if !to_run.contains(p) => to_run.push(*p),
            None => {}
        }
    }
    let replay_settings = ReplaySettings {
        policies: to_run,
        window_per_lab: settings.window_per_lab,
        seed,
        random_departures: g.info.random_departures,
        tick_s: settings.tick_s,
        limit_seed: None,
        threads: 1,
        tuning: settings.tuning,
        checkpoints: settings.checkpoints,
    };
    if !replay_settings.policies.is_empty() {
        let r = replay(&g.campus, &g.work, &replay_settings, &mut |_, _| {})
            .map_err(|source| SuiteError::Sim { seed, source })?;
        for (name, m) in &r.summary.policies {
            policies.insert(name.clone(), Figures::of(m));
        }
    }
    Ok(CaseResult {
        info: g.info,
        policies,
        wall_s: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    })
}

/// `f` over every seed on up to `threads` threads, the results in the seeds' order.
fn parallel<T, F>(seeds: &[u64], threads: usize, f: F) -> Vec<T>
where
    T: Send,
    F: Fn(u64) -> T + Sync,
{
    let threads = threads.clamp(1, seeds.len().max(1));
    if threads == 1 {
        return seeds.iter().map(|&s| f(s)).collect();
    }
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<T>>> = Mutex::new(seeds.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { break };
                let out = f(seed);
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
