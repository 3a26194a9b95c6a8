//! The `share-backfill` and `share-fairshare` baselines: one campus-wide queue over
//! every node, no owners, EASY backfill with best-fit placement (what a campus running
//! one Slurm cluster would do).
//!
//! EASY backfill (Lifka 1995; Mu'alem & Feitelson 2001): walk the queue in priority
//! order and start every job that fits now, until one (the head) does not. The head
//! gets a reservation: the earliest time some node has enough GPUs for it, counting
//! running jobs as ending at their time limits (the shadow time), and the GPUs that
//! node has to spare then (the extra GPUs). Later jobs start now only if they do not
//! delay the head: on another node, or on the head's node if they end by the shadow
//! time or fit in the extra GPUs (which they then use up). Only the head reserves.
//!
//! The fair-share order ([`fair_order`]) is Slurm's classic fair-share factor
//! `F = 2^(-U/S)` per lab, with `U` the lab's decayed usage over the campus' and `S`
//! an equal share `1/labs`: jobs of the lab with the highest `F` (least usage) first,
//! first come first served inside a lab.

/// A node as the baselines see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolNode {
    /// Free GPUs.
    pub free: u32,
    /// All its GPUs.
    pub size: u32,
    /// Takes new jobs.
    pub up: bool,
    /// `(end at its time limit, GPUs)` of every job running on it.
    pub ends: Vec<(i64, u32)>,
}

/// A queued job: `(id, GPUs, time limit in seconds)`.
pub type QueueEntry = (usize, u32, i64);

/// The head's reservation.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shadow {
    node: usize,
    at: i64,
    extra: u32,
}

/// The earliest node and time where `gpus` GPUs are free, from the running jobs' ends.
fn shadow(nodes: &[PoolNode], gpus: u32) -> Option<Shadow> {
    let mut best: Option<Shadow> = None;
    for (i, n) in nodes.iter().enumerate() {
        if !n.up || n.size < gpus {
            continue;
        }
        let mut ends = n.ends.clone();
        ends.sort_unstable();
        let (mut avail, mut at) = (n.free, i64::MIN);
        for (end, k) in ends {
            if avail >= gpus {
                break;
            }
            avail += k;
            at = end;
        }
        if avail >= gpus && best.is_none_or(|b| at < b.at) {
            best = Some(Shadow {
                node: i,
                at,
                extra: avail - gpus,
            });
        }
    }
    best
}

/// EASY backfill over `nodes` at `now`: which queued jobs (in the priority order
/// given) start, and on which node (index). Jobs wider than every node are skipped.
pub fn easy_backfill(
    queue: impl IntoIterator<Item = QueueEntry>,
    nodes: &[PoolNode],
    now: i64,
) -> Vec<(usize, usize)> {
    let widest = nodes
        .iter()
        .filter(|n| n.up)
        .map(|n| n.size)
        .max()
        .unwrap_or(0);
    let mut nodes = nodes.to_vec();
    let max_free = |nodes: &[PoolNode]| nodes.iter().filter(|n| n.up).map(|n| n.free).max();
    let mut most = max_free(&nodes).unwrap_or(0);
    let mut head: Option<Shadow> = None;
    let mut blocked = false;
    let mut out = Vec::new();
    for (job, gpus, limit) in queue {
        if most == 0 {
            break;
        }
        if gpus == 0 || gpus > widest {
            continue;
        }
        let ends = now.saturating_add(limit.max(1));
        let mut best: Option<(u32, usize)> = None;
        if gpus <= most {
            for (i, n) in nodes.iter().enumerate() {
                if !n.up || n.free < gpus {
                    continue;
                }
                let allowed = match head {
                    Some(h) if h.node == i => ends <= h.at || gpus <= h.extra,
                    _ => true,
                };
                if allowed && best.is_none_or(|(f, _)| n.free < f) {
                    best = Some((n.free, i));
                }
            }
        }
        match best {
            Some((_, i)) => {
                if let Some(h) = head.as_mut().filter(|h| h.node == i && ends > h.at) {
                    h.extra -= gpus;
                }
                nodes[i].free -= gpus;
                nodes[i].ends.push((ends, gpus));
                most = max_free(&nodes).unwrap_or(0);
                out.push((job, i));
            }
            None if !blocked => {
                blocked = true;
                head = shadow(&nodes, gpus);
            }
            None => {}
        }
    }
    out
}

/// The labs in fair-share order: highest `F = 2^(-U/S)` first (`U`: the lab's usage
/// over the total, `S = 1/labs`), ties by lab index. `usage` is per lab.
pub fn fair_order(usage: &[f64]) -> Vec<usize> {
    let total: f64 = usage.iter().map(|u| u.max(0.0)).sum();
    let share = 1.0 / usage.len().max(1) as f64;
    let factor = |u: f64| {
        let norm = if total > 0.0 { u.max(0.0) / total } else { 0.0 };
        2f64.powf(-norm / share)
    };
    let mut labs: Vec<usize> = (0..usage.len()).collect();
    labs.sort_by(|&a, &b| {
        factor(usage[b])
            .total_cmp(&factor(usage[a]))
            .then(a.cmp(&b))
    });
    labs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(free: u32, size: u32, ends: &[(i64, u32)]) -> PoolNode {
        PoolNode {
            free,
            size,
            up: true,
            ends: ends.to_vec(),
        }
    }

    #[test]
    fn later_jobs_backfill_only_if_the_head_is_not_delayed() {
        // Node 0: 8 GPUs, 6 busy until t=100. Node 1: 4 GPUs, 1 free, the rest until 50.
        let nodes = [node(2, 8, &[(100, 6)]), node(1, 4, &[(50, 3)])];
        // The head wants 4: earliest on node 1 at t=50 with 0 extra.
        // Job 1 (2 GPUs) fills node 0. Job 3 (1 GPU, 100 s) would run past 50 on
        // node 1 and delay the head: it waits. Job 2 (1 GPU, 10 s) ends by 50: it runs.
        let starts = easy_backfill(
            [(0, 4, 10), (1, 2, 100), (3, 1, 100), (2, 1, 10)],
            &nodes,
            0,
        );
        assert_eq!(starts, vec![(1, 0), (2, 1)]);
    }

    #[test]
    fn jobs_in_the_extra_gpus_may_run_long() {
        // The head needs 2 of node 0 at t=100, when 4 come free: 2 extra.
        let nodes = [node(1, 4, &[(100, 3)])];
        let starts = easy_backfill([(0, 2, 10), (1, 1, 1_000)], &nodes, 0);
        assert_eq!(starts, vec![(1, 0)]);
        // Without extra GPUs the long job would delay the head.
        let nodes = [node(1, 2, &[(100, 1)])];
        assert!(easy_backfill([(0, 2, 10), (1, 1, 1_000)], &nodes, 0).is_empty());
    }

    #[test]
    fn best_fit_and_skips() {
        let nodes = [node(4, 8, &[]), node(2, 8, &[]), node(8, 8, &[])];
        let starts = easy_backfill([(0, 16, 10), (1, 2, 10), (2, 3, 10)], &nodes, 0);
        assert_eq!(starts, vec![(1, 1), (2, 0)]);
    }

    #[test]
    fn fair_order_puts_light_labs_first() {
        assert_eq!(fair_order(&[10.0, 0.0, 5.0]), vec![1, 2, 0]);
        assert_eq!(fair_order(&[0.0, 0.0]), vec![0, 1]);
    }
}
