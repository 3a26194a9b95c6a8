//! Start-time estimates for the jobs that wait.
//!
//! A waiting job's estimate is, in order of preference:
//! 1. its reservation (a guest that reserved GPUs for its earliest start), or its
//!    expected start on its own lab's nodes (an owner job), as the round found them;
//! 2. else a bound from the jobs ahead of it: the campus' GPUs as one pool, the
//!    running jobs handing theirs back at the end of their time limits (a stopping
//!    guest at the end of its grace), and every waiting job ahead of it, in queue
//!    order, taking its GPUs for its own time limit as soon as the pool has them.
//!
//! The pool counts milli-GPUs, so shares take and give back their fraction (a GPU with
//! shares on it offers what they leave free). It ignores which node a GPU is on, so
//! the bound is optimistic for wide jobs
//! and pessimistic where backfill lets a job overtake. A job that waits for a rule or
//! a quota (not for GPUs) gets no estimate and takes nothing from the pool; once the
//! pool cannot supply a job (GPUs held without a time limit), that job gets none.
//!
//! A job that fetches inputs or datasets when it starts ([`crate::QueuedJob::stage_bytes`])
//! starts that much later: its estimate adds the time to fetch them at the fastest speed a
//! server measured ([`crate::Node::fetch_bytes_per_s`]; [`DEFAULT_FETCH_BYTES_PER_S`]
//! before any did), since staging comes before the container.
//!
//! Invariants: pure; one pass over the waiting jobs and one heap of releases, so
//! O((waiting + running) log running).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::model::Time;
use crate::plan::Round;
use crate::reason::Reason;
use crate::state::World;

/// The fetch speed assumed before any server measured one: 100 MB/s.
pub const DEFAULT_FETCH_BYTES_PER_S: u64 = 100_000_000;

/// Seconds to fetch `bytes` at `rate` bytes per second, rounded up.
fn fetch_s(bytes: u64, rate: u64) -> Time {
    i64::try_from(bytes.div_ceil(rate.max(1))).unwrap_or(Time::MAX)
}

/// Whether a job waiting for `reason` waits only for GPUs to come free.
fn waits_for_gpus(reason: &Reason) -> bool {
    matches!(
        reason,
        Reason::WaitingForGpus { .. }
            | Reason::BehindEarlierJob { .. }
            | Reason::NoFreeMatchingGpu { .. }
            | Reason::WaitingForShare { .. }
            | Reason::OwnerReserved { .. }
            | Reason::WaitingForGuestsToLeave { .. }
            | Reason::WaitingForOwnJobs { .. }
            | Reason::SparingGuests { .. }
    )
}

/// The estimates of the round's waiting jobs, in the order of `round.pending`.
pub(crate) fn estimates(world: &World, round: &Round) -> Vec<Option<Time>> {
    let now = world.now;
    let mut free: u64 = 0;
    for g in &world.gpus {
        if g.holder.is_none() && !g.gpu.local_use && world.nodes[g.node].node.schedulable {
            free += u64::from(1000u32.saturating_sub(g.share_used().0));
        }
    }
    let mut releases: BinaryHeap<Reverse<(Time, u64)>> = world
        .running
        .iter()
        .filter_map(|r| {
            let n = r.node?;
            if !world.nodes[n].node.schedulable {
                return None;
            }
            let end = r.expected_end(now, world.nodes[n].grace_s)?;
            Some(Reverse((end, r.milli)))
        })
        .collect();
    let rate = world
        .nodes
        .iter()
        .filter(|n| n.node.schedulable)
        .map(|n| n.node.fetch_bytes_per_s)
        .max()
        .filter(|&r| r > 0)
        .unwrap_or(DEFAULT_FETCH_BYTES_PER_S);
    let mut t = now;
    let mut out = Vec::with_capacity(round.pending.len());
    for &(j, reason) in &round.pending {
        let staging = fetch_s(world.meta[j].ask.stage_bytes, rate);
        let known = round
            .estimates
            .get(j)
            .copied()
            .flatten()
            .map(|at| at.saturating_add(staging));
        if !waits_for_gpus(&round.reasons[reason]) {
            out.push(known);
            continue;
        }
        let job = world.meta[j].ask;
        let need = job.milli;
        while free < need {
            let Some(Reverse((at, gpus))) = releases.pop() else {
                break;
            };
            t = t.max(at);
            free += gpus;
        }
        if free < need {
            out.push(known);
            continue;
        }
        free -= need;
        if job.time_limit_s > 0 {
            releases.push(Reverse((t.saturating_add(job.time_limit_s), need)));
        }
        out.push(Some(known.unwrap_or(t.saturating_add(staging))));
    }
    out
}
