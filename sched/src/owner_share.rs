//! Owner first, for shares: a lab's share job on the lab's own nodes that share GPUs.
//!
//! Invariants:
//! - It starts on a GPU of its own nodes where it fits now (the `commons` rule chooses),
//!   else it preempts just enough guests on one GPU (guest shares, cheapest first, or
//!   the guest that holds the GPU whole), else it waits for its lab's own jobs and may
//!   run elsewhere meanwhile, as a guest.
//! - GPUs claimed by the lab's waiting whole-GPU jobs are left alone; a waiting share
//!   job claims the GPUs of its own sharing nodes it could use, so no guest lands where
//!   it waits (the plan stays a fixed point). Later share jobs of the lab may still use
//!   those GPUs.
//! - Owner jobs are never preempted; guests started in this plan are never victims.

use crate::model::{QueuedJob, Time};
use crate::owner::owner_delay_cap;
use crate::preemption::cost_of;
use crate::quota::member_block;
use crate::reason::Reason;
use crate::sharing::share_ask;
use crate::state::{gpu_matches, World};
use crate::Round;

/// Place owner share job `j` on `nodes` (its lab's schedulable sharing nodes that could
/// hold it). Returns true when it waits for its lab's own jobs (it may run elsewhere).
pub(crate) fn place_owner_share(
    world: &mut World,
    j: usize,
    nodes: &[usize],
    round: &mut Round,
) -> bool {
    if let Some(reason) = member_block(world, j) {
        round.wait(j, reason);
        return false;
    }
    let job = world.queue[j];
    // A share that named only memory passed as the least fraction: check the least it
    // takes on any GPU here, so that it waits for the quota in every round alike.
    if let Some(least) = least_milli(world, job, nodes) {
        if least > world.meta[j].ask.milli {
            if let Some(reason) = crate::quota::blocks_with(world, j, least, false) {
                round.wait(j, reason);
                return false;
            }
        }
    }
    let offers: Vec<(usize, Vec<usize>)> = nodes
        .iter()
        .filter(|&&n| world.nodes[n].capacity_free_for(job))
        .map(|&n| (n, fitting(world, job, n)))
        .filter(|(_, g)| !g.is_empty())
        .collect();
    if let Some(fit) = world.choose_share(job, &offers) {
        // A share that named only memory was checked as the least fraction.
        let resolved = u64::from(fit.2);
        if resolved > world.meta[j].ask.milli {
            if let Some(reason) = crate::quota::blocks_with(world, j, resolved, false) {
                round.wait(j, reason);
                return false;
            }
        }
        round.starts.push(world.start_share(j, fit));
        round.started.push(j);
        return false;
    }
    // Either way it waits: no guest may land where it could go instead.
    claim_own(world, job, nodes);
    if let Some((n, g, victims)) = cheapest_victims(world, job, nodes) {
        let name = world.node_name(n);
        world.claim(g, world.now, false);
        for r in victims {
            if !world.running[r].preempting {
                let why = format!("the owner lab of node {name} needs its GPUs back");
                let cap = owner_delay_cap(job, world.policy);
                round.preempts.push(world.preempt(r, why, cap));
            }
        }
        let grace_s = world.nodes[n].grace_s;
        round.wait(
            j,
            Reason::WaitingForGuestsToLeave {
                node: name,
                grace_s,
            },
        );
        round.estimate(j, world.now.saturating_add(i64::from(grace_s)));
        return false;
    }
    let node = nodes
        .first()
        .map_or_else(String::new, |&n| world.node_name(n));
    round.wait(j, Reason::WaitingForOwnJobs { node });
    true
}

/// The least compute share `job` resolves to on a matching GPU of `nodes`.
fn least_milli(world: &World, job: &QueuedJob, nodes: &[usize]) -> Option<u64> {
    let share = job.share?;
    nodes
        .iter()
        .flat_map(|&n| world.nodes[n].gpus.clone())
        .filter(|&g| gpu_matches(job, world.gpus[g].gpu))
        .filter_map(|g| crate::sharing::resolve(share, world.gpus[g].gpu.memory_mb))
        .map(|(milli, _)| u64::from(milli))
        .min()
}

/// A waiting share job claims every GPU of its own sharing nodes it could ever use
/// (matching, not in local use, not held whole), for the lab's share jobs only.
fn claim_own(world: &mut World, job: &QueuedJob, nodes: &[usize]) {
    for &n in nodes {
        for g in world.nodes[n].gpus.clone() {
            let gw = &world.gpus[g];
            if gw.holder.is_none() && !gw.gpu.local_use && gpu_matches(job, gw.gpu) {
                world.claim(g, Time::MAX, true);
            }
        }
    }
}

/// The GPUs of own node `n` the share fits on now (not held whole, not in local use,
/// not claimed by a whole-GPU job of the lab).
fn fitting(world: &World, job: &QueuedJob, n: usize) -> Vec<usize> {
    let ask = share_ask(job);
    world.nodes[n]
        .gpus
        .clone()
        .filter(|&g| {
            let gw = &world.gpus[g];
            gw.holder.is_none()
                && !gw.gpu.local_use
                && gw.claim.is_none_or(|c| c.share)
                && gpu_matches(job, gw.gpu)
                && world.share_gpu(g, true).fits(&ask).is_some()
        })
        .collect()
}

/// The GPU of `nodes` where stopping guests makes room for the share at the least cost
/// (GPU-seconds lost, then node and GPU order), with those guests.
///
/// 1. A GPU a guest holds whole frees with that guest.
/// 2. On a GPU with shares, its guests (not started in this plan) go cheapest first,
///    those already stopping before the rest, until the share fits; then any that is
///    not needed after all is dropped again, last first.
fn cheapest_victims(
    world: &World,
    job: &QueuedJob,
    nodes: &[usize],
) -> Option<(usize, usize, Vec<usize>)> {
    let extra = owner_delay_cap(job, world.policy);
    let mut best: Option<(i64, usize, usize, Vec<usize>)> = None;
    for &n in nodes {
        for g in world.nodes[n].gpus.clone() {
            let gw = &world.gpus[g];
            if gw.gpu.local_use || gw.claim.is_some_and(|c| !c.share) || !gpu_matches(job, gw.gpu) {
                continue;
            }
            let victims = match gw.holder {
                Some(r) => {
                    let run = &world.running[r];
                    if !run.guest || run.new {
                        continue;
                    }
                    vec![r]
                }
                None => match share_victims(world, job, g, extra) {
                    Some(v) => v,
                    None => continue,
                },
            };
            let cost = victims
                .iter()
                .map(|&r| cost_of(world, r, extra))
                .fold(0, i64::saturating_add);
            if best.as_ref().is_none_or(|b| cost < b.0) {
                best = Some((cost, n, g, victims));
            }
        }
    }
    best.map(|(_, n, g, v)| (n, g, v))
}

/// Steps 2 of [`cheapest_victims`] on GPU `g`: the guest shares to stop, or `None` if
/// stopping them all does not make room (or none need stopping).
fn share_victims(
    world: &World,
    job: &QueuedJob,
    g: usize,
    extra: Option<u32>,
) -> Option<Vec<usize>> {
    let gw = &world.gpus[g];
    let (need_milli, need_mb) = crate::sharing::resolve(job.share?, gw.gpu.memory_mb)?;
    let mut free = world.share_gpu(g, true);
    let mut ranked: Vec<(bool, i64, crate::model::JobId, usize)> = gw
        .shares()
        .iter()
        .filter(|&&r| world.running[r].guest && !world.running[r].new)
        .map(|&r| {
            let run = &world.running[r];
            (!run.preempting, cost_of(world, r, extra), run.job, r)
        })
        .collect();
    ranked.sort_unstable();
    let fits = |milli: u32, mb: u64| milli >= need_milli && mb >= need_mb;
    let mut chosen: Vec<(usize, u32, u64)> = Vec::new();
    for &(_, _, _, r) in &ranked {
        if fits(free.free_milli, free.free_memory_mb) {
            break;
        }
        let s = world.running[r].share.unwrap_or_default();
        free.free_milli = free.free_milli.saturating_add(s.milli);
        free.free_memory_mb = free.free_memory_mb.saturating_add(s.memory_mb);
        chosen.push((r, s.milli, s.memory_mb));
    }
    if chosen.is_empty() || !fits(free.free_milli, free.free_memory_mb) {
        return None;
    }
    let mut i = chosen.len();
    while i > 0 {
        i -= 1;
        let (_, m, mb) = chosen[i];
        if fits(free.free_milli - m, free.free_memory_mb - mb) {
            free.free_milli -= m;
            free.free_memory_mb -= mb;
            chosen.remove(i);
        }
    }
    Some(chosen.into_iter().map(|(r, _, _)| r).collect())
}
