//! Where a request goes: the node and GPUs under one of three rules.
//!
//! 1. Every node that can host the request (CPU, memory, GPU model) offers its
//!    candidate GPU choices: each distinct GPU the share fits on, or its first empty
//!    GPUs for whole GPUs, or none for a CPU-only request.
//! 2. `best-fit` takes the candidate that leaves the least free GPU share on the node,
//!    then on the chosen GPU, then the least free CPU.
//! 3. `fgd` takes the candidate whose node's expected fragment (against the recent mix,
//!    [`super::ShapeMix`]) grows least, best-fit breaking ties.
//! 4. `commons` is `fgd` against a shorter, recent mix ([`ShareTuning::mix_window`])
//!    blended with every request seen ([`ShareTuning::long_weight`], so rare wide
//!    shapes are not forgotten), that also counts the GPUs a node's CPU and memory
//!    would strand ([`ShareTuning::cpu_aware`]): a GPU whose server has no CPU left is
//!    lost to whole-GPU jobs as surely as a GPU with a share on it. Whole-GPU shapes
//!    weigh [`ShareTuning::whole_weight`] of their frequency. A prior shape, the
//!    widest untouched node asked for whole ([`ShareTuning::wide_prior`]), keeps the
//!    servers that alone can host the widest jobs for last, before any such job came.
//!    A reserve ([`ShareTuning::wide_reserve`], [`super::reserve`]) ranks placements
//!    first by the multi-GPU jobs still expected that they would leave no room for;
//!    its prior ([`ShareTuning::prior_reserve`]) counts the widest untouched server's
//!    shape among them before any such job came.
//!
//! `commons`' first constants were chosen on the default openb trace (file order)
//! only: window 500, 32 shapes, whole weight 0.5, CPU-aware. The second round (long
//! weight 0.3, prior 0.02) on the default list in file order and seeds 1, 3, 4 and 8,
//! and `multigpu50`. The third round (whole weight 0.1, reserve 4) on the default list
//! in file order and seeds 1 to 29. The fourth round (the reserve's prior 0.0005, so
//! shares no longer spend the only servers that can host a wide job not seen yet) on
//! the default list (file order and six seeds) and six variant lists; the book's
//! GPU-sharing report has the figures, held-out samplings included.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use super::frag::{can_host, node_fragment, widest_shape, FragmentRule};
use super::reserve::{reserve_cost, short_shapes, Prior};
use super::{GpuAsk, ShapeMix, ShareNode, ShareRequest};

/// A placement rule for shares and whole GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SharePolicy {
    /// The baseline: the node and GPU that leave the least free share.
    BestFit,
    /// Fragmentation gradient descent: where the expected fragment grows least.
    Fgd,
    /// The rule the scheduler uses: `fgd` that keeps whole GPUs free for whole-GPU jobs.
    Commons,
}

impl SharePolicy {
    /// Every rule, baseline first.
    pub const ALL: [SharePolicy; 3] =
        [SharePolicy::BestFit, SharePolicy::Fgd, SharePolicy::Commons];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SharePolicy::BestFit => "best-fit",
            SharePolicy::Fgd => "fgd",
            SharePolicy::Commons => "commons",
        }
    }

    /// The rule of that name.
    pub fn from_name(name: &str) -> Option<SharePolicy> {
        SharePolicy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The knobs of the fragmentation-aware rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShareTuning {
    /// GPU requests remembered in the mix (the recent arrivals).
    pub mix_window: usize,
    /// The most frequent shapes of the mix that fragmentation is measured against.
    pub mix_classes: usize,
    /// Weight of the whole-GPU shapes in `commons`' fragment, times their frequency
    /// (`fgd` uses 1). Low (0.1 since the third round) so shares are packed where they
    /// leave whole GPUs least fragmented; with the reserve keeping room for the wide
    /// jobs, one-GPU tasks need less weight of their own. It scales the prior too.
    pub whole_weight: f64,
    /// `commons` counts the GPUs a node's CPU and memory strand as fragment too.
    pub cpu_aware: bool,
    /// GPU requests remembered in `fgd`'s mix (long: close to the paper's use of the
    /// whole workload's distribution).
    pub fgd_mix_window: usize,
    /// `commons` ranks and weighs shapes by this blend of every request seen and the
    /// recent window (0: the window only), so rare wide shapes are not forgotten.
    pub long_weight: f64,
    /// Weight, next to the mix's (which sum to 1), of `commons`' prior shape: the
    /// widest untouched node asked for whole ([`super::frag::widest_shape`]); 0: no
    /// prior.
    pub wide_prior: f64,
    /// `commons` weighs each shape by (nodes / nodes that can host it now) to this
    /// power: a shape few servers can host counts more (0: plain frequency).
    pub scarcity: f64,
    /// `commons` weighs each shape by its GPU demand (in GPUs) to this power, on top of
    /// its frequency: an 8-GPU shape that arrives once asks as much as eight 1-GPU
    /// ones (0: frequency only).
    pub demand_power: f64,
    /// `commons` keeps a reserve for multi-GPU shapes ([`super::reserve`]): a shape
    /// is short when the cluster could host at most this many times as many of it as
    /// are expected still to come, and placements are ranked first by the GPUs of
    /// short shapes (other than their own) they leave the node unable to host (0: off).
    pub wide_reserve: f64,
    /// The reserve's prior: the widest untouched server asked for whole counts in the
    /// reserve as a shape seen this many times per GPU request seen, so the servers
    /// that alone could host a wide job not seen yet are kept (0: off; 0.0005 since
    /// the fourth round).
    pub prior_reserve: f64,
    /// The reserve keeps at least this many servers that could host the widest
    /// untouched server's shape while other placements exist, however small the
    /// cluster ([`super::reserve`]; 0: only `prior_reserve` counts). Off (0): on
    /// campus-sized clusters a floor of 1 left more GPUs unallocated than it saved
    /// for wide jobs (docs/src/reports/gpu-sharing.md, fifth round).
    pub prior_floor: f64,
}

impl Default for ShareTuning {
    fn default() -> ShareTuning {
        ShareTuning {
            mix_window: 500,
            mix_classes: 32,
            whole_weight: 0.1,
            cpu_aware: true,
            fgd_mix_window: 10_000,
            long_weight: 0.3,
            wide_prior: 0.02,
            scarcity: 0.0,
            demand_power: 0.0,
            wide_reserve: 4.0,
            prior_reserve: 0.0005,
            prior_floor: 0.0,
        }
    }
}

impl ShareTuning {
    /// How many recent GPU requests the mix of `policy` remembers.
    pub fn window_for(&self, policy: SharePolicy) -> usize {
        match policy {
            SharePolicy::Fgd => self.fgd_mix_window,
            _ => self.mix_window,
        }
    }
}

/// Where a request goes: a node index and `(gpu, milli, memory MiB)` per GPU taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Index of the node in the slice given to [`place`].
    pub node: usize,
    /// The GPUs taken on it, with the share and memory taken on each.
    pub gpus: Vec<(usize, u32, u64)>,
}

/// The best-fit order of a candidate: free GPU share left on the node, free share left
/// on the GPU taken, free CPU left, then indices.
type FitKey = (u64, u32, u64, usize, usize);

/// Picks the node and GPUs for `req` among `nodes` under `policy`, or `None` when it
/// fits nowhere now. `mix` is the recent mix of GPU requests (it may be empty; the
/// request itself stands in for it then); `best-fit` ignores it. The caller keeps the
/// mix: [`ShareTuning::mix_window`] long for `commons`, [`ShareTuning::fgd_mix_window`]
/// for `fgd` ([`ShareTuning::window_for`]).
pub fn place(
    nodes: &[ShareNode],
    req: &ShareRequest,
    policy: SharePolicy,
    mix: &ShapeMix,
    tuning: &ShareTuning,
) -> Option<Placement> {
    let boost = match policy {
        SharePolicy::BestFit => None,
        SharePolicy::Fgd => Some(FragmentRule {
            whole_weight: 1.0,
            cpu_aware: false,
        }),
        SharePolicy::Commons => Some(FragmentRule {
            whole_weight: tuning.whole_weight,
            cpu_aware: tuning.cpu_aware,
        }),
    };
    // The widest untouched server asked for whole: both of `commons`' priors use it.
    let widest = match policy {
        SharePolicy::Commons
            if tuning.wide_prior > 0.0
                || tuning.prior_reserve > 0.0
                || tuning.prior_floor > 0.0 =>
        {
            widest_shape(nodes)
        }
        _ => None,
    };
    let classes = match boost {
        None => Vec::new(),
        Some(_) if mix.is_empty() => vec![(req.clone(), 1.0)],
        Some(_) if policy == SharePolicy::Commons => commons_classes(
            nodes,
            mix.blended(tuning.mix_classes, tuning.long_weight),
            widest.as_ref(),
            tuning,
        ),
        Some(_) => mix.classes(tuning.mix_classes),
    };
    let short = match policy {
        SharePolicy::Commons => short_shapes(
            nodes,
            mix,
            tuning.wide_reserve,
            widest.as_ref().map(|shape| Prior {
                shape,
                per_request: tuning.prior_reserve,
                floor: tuning.prior_floor,
            }),
        ),
        _ => Vec::new(),
    };
    let mut best: Option<(u64, f64, FitKey, Placement)> = None;
    for (i, node) in nodes.iter().enumerate() {
        if !node.hosts(req) {
            continue;
        }
        let cands = candidates(node, req);
        if cands.is_empty() {
            continue;
        }
        let mut scratch = node.clone();
        let before = boost.map(|b| node_fragment(node, &classes, b));
        for gpus in cands {
            if scratch.take(req, &gpus).is_err() {
                continue;
            }
            let first = gpus.first().map_or(0, |g| g.0);
            let key: FitKey = (
                scratch.free_gpu_milli(),
                scratch.gpus.get(first).map_or(0, |g| g.free_milli),
                scratch.free_cpu_milli,
                i,
                first,
            );
            let delta = match (boost, before) {
                (Some(b), Some(f0)) => node_fragment(&scratch, &classes, b) - f0,
                _ => 0.0,
            };
            let cost = reserve_cost(&short, req, node, &scratch);
            scratch.release(req, &gpus);
            let better = best.as_ref().is_none_or(|(b, d, k, _)| {
                cost.cmp(b)
                    .then_with(|| delta.partial_cmp(d).unwrap_or(Ordering::Equal))
                    .then_with(|| key.cmp(k))
                    == Ordering::Less
            });
            if better {
                best = Some((cost, delta, key, Placement { node: i, gpus }));
            }
        }
    }
    best.map(|(_, _, _, p)| p)
}

/// `commons`' shapes: the blended mix, each shape weighed by its GPU demand
/// ([`ShareTuning::demand_power`]), plus the prior's widest shape
/// ([`ShareTuning::wide_prior`]), each then weighed up by how few of `nodes` can host
/// it now ([`ShareTuning::scarcity`]; shapes none can host are left out then: no
/// placement changes their fragment but by the share it takes, the same everywhere).
fn commons_classes(
    nodes: &[ShareNode],
    mut classes: Vec<(ShareRequest, f64)>,
    widest: Option<&ShareRequest>,
    tuning: &ShareTuning,
) -> Vec<(ShareRequest, f64)> {
    if tuning.demand_power > 0.0 {
        for (c, w) in &mut classes {
            let gpus = c.gpu.demand_milli().max(1) as f64 / f64::from(super::FULL_MILLI);
            *w *= gpus.powf(tuning.demand_power);
        }
    }
    if let Some(shape) = widest.filter(|_| tuning.wide_prior > 0.0) {
        if !classes.iter().any(|(c, _)| c == shape) {
            classes.push((shape.clone(), tuning.wide_prior));
        }
    }
    if tuning.scarcity > 0.0 {
        let all = nodes.len().max(1) as f64;
        for (c, w) in &mut classes {
            let hosts = nodes.iter().filter(|n| can_host(n, c)).count();
            *w = if hosts == 0 {
                0.0
            } else {
                *w * (all / hosts as f64).powf(tuning.scarcity)
            };
        }
        classes.retain(|(_, w)| *w > 0.0);
    }
    classes
}

/// The distinct GPU choices `req` has on `node` now (GPUs in the same state count once).
fn candidates(node: &ShareNode, req: &ShareRequest) -> Vec<Vec<(usize, u32, u64)>> {
    match req.gpu {
        GpuAsk::None => vec![Vec::new()],
        GpuAsk::Whole { count } => {
            let empty: Vec<(usize, u32, u64)> = node
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| g.is_empty() && req.model_ok(g))
                .map(|(i, g)| (i, super::FULL_MILLI, g.memory_mb))
                .take(count as usize)
                .collect();
            if count > 0 && empty.len() == count as usize {
                vec![empty]
            } else {
                Vec::new()
            }
        }
        GpuAsk::Share { .. } => {
            let mut out: Vec<Vec<(usize, u32, u64)>> = Vec::new();
            for (i, g) in node.gpus.iter().enumerate() {
                let Some((milli, memory)) = g.fits(&req.gpu).filter(|_| req.model_ok(g)) else {
                    continue;
                };
                let same = out.iter().any(|c| node.gpus[c[0].0] == *g);
                if !same {
                    out.push(vec![(i, milli, memory)]);
                }
            }
            out
        }
    }
}
