//! One case of the robustness suite: a trace window and a campus, both drawn from the
//! case's seed.
//!
//! 1. **Window.** A quarter of the cases replay a half of the shipped trace (its first
//!    four weeks without the first two, which hold 22 jobs, or the rest), the others one
//!    of its six busy weeks (weeks 2-7 from Monday 4 Sep 2017). A spec may cut a shorter
//!    window out of it at a random offset (the tests' tiny suite).
//! 2. **Size and load.** The number of labs (5 to 30 in the full suite), a campus
//!    size (log-uniform from 6 GPUs per lab to the spec's largest) and a load (0.45 to
//!    1.0: quiet to contested) are drawn. The window's jobs are thinned, each kept by a
//!    hash of (seed, trace id), so that their GPU-hours are that load of that campus
//!    over the window, or to the spec's most jobs; the campus is then sized to the
//!    thinned jobs at the drawn load (one node per lab at least, which may make it
//!    quieter: the case reports the load it has).
//! 3. **Labs.** Up to a fifth of the labs are borrow-only (no nodes). The others
//!    get GPUs in proportion to heavy-tailed weights (Pareto, shape 1.1), in nodes of
//!    a GPU model drawn per lab from a campus palette of one to three models (8-GPU
//!    A100/H100/V100 servers, 4-GPU L40S/RTX 3090 servers), at least one node each.
//! 4. **Owner load by lab.** The trace's tenants (Philly virtual clusters) are split
//!    into parts until there is one per lab (the busiest tenant first, a job's part by
//!    a hash of its trace id), and the parts go to labs at random, every lab getting at
//!    least one: how busy a lab is has nothing to do with how many GPUs it owns, as on
//!    a real campus.
//! 5. **Grace and departures.** A grace period of 60, 120 or 300 s; in a third of the
//!    cases random node departures (20-60 % of the node count, each away 1-24 h).
//!
//! Invariant: a case is a pure function of (trace, spec, seed).

use super::{SuiteError, SuiteSpec};
use crate::campus::{Campus, CampusFile, LabFile, Lend};
use crate::checkpoint::{mix, unit};
use crate::trace::{TraceJob, Workload};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const DAY_S: i64 = 86_400;
const WEEK_S: i64 = 7 * DAY_S;

/// GPU models of the palettes: name and GPUs per server.
const MODELS: [(&str, u32); 6] = [
    ("A100-80GB", 8),
    ("A100-40GB", 8),
    ("H100-80GB", 8),
    ("V100-32GB", 8),
    ("L40S-48GB", 4),
    ("RTX3090-24GB", 4),
];

/// The windows of the shipped trace a case may replay: (name, from, until) in the
/// trace's seconds.
fn windows() -> Vec<(&'static str, i64, i64)> {
    let mut w: Vec<(&'static str, i64, i64)> = [
        "week 2 (from 18 Sep)",
        "week 3 (from 25 Sep)",
        "week 4 (from 2 Oct)",
        "week 5 (from 9 Oct)",
        "week 6 (from 16 Oct)",
        "week 7 (from 23 Oct)",
    ]
    .into_iter()
    .zip(2..)
    .map(|(name, k)| (name, k * WEEK_S, (k + 1) * WEEK_S))
    .collect();
    w.push(("first half (18 Sep - 1 Oct)", 2 * WEEK_S, 4 * WEEK_S));
    w.push(("second half (2 Oct - 31 Oct)", 4 * WEEK_S, i64::MAX));
    w
}

/// What a case is, as the suite's JSON and tables show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseInfo {
    pub seed: u64,
    /// "tuning" (even seeds) or "test" (odd seeds).
    pub set: String,
    pub window: String,
    /// Replayed jobs submitted in `[from_s, until_s)` (trace seconds).
    pub from_s: i64,
    pub until_s: i64,
    /// Share of the window's jobs kept.
    pub thinning: f64,
    pub jobs: usize,
    pub labs: usize,
    pub borrow_only_labs: usize,
    pub nodes: usize,
    pub gpus: u64,
    /// GPU models of the campus.
    pub models: Vec<String>,
    /// The jobs' GPU-hours over the campus' GPU-hours in the window.
    pub load: f64,
    pub grace_s: i64,
    pub random_departures: u32,
}

/// A generated case, ready to replay.
pub struct Generated {
    pub info: CaseInfo,
    /// The campus file it was built from (for `--dump`).
    pub file: CampusFile,
    /// The thinned jobs, with their tenants renamed to the parts (for `--dump`).
    pub trace: Vec<TraceJob>,
    pub campus: Campus,
    pub work: Workload,
}

impl Generated {
    /// Write `case<seed>.toml` and `case<seed>.csv` into `dir`, so that
    /// `commons-sim replay --campus case<seed>.toml --trace case<seed>.csv
    /// --random-departures <random_departures> --seed <seed>` replays the case.
    pub fn dump(&self, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let seed = self.info.seed;
        let toml = toml::to_string(&self.file).map_err(std::io::Error::other)?;
        let head = format!(
            "# Suite case {seed} ({}): replay with --random-departures {} --seed {seed}\n",
            self.info.window, self.info.random_departures
        );
        std::fs::write(dir.join(format!("case{seed}.toml")), head + &toml)?;
        let mut csv =
            String::from("job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,vc,src_row\n");
        for j in &self.trace {
            csv += &format!(
                "{},{},-,{},{},{},{}\n",
                j.job_id,
                j.submit_time_s,
                j.duration_s,
                j.num_gpus,
                j.vc,
                j.line.saturating_sub(2)
            );
        }
        std::fs::write(dir.join(format!("case{seed}.csv")), csv)
    }
}

/// Generate case `seed` of the suite `spec` from the trace.
pub fn generate(trace: &[TraceJob], spec: &SuiteSpec, seed: u64) -> Result<Generated, SuiteError> {
    let mut rng = StdRng::seed_from_u64(mix(seed ^ 0x5157_e5ee_d000_0000));
    let end = trace.iter().map(|j| j.submit_time_s).max().unwrap_or(0);
    let (window, from, until) = pick_window(&mut rng, spec, end);
    let inside: Vec<&TraceJob> = trace
        .iter()
        .filter(|j| j.submit_time_s >= from && j.submit_time_s < until)
        .collect();
    if inside.is_empty() {
        return Err(SuiteError::EmptyWindow(window));
    }
    let labs = rng.random_range(spec.labs.0..=spec.labs.1.max(spec.labs.0));
    let load_drawn = rng.random_range(0.45..1.0);
    let (lo, hi) = (labs as f64 * 6.0, spec.gpus.max(1) as f64);
    let gpus_drawn = (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln()).max(0.0)).exp();
    let first = inside.iter().map(|j| j.submit_time_s).min().unwrap_or(from);
    let hours = ((until.min(end + 1) - first) as f64 / 3600.0).max(1.0);
    let demand_all: f64 = inside.iter().map(gpu_hours).sum();
    let thinning = (load_drawn * gpus_drawn * hours / demand_all.max(1.0))
        .min(spec.max_jobs as f64 / inside.len() as f64)
        .min(1.0);
    let mut kept: Vec<TraceJob> = inside
        .iter()
        .filter(|j| unit(seed, j.job_id, 3) < thinning)
        .map(|&j| j.clone())
        .collect();
    if kept.is_empty() {
        kept.push(inside[0].clone());
    }
    let demand: f64 = kept.iter().map(|j| gpu_hours(&j)).sum();
    let target_gpus = demand / (load_drawn * hours);
    let (file, tenants) = campus_file(&mut rng, &kept, labs, target_gpus, seed);
    for j in &mut kept {
        j.vc = tenants(j);
    }
    let campus = file.build().map_err(SuiteError::Campus)?;
    let work = Workload::new(&kept, &campus).map_err(SuiteError::Trace)?;
    let trace = kept;
    let random_departures = if rng.random_range(0..3) == 0 {
        (campus.nodes.len() as f64 * rng.random_range(0.2..0.6)).round() as u32
    } else {
        0
    };
    let labs = campus.labs.len();
    let owning: std::collections::BTreeSet<usize> = campus.nodes.iter().map(|n| n.lab).collect();
    let mut models: Vec<String> = campus.nodes.iter().map(|n| n.model.clone()).collect();
    models.sort();
    models.dedup();
    let info = CaseInfo {
        seed,
        set: super::Set::of(seed).name().to_string(),
        window: window.to_string(),
        from_s: from,
        until_s: until,
        thinning: round(thinning, 4),
        jobs: work.jobs.len(),
        labs,
        borrow_only_labs: labs - owning.len(),
        nodes: campus.nodes.len(),
        gpus: campus.total_gpus(),
        models,
        load: round(demand / (campus.total_gpus() as f64 * hours), 3),
        grace_s: campus.grace_s,
        random_departures,
    };
    Ok(Generated {
        info,
        file,
        trace,
        campus,
        work,
    })
}

/// GPU-hours of a job on at most 8 GPUs (wider jobs are capped to a node).
fn gpu_hours(j: &&TraceJob) -> f64 {
    j.duration_s as f64 * f64::from(j.num_gpus.min(8)) / 3600.0
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Step 1: the window, and a shorter cut of it if the spec asks for one.
fn pick_window(rng: &mut StdRng, spec: &SuiteSpec, end: i64) -> (String, i64, i64) {
    let all = windows();
    let (name, from, until) = if rng.random_range(0..4) == 0 {
        all[6 + rng.random_range(0..2)]
    } else {
        all[rng.random_range(0..6)]
    };
    match spec.window_days {
        Some(days) => {
            let len = (days * DAY_S as f64) as i64;
            let room = (until.min(end + 1) - from - len).max(0);
            let start = from + rng.random_range(0..=room / 3600) * 3600;
            (format!("{days} d of {name}"), start, start + len)
        }
        None => (name.to_string(), from, until),
    }
}

/// Steps 3-5: the campus file, and the function that names a job's tenant part.
fn campus_file(
    rng: &mut StdRng,
    jobs: &[TraceJob],
    labs: usize,
    target_gpus: f64,
    seed: u64,
) -> (CampusFile, impl Fn(&TraceJob) -> String) {
    let borrow_only = rng.random_range(0..=labs / 5);
    let mut palette: Vec<usize> = (0..MODELS.len()).collect();
    palette.shuffle(rng);
    palette.truncate(rng.random_range(1..=3));
    let grace_seconds = [60, 120, 300][rng.random_range(0..3)];
    let mut order: Vec<usize> = (0..labs).collect();
    order.shuffle(rng);
    let weights: Vec<f64> = (0..labs)
        .map(|_| (1.0 - rng.random::<f64>()).powf(-1.0 / 1.1))
        .collect();
    let owners = &order[borrow_only..];
    let total: f64 = owners.iter().map(|&i| weights[i]).sum();
    let mut lab: Vec<LabFile> = (0..labs)
        .map(|i| {
            let (model, per_node) = MODELS[palette[rng.random_range(0..palette.len())]];
            let nodes = if owners.contains(&i) {
                let gpus = target_gpus * weights[i] / total;
                ((gpus / f64::from(per_node)).round() as u32).max(1)
            } else {
                0
            };
            LabFile {
                name: format!("lab{i:02}"),
                tenants: Vec::new(),
                nodes,
                gpus_per_node: per_node,
                gpu_model: model.to_string(),
                gpu_memory_gb: 0,
                lend: Lend::Always,
                max_lent_gpus_per_node: None,
                max_borrowed_gpus: None,
            }
        })
        .collect();
    let parts = split_tenants(jobs, labs);
    let mut units: Vec<(String, u64)> = parts
        .iter()
        .flat_map(|(vc, &k)| (0..k).map(move |p| (vc.clone(), p)))
        .collect();
    units.shuffle(rng);
    for (u, (vc, p)) in units.iter().enumerate() {
        let to = if u < labs {
            u
        } else {
            rng.random_range(0..labs)
        };
        lab[to].tenants.push(format!("{vc}.{p}"));
    }
    let file = CampusFile {
        grace_seconds,
        checkpoint_interval_minutes: 30,
        checkpoint_on_stop: false,
        lab,
        departure: Vec::new(),
    };
    let name = move |j: &TraceJob| {
        let k = parts.get(&j.vc).copied().unwrap_or(1).max(1);
        format!("{}.{}", j.vc, mix(seed ^ 0xa11 ^ j.job_id as u64) % k)
    };
    (file, name)
}

/// Step 4: how many parts each tenant is split into so that there are at least
/// `labs` parts, splitting the tenant with the most jobs per part first.
fn split_tenants(jobs: &[TraceJob], labs: usize) -> BTreeMap<String, u64> {
    let mut count: BTreeMap<String, u64> = BTreeMap::new();
    for j in jobs {
        *count.entry(j.vc.clone()).or_default() += 1;
    }
    let mut parts: BTreeMap<String, u64> = count.keys().map(|vc| (vc.clone(), 1)).collect();
    while (parts.values().sum::<u64>() as usize) < labs {
        let busiest = count
            .iter()
            .max_by(|a, b| {
                let (pa, pb) = (parts[a.0], parts[b.0]);
                (*a.1 as f64 / pa as f64)
                    .total_cmp(&(*b.1 as f64 / pb as f64))
                    .then(b.0.cmp(a.0))
            })
            .map(|(vc, _)| vc.clone());
        let Some(vc) = busiest else { break };
        *parts.entry(vc).or_default() += 1;
    }
    parts
}
