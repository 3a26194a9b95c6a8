//! What one of a lab's own nodes offers an owner job: start now on free GPUs, preempt
//! just enough guests, spare costly guests for a while, or wait; and the offers kept
//! between jobs of one lab and offer class while their node does not change.

use crate::model::{QueuedJob, Time};
use crate::placement::end_of;
use crate::preemption::victims;
use crate::sharing::guest_shares_only;
use crate::state::{gpu_matches, World};
use rustc_hash::FxHashMap;

/// Everything of a job an offer reads besides its time limit: the GPUs it asks for,
/// their kind, and the CPUs and memory.
pub(super) type OfferClass<'a> = (u32, &'a [String], u64, Option<&'a str>, u64, u64);

pub(super) fn offer_class(job: &QueuedJob) -> OfferClass<'_> {
    (
        job.gpus,
        &job.models,
        job.min_memory_mb,
        job.mig_profile.as_deref(),
        job.cpus.to_bits(),
        job.memory_mb,
    )
}

/// Offers of one owner phase per (lab, offer class): one slot per own node (in
/// [`OwnShapes::nodes`] order), each with the node's change count when it was made. An
/// offer reads the job's time limit only where a free GPU is claimed (may the job use
/// it before the claim's owner starts?); offers without such a GPU are reused until the
/// node changes. Owner jobs of one lab mostly differ in time limit alone, so on a busy
/// campus most offers are reused.
#[derive(Default)]
pub(super) struct Offers {
    pub(super) kept: FxHashMap<(usize, usize), Vec<Option<Kept>>>,
    pub(super) scratch: Scratch,
}

pub(super) struct Kept {
    pub(super) changes: u32,
    pub(super) reusable: bool,
    pub(super) offer: Offer,
}

impl Offers {
    /// The offers of `nodes` (the own nodes of `job`'s shape) to `job`, made where the
    /// kept ones do not hold.
    pub(super) fn refresh(
        &mut self,
        world: &World,
        job: &QueuedJob,
        key: (usize, usize),
        nodes: &[usize],
    ) -> &[Option<Kept>] {
        let slots = self.kept.entry(key).or_default();
        slots.resize_with(nodes.len(), || None);
        for (slot, &n) in slots.iter_mut().zip(nodes) {
            let changes = world.nodes[n].changes;
            if slot
                .as_ref()
                .is_some_and(|k| k.reusable && k.changes == changes)
            {
                continue;
            }
            let (offer, reads_limit) = offer(world, job, n, &mut self.scratch);
            *slot = Some(Kept {
                changes,
                reusable: !reads_limit,
                offer,
            });
        }
        slots
    }
}

/// What one own node offers an owner job.
pub(super) struct Offer {
    pub(super) node: usize,
    /// Free matching GPUs the job may use (unclaimed, or claimed until after it ends).
    pub(super) usable: Vec<usize>,
    /// When the job could start here without preempting anyone (`Time::MAX`: unknown).
    pub(super) at: Time,
    pub(super) kind: Kind,
}

pub(super) enum Kind {
    /// Start now on these GPUs; `left` free GPUs remain on the node.
    Start { left: u32, gpus: Vec<usize> },
    /// Preempt these guests (running indices), losing `cost` GPU-seconds.
    Preempt { cost: i64, victims: Vec<usize> },
    /// Preempting would lose `cost` GPU-seconds, more than
    /// [`crate::Policy::spare_costly_guests_gpu_hours`]: wait until `at` instead.
    Spare { cost: i64 },
    /// Wait for running jobs to end.
    Wait,
}

/// Buffers `offer` reuses between calls (it runs for every own node of every owner job).
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) times: Vec<Time>,
    pub(super) own_times: Vec<Time>,
}

/// What node `n`'s GPUs hold for `job`, from [`scan`]: the free matching GPUs it may
/// use, how many matching GPUs guests hold, and whether a claim made it read the job's
/// time limit. `scratch.times` gets when each matching GPU could be the job's without
/// stopping anyone but guests, `scratch.own_times` without stopping anyone at all
/// (both sorted).
pub(super) struct Scan {
    pub(super) usable: Vec<usize>,
    pub(super) guest_held: usize,
    pub(super) reads_limit: bool,
}

pub(super) fn scan(world: &World, job: &QueuedJob, n: usize, scratch: &mut Scratch) -> Scan {
    let now = world.now;
    let ends = end_of(now, job);
    let nw = &world.nodes[n];
    let mut out = Scan {
        usable: Vec::new(),
        guest_held: 0,
        reads_limit: false,
    };
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
            None if gw.shared.is_some() => match guest_shares_only(world, g) {
                _ if gw.claim.is_some() => {}
                true => {
                    out.guest_held += 1;
                    times.push(now.saturating_add(i64::from(nw.grace_s)));
                }
                false => {
                    if let Some(end) = crate::placement::shares_end(world, g, nw.grace_s) {
                        times.push(end);
                        own_times.push(end);
                    }
                }
            },
            None => {
                out.reads_limit |= gw.claim.is_some();
                if gw.claim.is_none_or(|c| ends.is_some_and(|e| e <= c.until)) {
                    out.usable.push(g);
                    times.push(now);
                    own_times.push(now);
                }
            }
            Some(r) if gw.claim.is_none() => {
                let run = &world.running[r];
                if run.guest && !run.new {
                    out.guest_held += 1;
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
    out
}

/// Node `n`'s offer to `job`, and whether it read the job's time limit.
pub(super) fn offer(
    world: &World,
    job: &QueuedJob,
    n: usize,
    scratch: &mut Scratch,
) -> (Offer, bool) {
    let now = world.now;
    let want = job.gpus as usize;
    let nw = &world.nodes[n];
    let Scan {
        usable,
        guest_held,
        reads_limit,
    } = scan(world, job, n, scratch);
    let mut at = scratch.times.get(want - 1).copied().unwrap_or(Time::MAX);
    let own_at = scratch
        .own_times
        .get(want - 1)
        .copied()
        .unwrap_or(Time::MAX);
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
            Some((victims, cost)) => match spare_until(world, job, cost) {
                Some(until) => {
                    at = own_at.min(until);
                    Kind::Spare { cost }
                }
                None => Kind::Preempt { cost, victims },
            },
            None => Kind::Wait,
        }
    } else {
        Kind::Wait
    };
    // Sparing reads the job's submission: such an offer is never shared.
    let reads_limit = reads_limit || matches!(kind, Kind::Spare { .. });
    let offer = Offer {
        node: n,
        usable,
        at,
        kind,
    };
    (offer, reads_limit)
}

/// Until when an owner job spares guests whose stop would lose `cost` GPU-seconds
/// ([`crate::Policy::spare_costly_guests_gpu_hours`]); `None`: it stops them now.
pub(super) fn spare_until(world: &World, job: &QueuedJob, cost: i64) -> Option<Time> {
    let p = world.policy;
    let limit = p.spare_costly_guests_gpu_hours;
    if limit.is_nan() || limit <= 0.0 || (cost as f64) <= limit * 3600.0 {
        return None;
    }
    let until = job.submitted_at.saturating_add(spare_wait_s(job, p));
    (world.now < until).then_some(until)
}

/// The most seconds an owner job's delay for guests' sake may add
/// ([`crate::Policy::owner_delay_share`] of its time limit; `None` without one).
pub(crate) fn owner_delay_cap(job: &QueuedJob, p: &crate::Policy) -> Option<u32> {
    let share = p.owner_delay_share;
    (job.time_limit_s > 0 && share.is_finite() && share >= 0.0).then(|| {
        let s = (job.time_limit_s as f64 * share).min(f64::from(u32::MAX));
        s as u32
    })
}

/// How long after its submission an owner job spares costly guests at most.
pub(super) fn spare_wait_s(job: &QueuedJob, p: &crate::Policy) -> i64 {
    match owner_delay_cap(job, p) {
        Some(cap) => p.spare_costly_guests_s.min(i64::from(cap)),
        None => p.spare_costly_guests_s,
    }
}
