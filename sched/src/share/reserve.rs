//! A reserve for wide jobs, sized from how many of them are expected still to come.
//!
//! On the openb trace `commons` spreads shares and one-GPU tasks over the 8-GPU
//! servers (their many CPUs make them look least fragmented), so by 75-80 % of
//! capacity no server can take an 8-GPU job any more and the wide jobs that arrive
//! after are turned away, while `best-fit`, packing tight, keeps untouched servers
//! until 95 %. The reserve counts, for every multi-GPU shape seen so far, how many
//! more such jobs to expect (its share of the GPU demand seen times the free GPU
//! capacity left) and how many the cluster could still host now. A shape is *short*
//! when it could host at most `margin` times the jobs expected; a placement that
//! lowers how many of a short shape its node could host costs the reserve those
//! jobs' GPUs, and the placement that costs it least is taken (fragment and best-fit
//! decide among equals); the reserve ranks placements, it never refuses one.
//!
//! A shape only counts once it has been seen, so on its own the reserve cannot keep
//! the few servers that alone can host a wide job nobody has asked for yet (on the
//! `gpushare` lists, shares spent all 39 G3 servers, the only ones with 120 CPUs for
//! an 8-GPU job, by 36 % of capacity). With a prior (`prior` in [`short_shapes`]) the
//! widest untouched server asked for whole ([`super::frag::widest_shape`]) joins the
//! shapes as if it had come `prior` times per GPU request seen.
//!
//! That count scales with the cluster: at the fourth round's 0.0005 it keeps about 14
//! G3 servers of openb's 1,213 nodes, and none on a campus of a few dozen 8-GPU servers,
//! where one wide job nobody asked for yet matters as much. With a `floor` the prior's
//! shape is also short while at most that many servers could host it: at 1, the last
//! untouched server of the widest kind goes to a share or a one-GPU job only when
//! nothing else can take it. It is off by default: on campus-sized clusters drawn from
//! openb's node list it turned away fewer wide tasks but left more GPUs unallocated.

use super::{GpuAsk, ShapeMix, ShareNode, ShareRequest, FULL_MILLI};

/// How many requests of shape `class` `node` could host at once now: whole GPUs by
/// the node's empty GPUs (of an acceptable model), CPU and memory; 0 for any other
/// shape (the reserve is for multi-GPU shapes).
pub(crate) fn instances(node: &ShareNode, class: &ShareRequest) -> u64 {
    let GpuAsk::Whole { count } = class.gpu else {
        return 0;
    };
    let empty = node
        .gpus
        .iter()
        .filter(|g| g.is_empty() && (class.models.is_empty() || class.models.contains(&g.model)))
        .count() as u64;
    let by = |free: u64, each: u64| free.checked_div(each).unwrap_or(u64::MAX);
    (empty / u64::from(count.max(1)))
        .min(by(node.free_cpu_milli, class.cpu_milli))
        .min(by(node.free_memory_mib, class.memory_mib))
}

/// The multi-GPU shapes that are short on `nodes` under `margin` (0: none, the
/// reserve is off): those the cluster could host at most `margin` times as many of
/// as are expected still to come. Expected: the shape's count over the GPU demand of
/// every request seen ([`ShapeMix::seen`]), times the free GPU share left (in GPUs).
/// With a [`Prior`], the widest untouched server asked for whole
/// ([`widest_shape`](super::frag::widest_shape)) counts too, as a shape seen
/// `per_request` times the GPU requests seen (unless it was seen itself), and is short
/// at least while no more than `floor` servers could host it.
pub(crate) fn short_shapes(
    nodes: &[ShareNode],
    mix: &ShapeMix,
    margin: f64,
    prior: Option<Prior<'_>>,
) -> Vec<ShareRequest> {
    if margin <= 0.0 {
        return Vec::new();
    }
    let (seen_gpus, seen_count) = mix.seen().fold((0.0, 0.0), |(g, n), (r, c)| {
        (
            g + r.gpu.demand_milli() as f64 * f64::from(c),
            n + f64::from(c),
        )
    });
    let seen_gpus = seen_gpus / f64::from(FULL_MILLI);
    if seen_gpus <= 0.0 {
        return Vec::new();
    }
    let free_gpus: f64 =
        nodes.iter().map(|n| n.free_gpu_milli() as f64).sum::<f64>() / f64::from(FULL_MILLI);
    // Each shape with how often it counts as seen and the fewest hosts it keeps.
    let mut shapes: Vec<(ShareRequest, f64, f64)> = mix
        .seen()
        .map(|(r, c)| (r.clone(), f64::from(c), 0.0))
        .collect();
    if let Some(p) = prior.filter(|p| p.per_request > 0.0 || p.floor > 0.0) {
        match shapes.iter_mut().find(|(r, _, _)| r == p.shape) {
            Some(seen) => seen.2 = p.floor,
            None => shapes.push((p.shape.clone(), p.per_request * seen_count, p.floor)),
        }
    }
    shapes
        .into_iter()
        .filter(|(r, _, _)| matches!(r.gpu, GpuAsk::Whole { count } if count > 1))
        .filter(|(r, c, floor)| {
            let expected = c / seen_gpus * free_gpus;
            let hosted: u64 = nodes.iter().map(|n| instances(n, r)).sum();
            (hosted as f64) <= (margin * expected).max(*floor)
        })
        .map(|(r, _, _)| r)
        .collect()
}

/// The reserve's prior: the widest untouched server's shape, how often per GPU request
/// seen it counts as seen, and how many servers that could host it are kept at least.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prior<'a> {
    pub shape: &'a ShareRequest,
    pub per_request: f64,
    pub floor: f64,
}

/// What booking `req` (which changed `before` into `after`) costs the reserve: the
/// GPUs of the short shapes other than `req`'s own that the node can no longer host
/// (a one-GPU task that breaks an untouched 8-GPU server costs 8, and 2 more for
/// each 2-GPU job it could have taken too, if that shape is short as well).
pub(crate) fn reserve_cost(
    short: &[ShareRequest],
    req: &ShareRequest,
    before: &ShareNode,
    after: &ShareNode,
) -> u64 {
    short
        .iter()
        .filter(|s| *s != req)
        .map(|s| {
            instances(before, s).saturating_sub(instances(after, s)) * u64::from(s.gpu.gpu_count())
        })
        .sum()
}
