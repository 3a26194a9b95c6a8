//! Placement of guest jobs: which GPUs of which node, best fit first, and the
//! reservations that let big jobs start while small ones backfill.
//!
//! Invariants:
//! - Gang placement: all GPUs of a job are on one node.
//! - A GPU is used only if it matches the request (model, memory, MIG profile), is
//!   free (no holder and no share on it), not in local use, not claimed by a waiting owner job, idle long enough for
//!   the node's lending rules, and either unreserved or the job ends before the
//!   reservation starts.
//! - Best fit: the node left with the fewest free GPUs wins (ties: lowest node id);
//!   inside a node the smallest matching GPUs go first, unreserved before reserved.
//! - Each GPU carries at most one reservation (the first, highest-priority one).

use crate::lending::{guest_block, LendBlock};
use crate::model::{JobId, QueuedJob, Time};
use crate::risk::{risk_class, too_risky_after_take_back};
use crate::state::{gpu_matches, Reservation, World};

/// Why a node does not take a job now, most hopeful first (the order of the variants
/// is the order in which reasons are preferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verdict {
    /// Matching GPUs are held by running jobs.
    Busy,
    /// Free GPUs are reserved for an earlier job and this one would not end in time.
    Behind(JobId),
    /// Free GPUs are claimed by the owner lab's waiting job.
    OwnerClaimed,
    /// Free GPUs have not been idle long enough to be lent.
    IdleWait,
    /// The node already lends as many GPUs as its rules allow.
    LendLimit,
    /// The node is offline or draining.
    Offline,
    /// The job was taken back before and its owner is likely to come back here
    /// ([`crate::Policy::taken_back_max_risk`]); not transient, so no reservation.
    ReturnRisk,
    /// The node's lending rules exclude this job.
    NotLent(LendBlock),
    /// The node can never hold the job (GPU count, model, memory, MIG profile), or it
    /// is the job's own lab's node (placed by the owner phase, not here).
    NoHardware,
}

impl Verdict {
    /// Whether the job could start here once running jobs end (so it may reserve).
    pub fn transient(self) -> bool {
        self <= Verdict::LendLimit
    }
}

/// Try one node for a guest job: the GPUs it would get, or why not.
pub(crate) fn guest_fit(world: &World, job: &QueuedJob, n: usize) -> Result<Vec<usize>, Verdict> {
    let nw = &world.nodes[n];
    let node = nw.node;
    if node.lab == job.lab {
        return Err(if node.schedulable {
            Verdict::NoHardware
        } else {
            Verdict::Offline
        });
    }
    let want = job.gpus as usize;
    if !nw.can_hold(job) {
        return Err(Verdict::NoHardware);
    }
    if !node.schedulable {
        return Err(Verdict::Offline);
    }
    if let Some(block) = guest_block(node, nw.lend_until, job, world.now) {
        return Err(Verdict::NotLent(block));
    }
    if too_risky_after_take_back(
        nw.returns.as_ref(),
        job,
        world.now,
        world.policy,
        world.pressure,
    ) {
        return Err(Verdict::ReturnRisk);
    }
    if let Some(max) = node.lending.max_lent_gpus {
        if nw.guest_gpus.saturating_add(job.gpus) > max {
            return Err(Verdict::LendLimit);
        }
    }
    if (nw.free as usize) < want || !nw.capacity_free_for(job) {
        return Err(Verdict::Busy);
    }
    let ends = end_of(world.now, job);
    let idle_before = world.now.saturating_sub(nw.min_idle_s);
    let (mut usable, mut behind, mut claimed, mut idle) = (Vec::new(), 0, 0, 0);
    let mut behind_job = None;
    for g in nw.gpus.clone() {
        let gw = &world.gpus[g];
        if !gw.is_empty() || gw.gpu.local_use || !gpu_matches(job, gw.gpu) {
            continue;
        }
        if gw.claim.is_some() {
            claimed += 1;
        } else if gw.gpu.idle_since > idle_before {
            idle += 1;
        } else if gw.reserved.is_some_and(|r| ends.is_none_or(|e| e > r.at)) {
            behind += 1;
            behind_job = behind_job.or(gw.reserved.map(|r| r.job));
        } else {
            usable.push(g);
        }
    }
    if usable.len() >= want {
        usable.sort_by_key(|&g| {
            let gw = &world.gpus[g];
            (gw.reserved.is_some(), gw.gpu.memory_mb, gw.gpu.id)
        });
        usable.truncate(want);
        return Ok(usable);
    }
    let have = usable.len() + behind;
    Err(match behind_job {
        Some(j) if have >= want => Verdict::Behind(j),
        _ if have + claimed >= want => Verdict::OwnerClaimed,
        _ if have + claimed + idle >= want => Verdict::IdleWait,
        _ => Verdict::Busy,
    })
}

/// When the last share on GPU `g` is expected to end, if all their ends are known.
pub(crate) fn shares_end(world: &World, g: usize, grace_s: u32) -> Option<Time> {
    world.gpus[g].shares().iter().try_fold(world.now, |at, &r| {
        Some(at.max(world.running[r].expected_end(world.now, grace_s)?))
    })
}

/// When a job starting now would end, if its time limit is known.
pub(crate) fn end_of(now: Time, job: &QueuedJob) -> Option<Time> {
    (job.time_limit_s > 0).then(|| now.saturating_add(job.time_limit_s))
}

/// The outcome of looking at every node for a guest job.
pub(crate) struct Search {
    /// Best-fit node and GPUs, if the job can start now.
    pub fit: Option<(usize, Vec<usize>)>,
    /// The most hopeful verdict among the nodes that refused, with the node.
    pub best: Option<(Verdict, usize)>,
}

/// How a fitting node ranks for a guest, lowest first: (return-risk class, datasets it
/// would fetch, free GPUs it keeps).
type Score = (u32, u32, u32);

/// Look at every node for a guest job.
///
/// 1. With `full` false the caller only wants a fit: nodes with fewer free GPUs than
///    asked are skipped. With `full` true the caller wants a reason.
/// 2. Every node that fits is scored by how often its owner is expected to take it
///    back within the job's time limit, in classes of
///    [`crate::Policy::return_risk_step`] ([`risk_class`], 0 when the policy or the
///    node has no return rates), then by how many of the job's datasets it would
///    have to fetch, then by the free GPUs it keeps; the lowest wins.
/// 3. Refusals keep the most hopeful verdict, for the job's reason; a `Busy` node is as
///    hopeful as it gets, so a full search that finds no fit stops there.
pub(crate) fn search(world: &World, job: &QueuedJob, full: bool) -> Search {
    let mut fit: Option<(Score, usize, Vec<usize>)> = None;
    let mut best: Option<(Verdict, usize)> = None;
    for n in 0..world.nodes.len() {
        if !full && world.nodes[n].free < job.gpus {
            continue;
        }
        match guest_fit(world, job, n) {
            Ok(gpus) => {
                let nw = &world.nodes[n];
                let (class, uncached) = guest_class(world, n, job);
                let left = (class, uncached, nw.free - job.gpus);
                if fit.as_ref().is_none_or(|(l, _, _)| left < *l) {
                    fit = Some((left, n, gpus));
                }
            }
            Err(v) => {
                if best.is_none_or(|(b, _)| v < b) {
                    best = Some((v, n));
                    if v == Verdict::Busy && fit.is_none() && full {
                        break;
                    }
                }
            }
        }
    }
    Search {
        fit: fit.map(|(_, n, g)| (n, g)),
        best,
    }
}

/// Reserve GPUs for the earliest start of a guest job that waits for busy GPUs.
///
/// 1. On every node the job may use, each matching GPU gets the time it is expected
///    free: now for a free one (or when it has been idle long enough), the end of the
///    holder's time limit (now + grace if it is being preempted), or of the last of its
///    shares' time limits; GPUs that are claimed,
///    already reserved, in local use or held without a known end never count.
/// 2. The node's earliest start is when its `gpus`-th GPU comes free; the earliest node
///    wins (ties: lowest id).
/// 3. Those GPUs are reserved from that start; returns the start, if anything was
///    reserved.
pub(crate) fn reserve(world: &mut World, job: &QueuedJob) -> Option<Time> {
    let want = job.gpus as usize;
    let now = world.now;
    let mut best: Option<(Time, usize, Vec<usize>)> = None;
    let mut times: Vec<(Time, usize)> = Vec::new();
    for n in 0..world.nodes.len() {
        let v = guest_fit(world, job, n);
        if matches!(v, Err(v) if !v.transient()) {
            continue;
        }
        let nw = &world.nodes[n];
        let idle_min = nw.min_idle_s;
        times.clear();
        for g in nw.gpus.clone() {
            let gw = &world.gpus[g];
            if gw.gpu.local_use || gw.claim.is_some() || gw.reserved.is_some() {
                continue;
            }
            if !gpu_matches(job, gw.gpu) {
                continue;
            }
            let at = match gw.holder {
                None if gw.shared.is_none() => {
                    Some(now.max(gw.gpu.idle_since.saturating_add(idle_min)))
                }
                None => shares_end(world, g, nw.grace_s),
                Some(r) => world.running[r].expected_end(now, nw.grace_s),
            };
            if let Some(at) = at {
                times.push((at, g));
            }
        }
        if times.len() < want {
            continue;
        }
        times.sort_unstable();
        let at = times[want - 1].0;
        if best.as_ref().is_none_or(|(b, _, _)| at < *b) {
            best = Some((at, n, times[..want].iter().map(|&(_, g)| g).collect()));
        }
    }
    let (at, _, gpus) = best?;
    for g in gpus {
        world.gpus[g].reserved = Some(Reservation { at, job: job.id });
    }
    Some(at)
}

/// How a guest ranks node `n`: its owner's return-risk class for the job's time limit
/// (lower first), then how many of the job's datasets it would fetch.
pub(crate) fn guest_class(world: &World, n: usize, job: &QueuedJob) -> (u32, u32) {
    let nw = &world.nodes[n];
    let risk = risk_class(
        nw.returns.as_ref(),
        world.now,
        job.time_limit_s,
        world.policy,
    );
    (
        risk / world.policy.return_risk_step_tenths(),
        nw.uncached(job) as u32,
    )
}
