//! Preemption: which guests give GPUs back to their owner, and at what cost.
//!
//! Invariants:
//! - Only guests are ever preempted (a job whose lab differs from its node's lab); an
//!   owner's job is never a victim.
//! - A job started by this plan is never a victim in it (no start-then-preempt loops),
//!   and a job already being preempted is never preempted again.
//! - Victims are the ones that lose the least work: GPU-seconds since their latest
//!   checkpoint (or start), but at least the minimum runtime per GPU (a restart costs).
//!   On one node, guests already stopping are taken first, so nothing is preempted
//!   twice; across nodes the cost counts them too, so the choice is the same in every
//!   round and after the plan is applied. Guests inside the policy's minimum runtime are taken only
//!   when older guests do not free enough GPUs; the owner's reclaim may take them.
//! - "Just enough": after the greedy choice, any victim whose GPUs are not needed to
//!   reach the count is dropped again.
//! - A GPU that carries shares frees only when all of them stop: for a whole-GPU owner
//!   job it is one unit whose victims are all its guest shares (none may be the owner
//!   lab's own or started in this plan), costing their lost work together.

use crate::model::QueuedJob;
use crate::state::{gpu_matches, World};

/// Guests the owner takes back regardless of the queue: on a node the owner reclaims,
/// holding a GPU the owner now uses directly (or that failed), or on a node whose
/// lending rule does not lend now (a window closed, the rule became "never").
/// Returns (running index, reason).
pub(crate) fn reclaims(world: &World) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, r) in world.running.iter().enumerate() {
        if !r.guest || r.preempting || r.new {
            continue;
        }
        let Some(n) = r.node else { continue };
        let name = world.node_name(n);
        if world.nodes[n].node.reclaim {
            out.push((i, format!("the owner of node {name} reclaimed it")));
        } else if r.gpus.iter().any(|&g| world.gpus[g].gpu.local_use) {
            out.push((
                i,
                format!("the owner of node {name} is using the GPU directly"),
            ));
        } else if world.nodes[n].lend_until.is_none() {
            out.push((
                i,
                format!("node {name} no longer lends now (its lending window closed or its rule changed)"),
            ));
        }
    }
    out
}

/// Guests to stop on node `n` so that an owner job gets `need` more matching GPUs.
/// Returns the victims (running indices) and the GPU-seconds they lose, or `None` if
/// all the guests together do not free enough.
///
/// 1. Tally, per guest on the node, the matching GPUs it holds that nobody claimed;
///    each matching GPU that carries only guests' shares is one more unit, with all
///    of them as its victims.
/// 2. Rank units: already stopping first (free), then outside the minimum runtime
///    before inside it, then (with [`crate::Policy::victims_over_share_first`]) guests
///    of labs over their fair share before the others, then by work lost (the latest
///    checkpoint counts), then by job id.
/// 3. Take guests in that order until `need` GPUs are covered.
/// 4. Walk the chosen ones from the last back and drop any that is not needed.
pub(crate) fn victims(
    world: &World,
    job: &QueuedJob,
    n: usize,
    need: u32,
) -> Option<(Vec<usize>, i64)> {
    let now = world.now;
    let extra = crate::owner::owner_delay_cap(job, world.policy);
    // A node has a handful of GPUs: a small Vec beats a map here. A unit is the guests
    // that free `count` GPUs together: one guest holding GPUs whole, or a GPU's shares
    // (kept as the GPU's index: no Vec per unit).
    let guest = |r: usize| world.running[r].guest && !world.running[r].new;
    let mut held: Vec<(Unit, u32)> = Vec::new();
    for g in world.nodes[n].gpus.clone() {
        let gw = &world.gpus[g];
        if gw.claim.is_some() {
            continue;
        }
        // The cheap checks first; the GPU's kind only for a GPU guests could free.
        match gw.holder {
            Some(r) if guest(r) && gpu_matches(job, gw.gpu) => {
                match held.iter_mut().find(|(h, _)| *h == Unit::Whole(r)) {
                    Some((_, c)) => *c += 1,
                    None => held.push((Unit::Whole(r), 1)),
                }
            }
            None if gw.shared.is_some()
                && gw.shares().iter().all(|&r| guest(r))
                && gpu_matches(job, gw.gpu) =>
            {
                held.push((Unit::Shares(g), 1));
            }
            _ => {}
        }
    }
    type Rank = (bool, bool, bool, i64, i64, usize, u32);
    let mut ranked: Vec<Rank> = held
        .iter()
        .enumerate()
        .map(|(u, (unit, count))| {
            let runs = unit.runs(world);
            let all = |f: &dyn Fn(usize) -> bool| runs.iter().all(|&r| f(r));
            let young = !all(&|r| {
                now.saturating_sub(world.running[r].started_at) >= world.policy.min_runtime_s
            });
            let under = world.policy.victims_over_share_first
                && !all(&|r| over_share(world, world.running[r].lab));
            let job_id = runs.iter().map(|&r| world.running[r].job).min();
            (
                !all(&|r| world.running[r].preempting),
                young,
                under,
                runs.iter()
                    .map(|&r| cost_of(world, r, extra))
                    .fold(0, i64::saturating_add),
                job_id.unwrap_or(0),
                u,
                *count,
            )
        })
        .collect();
    ranked.sort_unstable();
    let mut chosen = Vec::new();
    let mut got = 0;
    for &(_, _, _, cost, _, u, count) in &ranked {
        if got >= need {
            break;
        }
        chosen.push((u, count, cost));
        got += count;
    }
    if got < need {
        return None;
    }
    let mut i = chosen.len();
    while i > 0 {
        i -= 1;
        if got - chosen[i].1 >= need {
            got -= chosen[i].1;
            chosen.remove(i);
        }
    }
    let cost = chosen
        .iter()
        .map(|&(_, _, c)| c)
        .fold(0, i64::saturating_add);
    let runs = chosen
        .into_iter()
        .flat_map(|(u, _, _)| held[u].0.runs(world).iter().copied())
        .collect();
    Some((runs, cost))
}

/// A victim unit of [`victims`]: a guest holding GPUs whole (running index), or every
/// guest share on one GPU (GPU index).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Whole(usize),
    Shares(usize),
}

impl Unit {
    /// The running jobs that stop together.
    fn runs<'a>(&'a self, world: &'a World) -> &'a [usize] {
        match self {
            Unit::Whole(r) => std::slice::from_ref(r),
            Unit::Shares(g) => world.gpus[*g].shares(),
        }
    }
}

/// Whether lab slot `lab` used more than its fair share: decayed usage above its base
/// share plus decayed contribution (the standing `fairshare` orders labs by). It
/// depends only on the snapshot, so the choice is the same in every round.
fn over_share(world: &World, lab: usize) -> bool {
    let l = &world.labs[lab];
    l.usage > l.share
}

/// GPU-seconds a preemption of running job `r` loses, for ranking and choosing.
///
/// It ignores whether the guest is already stopping: a guest this plan (or the previous
/// one) told to stop must weigh the same as before, or an owner job would hop to its
/// node in the next round and the plan would not be a fixed point. A restart costs at
/// least the minimum runtime, so a guest that just started is never a free victim.
/// A guest expected to save everything on stop ([`crate::state::RunW::saves_on_stop`])
/// costs only that.
pub(crate) fn cost_of(world: &World, r: usize, extra: Option<u32>) -> i64 {
    let run = &world.running[r];
    let floor = match run.share {
        None => i64::from(run.gpu_count).saturating_mul(world.policy.min_runtime_s.max(1)),
        Some(_) => (run
            .milli_i64()
            .saturating_mul(world.policy.min_runtime_s.max(1))
            / 1000)
            .max(1),
    };
    let grace = run
        .node
        .map_or(world.policy.default_grace_s, |n| world.nodes[n].grace_s);
    if run.saves_on_stop(grace, world.policy, extra) {
        return floor;
    }
    run.lost_work(world.now).max(floor)
}
