//! The Alibaba GPU-sharing trace (`cluster-trace-gpu-v2023`, the "openb" files of Weng et
//! al., "Beware of Fragmentation", USENIX ATC '23) replayed as that paper does.
//!
//! The task list is a shape distribution, not a load trace: tasks arrive one after the
//! other (in file order, the list repeated if needed, or in seeded re-orderings of it)
//! and never end, until the GPU demand that has arrived passes the cluster's GPU
//! capacity. A task that fits nowhere when it arrives is not allocated (it does not
//! wait). The figure of merit is the cluster's allocation at the moment the arrived
//! demand first reaches the capacity: `gpu_allocation_rate_at_full` and
//! `unallocated_gpus_at_full` (capacity minus allocation, in GPUs).
//!
//! Placement is `commons_sched::share::place`, the function the scheduler uses; this
//! module only reads the files and keeps the books. CPU-only tasks are placed for CPU
//! and memory (they can strand a node's GPUs).
//!
//! Files: the pods CSV has `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...`
//! (extra columns ignored; `gpu_spec` is empty or GPU models joined by `|`); the nodes
//! CSV has `sn,cpu_milli,memory_mib,gpu,model`. GPU memory is not in the files and no
//! openb task asks for GPU memory, so a share takes memory in proportion to its compute
//! share; the memory per model is a table here ([`gpu_memory_gib`]).

use commons_sched::share::{
    place, GpuAsk, ShapeMix, ShareGpu, ShareNode, SharePolicy, ShareRequest, ShareTuning,
    FULL_MILLI,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What can be wrong with an openb file.
#[derive(Debug, thiserror::Error)]
pub enum OpenbError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: csv::Error },
    #[error("{path} line {line}: {message}")]
    Row {
        path: String,
        line: u64,
        message: String,
    },
    #[error("{0} has no rows")]
    Empty(String),
}

/// One task of the pods file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenbTask {
    /// The task's name in the file.
    pub name: String,
    /// What it asks for.
    pub req: ShareRequest,
}

#[derive(Deserialize)]
struct PodRow {
    name: String,
    cpu_milli: u64,
    memory_mib: u64,
    num_gpu: u32,
    gpu_milli: u32,
    #[serde(default)]
    gpu_spec: String,
}

#[derive(Deserialize)]
struct NodeRow {
    sn: String,
    cpu_milli: u64,
    memory_mib: u64,
    gpu: u32,
    model: String,
}

/// GPU memory of an openb GPU model in GiB (public figures for the NVIDIA models; G2,
/// G3 and unknown models count as 16: no openb task asks for GPU memory, so this only
/// scales the memory a share takes with its compute share).
pub fn gpu_memory_gib(model: &str) -> u64 {
    match model {
        "V100M32" => 32,
        "A10" => 24,
        _ => 16,
    }
}

fn rows<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<(u64, T)>, OpenbError> {
    let shown = path.display().to_string();
    let read = |source| OpenbError::Read {
        path: shown.clone(),
        source,
    };
    let mut rd = csv::Reader::from_path(path).map_err(read)?;
    let mut out = Vec::new();
    for (i, row) in rd.deserialize::<T>().enumerate() {
        let line = i as u64 + 2;
        let row = row.map_err(|e| OpenbError::Row {
            path: shown.clone(),
            line,
            message: e.to_string(),
        })?;
        out.push((line, row));
    }
    if out.is_empty() {
        return Err(OpenbError::Empty(shown));
    }
    Ok(out)
}

/// Reads a pods file: `num_gpu` 0 is CPU-only, 1 with `gpu_milli` below 1000 a share,
/// otherwise `num_gpu` whole GPUs.
pub fn read_pods(path: &Path) -> Result<Vec<OpenbTask>, OpenbError> {
    rows::<PodRow>(path)?
        .into_iter()
        .map(|(line, r)| {
            let gpu = match (r.num_gpu, r.gpu_milli) {
                (0, _) => GpuAsk::None,
                (1, m) if (1..FULL_MILLI).contains(&m) => GpuAsk::Share {
                    milli: m,
                    memory_mb: 0,
                },
                (n, m) if m == FULL_MILLI || n > 1 => GpuAsk::Whole { count: n },
                (_, m) => {
                    return Err(OpenbError::Row {
                        path: path.display().to_string(),
                        line,
                        message: format!("gpu_milli {m} with one GPU is not in 1..=1000"),
                    })
                }
            };
            let models = r
                .gpu_spec
                .split('|')
                .map(str::trim)
                .filter(|m| !m.is_empty() && *m != "nan")
                .map(String::from)
                .collect();
            Ok(OpenbTask {
                name: r.name,
                req: ShareRequest {
                    cpu_milli: r.cpu_milli,
                    memory_mib: r.memory_mib,
                    gpu,
                    models,
                },
            })
        })
        .collect()
}

/// Reads a nodes file into empty share nodes.
pub fn read_nodes(path: &Path) -> Result<Vec<ShareNode>, OpenbError> {
    Ok(rows::<NodeRow>(path)?
        .into_iter()
        .map(|(_, r)| ShareNode {
            name: r.sn,
            free_cpu_milli: r.cpu_milli,
            free_memory_mib: r.memory_mib,
            gpus: (0..r.gpu)
                .map(|_| ShareGpu::new(r.model.clone(), gpu_memory_gib(&r.model) * 1024))
                .collect(),
        })
        .collect())
}

/// A campus-sized cluster: `n` servers drawn without replacement from `nodes` by
/// `seed`, in the list's order; `None` when `n` is 0 or more than the list has.
pub fn sample_nodes(nodes: &[ShareNode], n: usize, seed: u64) -> Option<Vec<ShareNode>> {
    if n == 0 || n > nodes.len() {
        return None;
    }
    let mut picked: Vec<usize> = (0..nodes.len()).collect();
    picked.shuffle(&mut StdRng::seed_from_u64(seed));
    picked.truncate(n);
    picked.sort_unstable();
    Some(picked.into_iter().map(|i| nodes[i].clone()).collect())
}

/// The tasks some server of `nodes` could host with nothing on it (a campus's people
/// ask for what its servers have): a task asking for a model, or for more CPUs or GPUs
/// than any server of the sample has, is left out of the replay.
pub fn hostable(nodes: &[ShareNode], tasks: Vec<OpenbTask>) -> Vec<OpenbTask> {
    let mix = ShapeMix::new(1);
    let tuning = ShareTuning::default();
    tasks
        .into_iter()
        .filter(|t| place(nodes, &t.req, SharePolicy::BestFit, &mix, &tuning).is_some())
        .collect()
}

/// The order in which tasks arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// File order, the list repeated as often as needed.
    File,
    /// A re-ordering drawn from this seed, a fresh one for each pass over the list.
    Seeded(u64),
}

/// Indices into `tasks` in arrival order, up to and including the task with which the
/// arrived GPU demand first reaches `capacity_milli` (or a pass that adds no demand).
pub fn arrivals(tasks: &[OpenbTask], order: Order, capacity_milli: u64) -> Vec<usize> {
    let mut rng = match order {
        Order::File => None,
        Order::Seeded(s) => Some(StdRng::seed_from_u64(s)),
    };
    let mut out = Vec::new();
    let mut demand = 0u64;
    loop {
        let mut pass: Vec<usize> = (0..tasks.len()).collect();
        if let Some(rng) = rng.as_mut() {
            pass.shuffle(rng);
        }
        let start = demand;
        for i in pass {
            out.push(i);
            demand += tasks[i].req.gpu.demand_milli();
            if demand >= capacity_milli {
                return out;
            }
        }
        if demand == start {
            return out;
        }
    }
}

/// One point of the curve: unallocated GPUs against the GPU demand arrived.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    /// GPU demand arrived so far, in GPUs.
    pub arrived_gpus: f64,
    /// GPUs allocated (shares counted as their fraction).
    pub allocated_gpus: f64,
    /// Capacity minus allocation, in GPUs.
    pub unallocated_gpus: f64,
}

/// The figures of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpenbOutcome {
    /// Allocated share of the cluster's GPU capacity when the arrived demand first
    /// reaches the capacity.
    pub gpu_allocation_rate_at_full: f64,
    /// Capacity minus allocation then, in GPUs.
    pub unallocated_gpus_at_full: f64,
    /// Allocated share of the cluster's CPU then.
    pub cpu_allocation_rate_at_full: f64,
    /// Tasks that arrived (all of them were tried).
    pub tasks_arrived: usize,
    /// Tasks that fitted nowhere when they arrived.
    pub tasks_failed: usize,
    /// GPU demand of those tasks, in GPUs.
    pub failed_gpus: f64,
    /// Failed tasks by kind: "cpu_only", "share", "one_gpu", "multi_gpu".
    pub failed_by_kind: std::collections::BTreeMap<&'static str, usize>,
    /// GPU demand of the failed tasks by kind, in GPUs (at full, these sum to the
    /// unallocated GPUs: which kinds the rule turns away is where it loses).
    pub failed_gpus_by_kind: std::collections::BTreeMap<&'static str, f64>,
    /// Every failed multi-GPU task, in arrival order: where wide jobs are lost.
    pub failed_multi_gpu: Vec<FailedTask>,
    /// Per GPU model, at the end: free GPUs (shares counted as their fraction), GPUs
    /// with nothing on them, and nodes with every GPU empty (what was left and where).
    pub free_at_full_by_model: std::collections::BTreeMap<String, ModelLeft>,
    /// Unallocated GPUs each time the arrived demand passes another 2 % of capacity,
    /// and at the end.
    pub curve: Vec<CurvePoint>,
}

/// A task that fitted nowhere, as the outcome lists the multi-GPU ones.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedTask {
    /// Arrived GPU demand when it came, in % of capacity.
    pub arrived_pct: f64,
    /// GPUs it asked for.
    pub gpus: u32,
    /// CPUs it asked for.
    pub cpus: f64,
    /// Memory it asked for, in GiB.
    pub memory_gib: f64,
}

/// What was left of one GPU model's servers at the end of a replay.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelLeft {
    /// Free GPU share, in GPUs.
    pub free_gpus: f64,
    /// GPUs with nothing on them.
    pub empty_gpus: usize,
    /// Nodes with every GPU empty.
    pub untouched_nodes: usize,
    /// Free CPUs.
    pub free_cpus: f64,
    /// Free GPU share on nodes with fewer than 8 CPUs free (in GPUs): stranded by CPU
    /// for almost every GPU task of the trace.
    pub free_gpus_cpu_short: f64,
}

fn left_by_model(nodes: &[ShareNode]) -> std::collections::BTreeMap<String, ModelLeft> {
    let mut out = std::collections::BTreeMap::<String, ModelLeft>::new();
    for n in nodes {
        let Some(model) = n.gpus.first().map(|g| g.model.clone()) else {
            continue;
        };
        let e = out.entry(model).or_default();
        e.free_gpus += n.free_gpu_milli() as f64 / 1000.0;
        e.empty_gpus += n.empty_gpus();
        e.untouched_nodes += usize::from(n.empty_gpus() == n.gpus.len());
        e.free_cpus += n.free_cpu_milli as f64 / 1000.0;
        if n.free_cpu_milli < 8000 {
            e.free_gpus_cpu_short += n.free_gpu_milli() as f64 / 1000.0;
        }
    }
    out
}

fn kind(ask: &GpuAsk) -> &'static str {
    match ask {
        GpuAsk::None => "cpu_only",
        GpuAsk::Share { .. } => "share",
        GpuAsk::Whole { count: 1 } => "one_gpu",
        GpuAsk::Whole { .. } => "multi_gpu",
    }
}

/// Replays `arrivals` (indices into `tasks`) on a fresh copy of `nodes` under `policy`.
pub fn replay_openb(
    nodes: &[ShareNode],
    tasks: &[OpenbTask],
    arrivals: &[usize],
    policy: SharePolicy,
    tuning: &ShareTuning,
) -> OpenbOutcome {
    let mut nodes = nodes.to_vec();
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    let cpu_total: u64 = nodes.iter().map(|n| n.free_cpu_milli).sum();
    let mut mix = ShapeMix::new(tuning.window_for(policy));
    let (mut arrived, mut allocated, mut cpu_used) = (0u64, 0u64, 0u64);
    let (mut failed, mut failed_milli) = (0usize, 0u64);
    let mut failed_by_kind = std::collections::BTreeMap::new();
    let mut failed_gpus_by_kind = std::collections::BTreeMap::new();
    let mut failed_multi_gpu = Vec::new();
    let mut curve = Vec::new();
    let mut next_point = 0u64;
    let gpus = |m: u64| m as f64 / 1000.0;
    let point = |arrived: u64, allocated: u64| CurvePoint {
        arrived_gpus: gpus(arrived),
        allocated_gpus: gpus(allocated),
        unallocated_gpus: gpus(capacity - allocated),
    };
    for &i in arrivals {
        let req = &tasks[i].req;
        mix.observe(req);
        arrived += req.gpu.demand_milli();
        match place(&nodes, req, policy, &mix, tuning) {
            Some(p) if nodes[p.node].take(req, &p.gpus).is_ok() => {
                allocated += p.gpus.iter().map(|g| u64::from(g.1)).sum::<u64>();
                cpu_used += req.cpu_milli;
            }
            _ => {
                failed += 1;
                failed_milli += req.gpu.demand_milli();
                *failed_by_kind.entry(kind(&req.gpu)).or_default() += 1;
                *failed_gpus_by_kind.entry(kind(&req.gpu)).or_default() +=
                    gpus(req.gpu.demand_milli());
                if let GpuAsk::Whole { count } = req.gpu {
                    if count > 1 {
                        failed_multi_gpu.push(FailedTask {
                            arrived_pct: 100.0 * arrived as f64 / capacity.max(1) as f64,
                            gpus: count,
                            cpus: req.cpu_milli as f64 / 1000.0,
                            memory_gib: req.memory_mib as f64 / 1024.0,
                        });
                    }
                }
            }
        }
        if arrived >= next_point {
            curve.push(point(arrived, allocated));
            while next_point <= arrived {
                next_point += capacity.div_ceil(50).max(1);
            }
        }
    }
    if curve.last().is_none_or(|p| p.arrived_gpus < gpus(arrived)) {
        curve.push(point(arrived, allocated));
    }
    OpenbOutcome {
        gpu_allocation_rate_at_full: allocated as f64 / capacity.max(1) as f64,
        unallocated_gpus_at_full: gpus(capacity - allocated),
        cpu_allocation_rate_at_full: cpu_used as f64 / cpu_total.max(1) as f64,
        tasks_arrived: arrivals.len(),
        tasks_failed: failed,
        failed_gpus: gpus(failed_milli),
        failed_by_kind,
        failed_gpus_by_kind,
        failed_multi_gpu,
        free_at_full_by_model: left_by_model(&nodes),
        curve,
    }
}

/// A replay of the openb files under several policies, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct OpenbSummary {
    /// Always "openb".
    pub trace_format: &'static str,
    /// The pods file.
    pub trace: String,
    /// The nodes file.
    pub nodes_file: String,
    /// Nodes of the cluster.
    pub nodes: usize,
    /// The draw of a campus-sized cluster from the nodes file (`--sample-nodes`), if any.
    pub sample: Option<NodeSample>,
    /// GPUs of the cluster (its capacity).
    pub gpus: u64,
    /// Tasks in the pods file.
    pub tasks_in_trace: usize,
    /// How tasks arrived.
    pub order: Order,
    /// The fragmentation rules' knobs.
    pub tuning: ShareTuning,
    /// Figures per policy name.
    pub policies: std::collections::BTreeMap<String, OpenbOutcome>,
    /// `commons`' unallocated GPUs at full over `best-fit`'s, when both ran (the target
    /// is at most 0.75).
    pub commons_to_best_fit_unallocated: Option<f64>,
}

/// A campus-sized cluster drawn from the nodes file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSample {
    /// Servers drawn.
    pub servers: usize,
    /// The draw's seed.
    pub seed: u64,
    /// Tasks of the list that no drawn server could host, left out of the replay.
    pub tasks_left_out: usize,
}

/// Replays the tasks under every policy of `policies` (each on a fresh cluster).
pub fn replay_openb_all(
    nodes: &[ShareNode],
    tasks: &[OpenbTask],
    order: Order,
    policies: &[SharePolicy],
    tuning: &ShareTuning,
) -> std::collections::BTreeMap<String, OpenbOutcome> {
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    let order = arrivals(tasks, order, capacity);
    policies
        .iter()
        .map(|&p| {
            (
                p.name().to_string(),
                replay_openb(nodes, tasks, &order, p, tuning),
            )
        })
        .collect()
}
