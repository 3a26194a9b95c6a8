//! The planning loop: owner reclaims, owner jobs, then guests in fair-share order with
//! backfill, repeated until a round changes nothing.
//!
//! Invariants:
//! - The plan is a fixed point: applying its starts and preemptions to the snapshot
//!   and planning again starts and preempts nothing new.
//! - Every queued job that does not start gets exactly one reason and one position.
//! - Per round the work is about O(queue log queue + shapes x GPUs): identical waiting
//!   requests share one search, and nothing is searched once no GPU is free.

use crate::fairshare::FairQueue;
use crate::model::*;
use crate::owner::{owner_order, place_owner_jobs, OwnShapes};
use crate::placement::{reserve, search, Verdict};
use crate::policy::Policy;
use crate::preemption::reclaims;
use crate::quota::{lab_block, member_block};
use crate::reason::Reason;
use crate::state::{describe_request, gpu_matches, World};

/// What one round decided.
#[derive(Default)]
pub(crate) struct Round {
    pub starts: Vec<Start>,
    /// Queue indices of `starts`, in the same order.
    pub started: Vec<usize>,
    pub preempts: Vec<Preempt>,
    /// (queue index, index into `reasons`), in position order. Identical requests
    /// share one reason, so a round clones no strings per waiting job.
    pub pending: Vec<(usize, usize)>,
    pub reasons: Vec<Reason>,
    /// Expected start per queue index, where the round found one (a reservation, an
    /// owner job's expected start on its own nodes).
    pub estimates: Vec<Option<Time>>,
}

impl Round {
    /// Keep `reason` for sharing without a job waiting for it yet; returns its index.
    pub fn reason(&mut self, reason: Reason) -> usize {
        self.reasons.push(reason);
        self.reasons.len() - 1
    }

    /// Queue job `j` is expected to start at `at` (the earliest of what it was told).
    pub fn estimate(&mut self, j: usize, at: Time) {
        if let Some(e) = self.estimates.get_mut(j) {
            *e = Some(e.map_or(at, |e: Time| e.min(at)));
        }
    }

    /// Queue job `j` waits for `reason`; returns the reason's index for sharing.
    pub fn wait(&mut self, j: usize, reason: Reason) -> usize {
        let r = self.reason(reason);
        self.pending.push((j, r));
        r
    }
}

/// Decide which queued jobs start where, which guests to preempt, and why the others
/// wait. `now` is UTC seconds since the Unix epoch (virtual in the simulator).
///
/// The policy, in order of precedence:
/// - Guests the owner takes back outright are preempted (node reclaimed, GPU in local
///   use by the owner).
/// - Owner first: a lab's job that fits one of the lab's nodes starts there, or
///   preempts just enough guests (least work lost, with the node's grace period), or
///   waits for the lab's own jobs while no guest may take the GPUs it could use.
/// - Every other job (and owner jobs waiting for their own nodes) in fair-share order
///   among labs, then members, then first come: within member and lab quotas and the
///   nodes' lending rules, on the best-fitting node; the first waiting jobs reserve
///   GPUs for their earliest start and later ones only backfill if they end before.
///
/// The steps:
/// 1. Read the snapshot into a working copy (nodes, GPUs, running jobs and the queue in
///    id order, quota tallies, fair-share ledgers decayed to `now`).
/// 2. Work out once what does not change between rounds: which jobs fit their own
///    lab's nodes, the owner-phase order, and the fair-share grouping order.
/// 3. Plan a round, which applies its starts and preemptions to the working copy as it
///    decides them.
/// 4. Repeat until a round starts and preempts nothing; that round's reasons are the
///    plan's. Every other round starts or preempts something new, so this ends (in
///    practice after two or three rounds), and it is what makes planning again a no-op.
pub fn plan(snapshot: &Snapshot, policy: &Policy, now: Time) -> Plan {
    let mut world = World::new(snapshot, policy, now);
    let n = world.queue.len();
    let own_shapes = OwnShapes::new(&world);
    let own: Vec<bool> = (0..n)
        .map(|j| !own_shapes.nodes[world.meta[j].shape].is_empty())
        .collect();
    // The world keeps the queue in fair-share grouping order already.
    let fair_order: Vec<usize> = (0..n).collect();
    let owners = owner_order(&world, (0..n).filter(|&j| own[j]).collect());
    let mut started = vec![false; n];
    let mut out = Plan::default();
    loop {
        world.new_round();
        let r = round(
            &mut world,
            &own,
            &own_shapes,
            &owners,
            &fair_order,
            &started,
        );
        if r.starts.is_empty() && r.preempts.is_empty() {
            let estimates = crate::estimate::estimates(&world, &r);
            out.pending = r
                .pending
                .iter()
                .zip(estimates)
                .zip(1..)
                .map(|((&(j, reason), estimated_start), position)| Pending {
                    job: world.meta[j].id,
                    reason: r.reasons[reason].clone(),
                    position,
                    estimated_start,
                })
                .collect();
            return out;
        }
        for &j in &r.started {
            started[j] = true;
        }
        out.start.extend(r.starts);
        out.preempt.extend(r.preempts);
    }
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
fn round(
    world: &mut World,
    own: &[bool],
    own_shapes: &OwnShapes,
    owners: &[usize],
    fair_order: &[usize],
    started: &[bool],
) -> Round {
    let mut out = Round {
        estimates: vec![None; world.queue.len()],
        ..Round::default()
    };
    for (r, why) in reclaims(world) {
        out.preempts.push(world.preempt(r, why, None));
    }

    let owners: Vec<usize> = owners.iter().copied().filter(|&j| !started[j]).collect();
    let mut elsewhere = vec![false; world.queue.len()];
    for j in place_owner_jobs(world, &owners, own_shapes, &mut out) {
        elsewhere[j] = true;
    }
    let guests: Vec<usize> = fair_order
        .iter()
        .copied()
        .filter(|&j| !started[j] && (!own[j] || elsewhere[j]))
        .collect();

    let mut fair = FairQueue::new(world, guests);
    let mut failed: Vec<Option<usize>> = vec![None; world.shapes];
    let mut depth = world.policy.backfill_depth;
    let mut moved = false;
    while let Some((j, ticket)) = fair.pop() {
        let owner = elsewhere[j];
        match place_guest(world, j, owner, &mut failed, &mut depth, &mut out) {
            Some(start) => {
                let held = start.share.map_or(f64::from(world.meta[j].gpus), |s| {
                    f64::from(s.milli) / 1000.0
                });
                fair.done(ticket, held);
                moved |= owner;
                out.starts.push(start);
                out.started.push(j);
            }
            None => fair.done(ticket, 0.0),
        }
    }
    if moved {
        // Owner jobs that found GPUs elsewhere no longer wait for their own nodes.
        let started: std::collections::BTreeSet<usize> = out.started.iter().copied().collect();
        out.pending.retain(|(j, _)| !started.contains(j));
    }
    out
}

/// Start guest job `j`, or record why it waits (owner jobs keep their owner-phase
/// reason) and return `None`.
fn place_guest(
    world: &mut World,
    j: usize,
    owner: bool,
    failed: &mut [Option<usize>],
    depth: &mut u32,
    out: &mut Round,
) -> Option<Start> {
    // Owner jobs passed the member check in the owner phase, but a later job of the
    // same member may have started there since: check again.
    if let Some(reason) = member_block(world, j).or_else(|| lab_block(world, j)) {
        if !owner {
            out.wait(j, reason);
        }
        return None;
    }
    let shape = world.meta[j].shape;
    if let Some(r) = failed[shape] {
        if !owner {
            out.pending.push((j, r));
        }
        return None;
    }
    let job = world.queue[j];
    if world.meta[j].share {
        return place_share(world, j, owner, failed, out);
    }
    if job.gpus > 0 && world.free_total >= job.gpus {
        if let Some((n, gpus)) = search(world, job, false).fit {
            return Some(world.start(j, n, gpus));
        }
    }
    let best = search(world, job, true).best;
    if *depth > 0 && best.is_some_and(|(v, _)| v.transient()) {
        if let Some(at) = reserve(world, job) {
            *depth -= 1;
            out.estimate(j, at);
        }
    }
    let reason = explain(world, job, best);
    let r = if owner {
        out.reason(reason)
    } else {
        out.wait(j, reason)
    };
    failed[shape] = Some(r);
    None
}

/// Start guest share job `j`, or record why it waits, as [`place_guest`] does (shares
/// reserve nothing: they fit around the whole-GPU jobs' reservations).
fn place_share(
    world: &mut World,
    j: usize,
    owner: bool,
    failed: &mut [Option<usize>],
    out: &mut Round,
) -> Option<Start> {
    let job = world.queue[j];
    let found = crate::sharing::share_search(world, job);
    if let Some(fit) = found.fit {
        // A share that named only memory was checked as the least fraction: check the
        // fraction it takes on this GPU.
        let resolved = u64::from(fit.2);
        if resolved > world.meta[j].ask.milli {
            let guest = world.nodes[fit.0].node.lab != job.lab;
            if let Some(reason) = crate::quota::blocks_with(world, j, resolved, guest) {
                if !owner {
                    out.wait(j, reason);
                }
                return None;
            }
        }
        return Some(world.start_share(j, fit));
    }
    let reason = match found.best {
        Some((Verdict::Busy | Verdict::Behind(_), _)) => {
            let s = job.share.unwrap_or_default();
            Reason::WaitingForShare {
                milli: s.milli,
                memory_mb: s.memory_mb,
            }
        }
        best => explain(world, job, best),
    };
    let r = if owner {
        out.reason(reason)
    } else {
        out.wait(j, reason)
    };
    failed[world.meta[j].shape] = Some(r);
    None
}

/// The reason for a guest job that no node takes, from the most hopeful refusal.
fn explain(world: &World, job: &QueuedJob, best: Option<(Verdict, usize)>) -> Reason {
    let Some((verdict, n)) = best else {
        return no_fit(world, job);
    };
    let node = world.node_name(n);
    let rules = &world.nodes[n].node.lending;
    match verdict {
        Verdict::Busy
            if job.models.is_empty() && job.min_memory_mb == 0 && job.mig_profile.is_none() =>
        {
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
                crate::reason::hours(world.nodes[n].min_idle_s)
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
        Verdict::ReturnRisk => Reason::NotLent {
            detail: format!(
                "this job was taken back by an owner before, and the owner of node {node}, \
                 which fits, is likely to come back within its time limit"
            ),
        },
        Verdict::NotLent(block) => Reason::NotLent {
            detail: block.describe(&node, job, rules),
        },
        Verdict::NoHardware => no_fit(world, job),
    }
}

/// No node can ever take the job: too few matching GPUs anywhere, or the servers that
/// have the GPUs have fewer CPUs or less memory than it asks for, or give a job less
/// disk.
fn no_fit(world: &World, job: &QueuedJob) -> Reason {
    let holders: Vec<_> = world
        .nodes
        .iter()
        .filter(|nw| {
            nw.kinds
                .iter()
                .filter(|(g, _)| gpu_matches(job, g))
                .map(|(_, c)| c)
                .sum::<u32>()
                >= job.gpus
        })
        .collect();
    let gpus_somewhere = !holders.is_empty();
    if let Some(d) = job
        .needs_exports
        .iter()
        .find(|d| !holders.iter().any(|nw| nw.node.exports.contains(d)))
    {
        return Reason::NeedsDataset {
            dataset: d.clone(),
            exporters: world
                .nodes
                .iter()
                .filter(|nw| nw.node.exports.contains(d))
                .map(|nw| nw.node.name.clone())
                .collect(),
        };
    }
    let roomy: Vec<_> = holders
        .iter()
        .filter(|nw| nw.has_cpus_and_memory_for(job))
        .collect();
    if job.gpus > 0 && !roomy.is_empty() && roomy.iter().all(|nw| !nw.gives_disk_for(job)) {
        return Reason::NoNodeDisk {
            disk_gb: job.disk_gb,
            largest_gb: roomy
                .iter()
                .map(|nw| nw.node.max_job_disk_gb)
                .max()
                .unwrap_or(0),
        };
    }
    if gpus_somewhere && job.gpus > 0 {
        return Reason::NoNodeCapacity {
            detail: format!(
                "{} CPUs and {} GB of memory",
                job.cpus,
                job.memory_mb.div_ceil(1024)
            ),
        };
    }
    Reason::NoNodeFits {
        gpus: job.gpus,
        detail: describe_request(job),
    }
}
