//! Fragmentation of a node measured against the recent mix of requests, after Weng et
//! al., "Beware of Fragmentation" (USENIX ATC '23): the part of a node's free GPU share
//! that a typical request cannot use.
//!
//! For one request shape, a node's fragment is
//! - all of its free GPU share when the shape cannot run there at all (CPU, memory or
//!   GPU model), or, for whole GPUs, when too few GPUs are empty;
//! - otherwise the free share of the GPUs the shape cannot use: for a share, the GPUs
//!   with less free than it asks; for whole GPUs, every GPU that is partly taken.
//!
//! The node's expected fragment is the mean over the mix, weighted by how often each
//! shape arrived recently. CPU-only requests do not take part (they use no GPU).

use std::collections::{BTreeMap, VecDeque};

use super::{GpuAsk, ShareNode, ShareRequest};

/// The recent mix of GPU requests: the last `window` arrivals, counted by shape.
#[derive(Debug, Clone, Default)]
pub struct ShapeMix {
    window: usize,
    recent: VecDeque<ShareRequest>,
    counts: BTreeMap<ShareRequest, u32>,
    /// Every GPU request seen, by shape (never forgotten: rare wide shapes stay known).
    seen: BTreeMap<ShareRequest, u32>,
    seen_total: u64,
}

impl ShapeMix {
    /// An empty mix that remembers the last `window` GPU requests.
    pub fn new(window: usize) -> ShapeMix {
        ShapeMix {
            window: window.max(1),
            ..ShapeMix::default()
        }
    }

    /// Counts one arrival (CPU-only requests are ignored), forgetting the oldest one
    /// beyond the window.
    pub fn observe(&mut self, req: &ShareRequest) {
        if matches!(req.gpu, GpuAsk::None) {
            return;
        }
        self.recent.push_back(req.clone());
        *self.counts.entry(req.clone()).or_default() += 1;
        let seen = self.seen.entry(req.clone()).or_default();
        *seen = seen.saturating_add(1);
        self.seen_total += 1;
        while self.recent.len() > self.window {
            if let Some(old) = self.recent.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
    }

    /// The `top` shapes by a blend of their share of the window (`1 - long`) and of
    /// every request seen (`long`), weights that sum to 1 over the shapes returned; ties in shape order. `long` 0 ranks as
    /// [`ShapeMix::classes`] does.
    pub fn blended(&self, top: usize, long: f64) -> Vec<(ShareRequest, f64)> {
        let long = long.clamp(0.0, 1.0);
        if long == 0.0 {
            return self.classes(top);
        }
        let recent_total = f64::from(self.counts.values().sum::<u32>().max(1));
        let seen_total = self.seen_total.max(1) as f64;
        let mut all: Vec<(&ShareRequest, f64)> = self
            .seen
            .iter()
            .map(|(r, &c)| {
                let recent = self.counts.get(r).map_or(0.0, |&n| f64::from(n)) / recent_total;
                let w = (1.0 - long) * recent + long * f64::from(c) / seen_total;
                (r, w)
            })
            .filter(|(_, w)| *w > 0.0)
            .collect();
        all.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.0.cmp(b.0))
        });
        all.truncate(top.max(1));
        let total: f64 = all.iter().map(|(_, w)| w).sum();
        all.into_iter()
            .map(|(r, w)| (r.clone(), w / total.max(f64::MIN_POSITIVE)))
            .collect()
    }

    /// Every GPU request seen, by shape, with how often it came (in shape order).
    pub fn seen(&self) -> impl Iterator<Item = (&ShareRequest, u32)> {
        self.seen.iter().map(|(r, &c)| (r, c))
    }

    /// GPU requests in the window.
    pub fn len(&self) -> usize {
        self.recent.len()
    }

    /// No GPU request seen yet.
    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// The `top` most frequent shapes with their weights (shares of the window that
    /// sum to 1 over the shapes returned); ties in shape order.
    pub fn classes(&self, top: usize) -> Vec<(ShareRequest, f64)> {
        let mut all: Vec<(&ShareRequest, u32)> = self.counts.iter().map(|(r, &c)| (r, c)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        all.truncate(top.max(1));
        let total: u32 = all.iter().map(|(_, c)| c).sum();
        all.into_iter()
            .map(|(r, c)| (r.clone(), f64::from(c) / f64::from(total.max(1))))
            .collect()
    }
}

/// The free GPU share of `node` (milli-GPU) that requests of shape `class` cannot use.
pub(crate) fn fragment_for(node: &ShareNode, class: &ShareRequest) -> u64 {
    let free = node.free_gpu_milli();
    if free == 0 {
        return 0;
    }
    if !node.hosts(class) {
        return free;
    }
    let usable = |g: &super::ShareGpu| class.model_ok(g);
    match class.gpu {
        GpuAsk::None => 0,
        GpuAsk::Share { .. } => node
            .gpus
            .iter()
            .filter(|g| !usable(g) || g.fits(&class.gpu).is_none())
            .map(|g| u64::from(g.free_milli))
            .sum(),
        GpuAsk::Whole { count } => {
            let empty = node
                .gpus
                .iter()
                .filter(|g| usable(g) && g.is_empty())
                .count();
            if empty < count as usize {
                free
            } else {
                node.gpus
                    .iter()
                    .filter(|g| !(usable(g) && g.is_empty()))
                    .map(|g| u64::from(g.free_milli))
                    .sum()
            }
        }
    }
}

/// The free GPU share of `node` that requests of shape `class` cannot use once the
/// node's CPU and memory are counted as well: if the CPU or memory left runs out
/// after `n` such requests while its GPUs could take `i > n`, only `n / i` of the
/// share they could use counts as usable. (Plain FGD counts CPU only when not even
/// one request fits; on servers with few CPUs per GPU this sees GPUs stranded earlier.)
pub(crate) fn fragment_with_cpu(node: &ShareNode, class: &ShareRequest) -> f64 {
    let free = node.free_gpu_milli() as f64;
    let plain = fragment_for(node, class) as f64;
    let usable = free - plain;
    if usable <= 0.0 {
        return plain;
    }
    let instances: u64 = match class.gpu {
        GpuAsk::None => return plain,
        GpuAsk::Share { .. } => node
            .gpus
            .iter()
            .filter(|g| class.model_ok(g))
            .filter_map(|g| {
                g.fits(&class.gpu)
                    .map(|(m, _)| u64::from(g.free_milli / m.max(1)))
            })
            .sum(),
        GpuAsk::Whole { count } => {
            let empty = node
                .gpus
                .iter()
                .filter(|g| class.model_ok(g) && g.is_empty())
                .count();
            empty as u64 / u64::from(count.max(1))
        }
    };
    let by = |free: u64, each: u64| free.checked_div(each).unwrap_or(u64::MAX);
    let hosted =
        by(node.free_cpu_milli, class.cpu_milli).min(by(node.free_memory_mib, class.memory_mib));
    if instances == 0 || hosted >= instances {
        return plain;
    }
    plain + usable * (1.0 - hosted as f64 / instances as f64)
}

/// Whether `node` could take one request of shape `class` now (CPU, memory, model and
/// GPUs).
pub(crate) fn can_host(node: &ShareNode, class: &ShareRequest) -> bool {
    if !node.hosts(class) {
        return false;
    }
    match class.gpu {
        GpuAsk::None => true,
        GpuAsk::Share { .. } => node
            .gpus
            .iter()
            .any(|g| class.model_ok(g) && g.fits(&class.gpu).is_some()),
        GpuAsk::Whole { count } => {
            node.gpus
                .iter()
                .filter(|g| class.model_ok(g) && g.is_empty())
                .count()
                >= count as usize
        }
    }
}

/// The widest whole-node shape `nodes` can still host: among the untouched nodes
/// (every GPU empty) with the most GPUs, the one with the most free CPU, then memory,
/// asked for whole. A prior for a shape the recent mix may not have seen yet (a rare
/// 8-GPU job that only the biggest servers can host).
pub(crate) fn widest_shape(nodes: &[ShareNode]) -> Option<ShareRequest> {
    nodes
        .iter()
        .filter(|n| !n.gpus.is_empty() && n.gpus.iter().all(|g| g.is_empty()))
        .map(|n| (n.gpus.len(), n.free_cpu_milli, n.free_memory_mib))
        .max()
        .map(|(count, cpu_milli, memory_mib)| ShareRequest {
            cpu_milli,
            memory_mib,
            gpu: GpuAsk::Whole {
                count: u32::try_from(count).unwrap_or(u32::MAX),
            },
            models: Vec::new(),
        })
}

/// How a node's fragment is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FragmentRule {
    /// Multiplies the weight of whole-GPU shapes (1: as often as they arrive).
    pub whole_weight: f64,
    /// Count GPUs that the node's CPU and memory strand ([`fragment_with_cpu`]).
    pub cpu_aware: bool,
}

/// The expected fragment of `node` (milli-GPU) against the weighted `classes`
/// ([`ShapeMix::classes`]) under `rule` (plain FGD: boost 1, not CPU-aware).
pub fn node_fragment(node: &ShareNode, classes: &[(ShareRequest, f64)], rule: FragmentRule) -> f64 {
    classes
        .iter()
        .map(|(c, w)| {
            let w = if matches!(c.gpu, GpuAsk::Whole { .. }) {
                w * rule.whole_weight
            } else {
                *w
            };
            let f = if rule.cpu_aware {
                fragment_with_cpu(node, c)
            } else {
                fragment_for(node, c) as f64
            };
            w * f
        })
        .sum()
}
