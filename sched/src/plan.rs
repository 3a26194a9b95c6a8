//! The planning loop: owner reclaims, owner jobs, then guests in fair-share order with
//! backfill, repeated until a round changes nothing.
//!
//! Invariants:
//! - The plan is a fixed point: applying its starts and preemptions to the snapshot
//!   and planning again starts and preempts nothing new.
//! - Every queued job that does not start gets exactly one reason and one position.
//! - Per round the work is about O(queue log queue + shapes x GPUs): identical waiting
//!   requests share one search, and nothing is searched once no GPU is free.

use std::collections::BTreeMap;

use crate::fairshare::FairQueue;
use crate::model::*;
use crate::owner::{fits_own_node, place_owner_jobs};
use crate::policy::Policy;
use crate::placement::{reserve, search, Verdict};
use crate::preemption::reclaims;
use crate::quota::{lab_block, member_block};
use crate::reason::Reason;
use crate::state::{describe_request, World};

/// What one round decided; `pending` is in queue-position order.
#[derive(Default)]
pub(crate) struct Round {
    pub starts: Vec<Start>,
    pub preempts: Vec<Preempt>,
    /// (index into the queue, reason).
    pub pending: Vec<(usize, Reason)>,
}

/// Decide which queued jobs start where, which guests to preempt, and why the others
/// wait.
///
/// 1. Read the snapshot into a working [`World`] (nodes, GPUs and running jobs in id
///    order, quota tallies).
/// 2. Plan a round (see [`round`]) and apply its starts and preemptions to the world.
/// 3. Repeat until a round starts and preempts nothing; that round's reasons are the
///    plan's. Every other round starts or preempts something new, so this ends, and in
///    practice after two rounds; it is what makes planning again a no-op.
pub fn plan(snapshot: &Snapshot, policy: &Policy, now: Time) -> Plan {
    let mut world = World::new(snapshot, policy, now);
    let running: std::collections::BTreeSet<JobId> =
        snapshot.running.iter().map(|r| r.id).collect();
    let mut queue: Vec<&QueuedJob> = snapshot
        .queue
        .iter()
        .filter(|j| !running.contains(&j.id))
        .collect();
    queue.sort_by_key(|j| j.id);
    queue.dedup_by_key(|j| j.id);
    let mut started = vec![false; queue.len()];
    let index: BTreeMap<JobId, usize> = queue.iter().enumerate().map(|(i, j)| (j.id, i)).collect();
    let mut out = Plan::default();
    loop {
        world.new_round();
        let r = round(&mut world, &queue, &started);
        if r.starts.is_empty() && r.preempts.is_empty() {
            out.pending = r
                .pending
                .into_iter()
                .zip(1..)
                .map(|((j, reason), position)| Pending {
                    job: queue[j].id,
                    reason,
                    position,
                })
                .collect();
            return out;
        }
        for s in &r.starts {
            started[index[&s.job]] = true;
        }
        out.start.extend(r.starts);
        out.preempt.extend(r.preempts);
    }
}

/// The key under which identical requests share a search result.
type Shape<'a> = (LabId, u32, &'a [String], u64, Option<&'a str>, i64);

fn shape<'a>(job: &'a QueuedJob) -> Shape<'a> {
    (
        job.lab,
        job.gpus,
        &job.models,
        job.min_memory_mb,
        job.mig_profile.as_deref(),
        job.time_limit_s,
    )
}

/// One round of planning over the jobs not yet started.
///
/// 1. Preempt guests the owner takes back outright (node reclaimed, GPU in local use).
/// 2. Owner phase: jobs that fit their own lab's nodes start there, preempt guests, or
///    claim GPUs and wait ([`place_owner_jobs`]).
/// 3. Guest phase: every other job, and owner jobs that wait for their own nodes, in
///    fair-share order ([`FairQueue`]): check member and lab quotas, reuse the result
///    of an identical request that already failed, else search all nodes for the best
///    fit. A job that fails reserves GPUs for its earliest start while the policy's
///    backfill depth lasts, so later jobs only backfill around it.
fn round(world: &mut World, queue: &[&QueuedJob], started: &[bool]) -> Round {
    let mut out = Round::default();
    for (r, why) in reclaims(world) {
        out.preempts.push(world.preempt(r, why));
    }

    let (owners, mut guests): (Vec<usize>, Vec<usize>) = (0..queue.len())
        .filter(|&j| !started[j])
        .partition(|&j| fits_own_node(world, queue[j]));
    let elsewhere = place_owner_jobs(world, queue, owners, &mut out);
    let waiting_owner: std::collections::BTreeSet<usize> = elsewhere.iter().copied().collect();
    guests.extend(elsewhere);

    let mut fair = FairQueue::new(world, queue, &guests);
    let mut failed: BTreeMap<Shape, Reason> = BTreeMap::new();
    let mut depth = world.policy.backfill_depth;
    while let Some((j, ticket)) = fair.pop() {
        let job = queue[j];
        let owner = waiting_owner.contains(&j);
        let result = place_guest(world, job, owner, &mut failed, &mut depth);
        match result {
            Ok(start) => {
                fair.done(ticket, job.gpus);
                if owner {
                    out.pending.retain(|&(p, _)| p != j);
                }
                out.starts.push(start);
            }
            Err(reason) => {
                fair.done(ticket, 0);
                if !owner {
                    out.pending.push((j, reason));
                }
            }
        }
    }
    out
}

fn place_guest<'a>(
    world: &mut World,
    job: &'a QueuedJob,
    owner: bool,
    failed: &mut BTreeMap<Shape<'a>, Reason>,
    depth: &mut u32,
) -> Result<Start, Reason> {
    if !owner {
        if let Some(reason) = member_block(world, job) {
            return Err(reason);
        }
    }
    if let Some(reason) = lab_block(world, job) {
        return Err(reason);
    }
    let key = shape(job);
    if let Some(reason) = failed.get(&key) {
        return Err(reason.clone());
    }
    if job.gpus > 0 && world.free_total >= job.gpus {
        if let Some((n, gpus)) = search(world, job, false).fit {
            return Ok(world.start(job, n, gpus));
        }
    }
    let best = search(world, job, true).best;
    if *depth > 0 && best.is_some_and(|(v, _)| v.transient()) && reserve(world, job) {
        *depth -= 1;
    }
    let reason = explain(world, job, best);
    failed.insert(key, reason.clone());
    Err(reason)
}

/// The reason for a guest job that no node takes, from the most hopeful refusal.
fn explain(world: &World, job: &QueuedJob, best: Option<(Verdict, usize)>) -> Reason {
    let Some((verdict, n)) = best else {
        return no_fit(job);
    };
    let node = world.node_name(n);
    let rules = &world.nodes[n].node.lending;
    match verdict {
        Verdict::Busy if job.models.is_empty() && job.min_memory_mb == 0 && job.mig_profile.is_none() => {
            Reason::WaitingForGpus { gpus: job.gpus }
        }
        Verdict::Busy => Reason::NoFreeMatchingGpu {
            gpus: job.gpus,
            detail: describe_request(job),
        },
        Verdict::Behind(earlier) => Reason::BehindEarlierJob { job: earlier },
        Verdict::OwnerClaimed => Reason::OwnerReserved { node },
        Verdict::IdleWait => Reason::NotLent {
            detail: format!(
                "node {node} lends a GPU only after it was idle {}",
                crate::reason::hours(rules.min_idle_s)
            ),
        },
        Verdict::LendLimit => Reason::NotLent {
            detail: format!(
                "node {node} already lends its limit of {} GPUs",
                rules.max_lent_gpus.unwrap_or(0)
            ),
        },
        Verdict::Offline => Reason::NotLent {
            detail: format!("node {node}, which fits, is offline or draining"),
        },
        Verdict::NotLent(block) => Reason::NotLent {
            detail: block.describe(&node, job, rules),
        },
        Verdict::NoHardware => no_fit(job),
    }
}

fn no_fit(job: &QueuedJob) -> Reason {
    Reason::NoNodeFits {
        gpus: job.gpus,
        detail: describe_request(job),
    }
}
