//! Owner first: a lab's jobs on the lab's own nodes, before any guest is considered.
//!
//! Invariants:
//! - An owner job that fits one of its lab's schedulable nodes is placed there: on
//!   free GPUs if enough are free, else by preempting just enough guests (with the
//!   node's grace period), else it waits for its lab's own jobs.
//! - GPUs an owner job waits for are claimed: no guest is placed on them in this plan.
//!   A waiting owner job claims the free matching GPUs of every own node that could
//!   hold it, not just the one it names: which node frees first may change as jobs
//!   start, and a guest on any of them would change the owner's choice in the next
//!   round (the plan would not be a fixed point). A later job of the same lab may use
//!   a claimed free GPU only if it ends before the owner job is expected to start there
//!   (backfill inside the lab); GPUs of guests being preempted are claimed outright.
//! - Owner jobs are never preempted; guests started in this plan are never victims.
//! - Lending rules do not apply to a lab's own jobs; member quotas do.

use crate::model::{QueuedJob, Time};
use crate::placement::end_of;
use crate::placement::search;
use crate::preemption::victims;
use crate::quota::{lab_block, member_block};
use crate::reason::Reason;
use crate::risk::risk_class;
use crate::state::{gpu_matches, World};
use crate::Round;

/// The lab's schedulable nodes that could ever hold queued job `j` (empty: the job is
/// not an owner job anywhere). The same for every job of a shape, so plans compute it
/// once per shape.
pub(crate) fn own_candidates(world: &World, j: usize) -> Vec<usize> {
    let job = world.queue[j];
    world.labs[world.meta[j].lab]
        .nodes
        .iter()
        .copied()
        .filter(|&n| {
            let nw = &world.nodes[n];
            nw.node.schedulable && nw.can_hold(job)
        })
        .collect()
}

/// What one own node offers an owner job.
struct Offer {
    node: usize,
    /// Free matching GPUs the job may use (unclaimed, or claimed until after it ends).
    usable: Vec<usize>,
    /// When the job could start here without preempting anyone (`Time::MAX`: unknown).
    at: Time,
    kind: Kind,
}

enum Kind {
    /// Start now on these GPUs; `left` free GPUs remain on the node.
    Start { left: u32, gpus: Vec<usize> },
    /// Preempt these guests (running indices), losing `cost` GPU-seconds.
    Preempt { cost: i64, victims: Vec<usize> },
    /// Wait for running jobs to end.
    Wait,
}

/// Buffers `offer` reuses between calls (it runs for every own node of every owner job).
#[derive(Default)]
struct Scratch {
    times: Vec<Time>,
    own_times: Vec<Time>,
}

fn offer(world: &World, job: &QueuedJob, n: usize, scratch: &mut Scratch) -> Offer {
    let now = world.now;
    let want = job.gpus as usize;
    let ends = end_of(now, job);
    let nw = &world.nodes[n];
    let mut usable = Vec::new();
    let mut guest_held = 0usize;
    let times = &mut scratch.times;
    times.clear();
    // When the GPUs come free without stopping a guest (free ones and the lab's own).
    let own_times = &mut scratch.own_times;
    own_times.clear();
    for g in nw.gpus.clone() {
        let gw = &world.gpus[g];
        if gw.gpu.local_use || !gpu_matches(job, gw.gpu) {
            continue;
        }
        match gw.holder {
            None => {
                if gw.claim.is_none_or(|c| ends.is_some_and(|e| e <= c.until)) {
                    usable.push(g);
                    times.push(now);
                    own_times.push(now);
                }
            }
            Some(r) if gw.claim.is_none() => {
                let run = &world.running[r];
                if run.guest && !run.new {
                    guest_held += 1;
                    times.push(now.saturating_add(i64::from(nw.grace_s)));
                } else if let Some(end) = run.expected_end(now, nw.grace_s) {
                    times.push(end);
                    own_times.push(end);
                }
            }
            Some(_) => {}
        }
    }
    times.sort_unstable();
    own_times.sort_unstable();
    let mut at = times.get(want - 1).copied().unwrap_or(Time::MAX);
    let own_at = own_times.get(want - 1).copied().unwrap_or(Time::MAX);
    let patience = world.policy.owner_patience_s;
    let kind = if usable.len() >= want && !nw.capacity_free_for(job) {
        // The GPUs are there but the server's CPUs or memory are taken: wait for them.
        Kind::Wait
    } else if usable.len() >= want {
        let mut gpus = usable.clone();
        gpus.sort_by_key(|&g| {
            (
                world.gpus[g].claim.is_some(),
                world.gpus[g].gpu.memory_mb,
                g,
            )
        });
        gpus.truncate(want);
        Kind::Start {
            left: nw.free.saturating_sub(job.gpus),
            gpus,
        }
    } else if patience > 0 && own_at <= now.saturating_add(patience) {
        // The lab's own jobs free the GPUs soon enough: wait for them, stop nobody.
        at = own_at;
        Kind::Wait
    } else if usable.len() + guest_held >= want {
        let need = (want - usable.len()) as u32;
        match victims(world, job, n, need) {
            Some((victims, cost)) => Kind::Preempt { cost, victims },
            None => Kind::Wait,
        }
    } else {
        Kind::Wait
    };
    Offer {
        node: n,
        usable,
        at,
        kind,
    }
}

/// The order in which owner jobs are placed: by lab, then boosted interactive jobs
/// before the rest (`JobMeta::tier`), then member standing in the ledger (lowest decayed
/// usage first), then first come, first served. It depends only on the snapshot, not on
/// what runs, so it is the same in every round of a plan and after the plan is applied
/// (fewer rounds, same fixed point).
pub(crate) fn owner_order(world: &World, mut jobs: Vec<usize>) -> Vec<usize> {
    jobs.sort_by(|&a, &b| {
        let (ma, mb) = (&world.meta[a], &world.meta[b]);
        let (qa, qb) = (world.queue[a], world.queue[b]);
        let (ua, ub) = (
            world.members[ma.member].usage,
            world.members[mb.member].usage,
        );
        ma.lab
            .cmp(&mb.lab)
            .then(ma.tier.cmp(&mb.tier))
            .then(ua.total_cmp(&ub))
            .then((ma.member, qa.submitted_at, qa.id).cmp(&(mb.member, qb.submitted_at, qb.id)))
    });
    jobs
}

/// With [`crate::Policy::owner_borrows_before_preempting`]: free GPUs on another lab's
/// node where the owner job, as a guest there, runs with a low chance of being taken
/// back ([`crate::risk::risk_class`] at most 1: under 0.2 expected take-backs, a chance
/// under 20 %) and within the lab's
/// borrowing quota and the node's lending rules. Starting there stops nobody.
fn safe_elsewhere(world: &World, j: usize) -> Option<(usize, Vec<usize>)> {
    if !world.policy.owner_borrows_before_preempting || lab_block(world, j).is_some() {
        return None;
    }
    let job = world.queue[j];
    let (n, gpus) = search(world, job, false).fit?;
    let returns = world.nodes[n].returns.as_ref();
    (returns.is_some() && risk_class(returns, world.now, job.time_limit_s, world.policy) <= 1)
        .then_some((n, gpus))
}

/// Place the owner jobs `jobs` (queue indices, in [`owner_order`]) on their labs' nodes;
/// returns the ones that wait for their own nodes and may run elsewhere meanwhile.
///
/// 1. Labs are independent (their nodes are disjoint); jobs go in the given order.
/// 2. A job over its member quota waits with that reason.
/// 3. Every own node that could hold the job (`own_nodes`, by shape) makes an offer: start now (best fit wins:
///    fewest free GPUs left), else preempt guests (the cheapest set wins), else wait
///    (the earliest expected start wins). Ties go to the lowest node id. With
///    [`crate::Policy::owner_patience_s`], waiting for the lab's own jobs that end
///    within that time beats preempting. Before it preempts, it may start on another
///    lab's free GPUs where that is safe ([`safe_elsewhere`]).
/// 4. Preempting: the victims are told to stop and the job claims their GPUs and the
///    free ones of that node. Waiting for its own jobs: it may also run elsewhere as a
///    guest (returned). Either way it claims the free matching GPUs of every other own
///    node that could hold it, until its expected start there.
/// 5. A shape that found nothing to claim and no one to preempt is remembered: claims
///    only grow and GPUs only fill up in this phase, so its later jobs wait too.
pub(crate) fn place_owner_jobs(
    world: &mut World,
    jobs: &[usize],
    own_nodes: &[Vec<usize>],
    round: &mut Round,
) -> Vec<usize> {
    let mut elsewhere = Vec::new();
    let mut scratch = Scratch::default();
    let mut hopeless: Vec<Option<usize>> = vec![None; world.shapes];
    for &j in jobs {
        let job = world.queue[j];
        if let Some(reason) = member_block(world, j) {
            round.wait(j, reason);
            continue;
        }
        if let Some(r) = hopeless[world.meta[j].shape] {
            round.pending.push((j, r));
            elsewhere.push(j);
            continue;
        }
        let offers: Vec<Offer> = own_nodes[world.meta[j].shape]
            .iter()
            .map(|&n| offer(world, job, n, &mut scratch))
            .collect();
        // Start now (best fit), else preempt (cheapest), else wait (earliest); ties go
        // to the lowest node id (offers are in node order and comparisons are strict).
        // With patience, waiting for the lab's own jobs that free the GPUs soon beats
        // preempting (its key is negative, costs are not).
        let patient = world.now.saturating_add(world.policy.owner_patience_s);
        let mut best: Option<(u8, i64, usize)> = None;
        for (i, o) in offers.iter().enumerate() {
            let key = match &o.kind {
                Kind::Start { left, .. } => (0, i64::from(*left)),
                Kind::Preempt { cost, .. } => (1, *cost),
                Kind::Wait if o.at <= patient && world.policy.owner_patience_s > 0 => {
                    (1, o.at.saturating_sub(patient).saturating_sub(1))
                }
                Kind::Wait => (2, o.at),
            };
            if best.is_none_or(|b| key < (b.0, b.1)) {
                best = Some((key.0, key.1, i));
            }
        }
        let Some((_, _, chosen)) = best else { continue };
        if let Kind::Start { gpus, .. } = &offers[chosen].kind {
            let (n, gpus) = (offers[chosen].node, gpus.clone());
            round.starts.push(world.start(j, n, gpus));
            round.started.push(j);
            continue;
        }
        if matches!(offers[chosen].kind, Kind::Preempt { .. }) {
            if let Some((n, gpus)) = safe_elsewhere(world, j) {
                round.starts.push(world.start(j, n, gpus));
                round.started.push(j);
                continue;
            }
        }
        // The job waits. It claims the free GPUs it could use on every own node, so that
        // no guest lands where it waits, whichever node frees first.
        let n = offers[chosen].node;
        let name = world.node_name(n);
        let reason = if let Kind::Preempt { victims, .. } = &offers[chosen].kind {
            for &r in victims {
                for g in world.running[r].gpus.clone() {
                    if gpu_matches(job, world.gpus[g].gpu) {
                        world.claim(g, world.now);
                    }
                }
                if !world.running[r].preempting {
                    let why = format!("the owner lab of node {name} needs its GPUs back");
                    round.preempts.push(world.preempt(r, why));
                }
            }
            let grace_s = world.nodes[n].grace_s;
            Reason::WaitingForGuestsToLeave {
                node: name,
                grace_s,
            }
        } else {
            elsewhere.push(j);
            Reason::WaitingForOwnJobs { node: name }
        };
        let r = round.wait(j, reason);
        if offers[chosen].at < Time::MAX {
            round.estimate(j, offers[chosen].at);
        }
        if offers
            .iter()
            .all(|o| matches!(o.kind, Kind::Wait) && o.usable.is_empty())
        {
            hopeless[world.meta[j].shape] = Some(r);
        }
        for (i, o) in offers.into_iter().enumerate() {
            let until = if i == chosen && !matches!(o.kind, Kind::Wait) {
                world.now
            } else {
                o.at
            };
            for g in o.usable {
                world.claim(g, until);
            }
        }
    }
    elsewhere
}
