//! Owner first: a lab's jobs on the lab's own nodes, before any guest is considered.
//!
//! Invariants:
//! - An owner job that fits one of its lab's schedulable nodes is placed there: on
//!   free GPUs if enough are free, else by preempting just enough guests (with the
//!   node's grace period, or a longer one that covers a guest's checkpoint write), else
//!   it waits for its lab's own jobs. Guests whose stop would lose much work are spared
//!   for a while first ([`crate::Policy::spare_costly_guests_gpu_hours`]); for the
//!   guests' sake an owner job is delayed by at most
//!   [`crate::Policy::owner_delay_share`] of its time limit.
//! - GPUs an owner job waits for are claimed: no guest is placed on them in this plan.
//!   A waiting owner job claims the free matching GPUs of every own node that could
//!   hold it, not just the one it names: which node frees first may change as jobs
//!   start, and a guest on any of them would change the owner's choice in the next
//!   round (the plan would not be a fixed point). A later job of the same lab may use
//!   a claimed free GPU only if it ends before the owner job is expected to start there
//!   (backfill inside the lab); GPUs of guests being preempted are claimed outright.
//! - Owner jobs are never preempted; guests started in this plan are never victims.
//! - Lending rules do not apply to a lab's own jobs; member quotas do.
//! - A GPU that carries only guests' shares is taken back as one a guest holds (all of
//!   them stop). The lab's share jobs are placed by `owner_share`.

use crate::model::Time;
use crate::placement::end_of;
use crate::placement::search;
use crate::quota::{lab_block, member_block};
use crate::reason::Reason;
use crate::risk::risk_class;
use crate::state::{gpu_matches, World};
use crate::Round;
use rustc_hash::FxHashMap;

mod offer;

pub(crate) use offer::owner_delay_cap;
use offer::{offer_class, spare_wait_s, Kind, Offer, OfferClass, Offers};

/// What the owner phase knows per shape before the first round: the lab's schedulable
/// nodes that could ever hold the shape (empty: not an owner job anywhere), and its
/// offer class.
pub(crate) struct OwnShapes {
    pub nodes: Vec<Vec<usize>>,
    /// Shapes that differ only in what an own node's offer does not read (time limit,
    /// lab, the take-back rule) share a class, and so share offers (see [`Offers`]).
    class: Vec<usize>,
}

impl OwnShapes {
    pub fn new(world: &World) -> Self {
        let mut nodes: Vec<Option<Vec<usize>>> = vec![None; world.shapes];
        let mut class = vec![0; world.shapes];
        let mut classes: FxHashMap<OfferClass, usize> = FxHashMap::default();
        for (j, meta) in world.meta.iter().enumerate() {
            if nodes[meta.shape].is_some() {
                continue;
            }
            let job = world.queue[j];
            nodes[meta.shape] = Some(
                world.labs[meta.lab]
                    .nodes
                    .iter()
                    .copied()
                    .filter(|&n| {
                        let nw = &world.nodes[n];
                        nw.node.schedulable
                            && nw.can_hold(job)
                            && (job.share.is_none() || nw.node.lending.share_gpus)
                    })
                    .collect(),
            );
            let next = classes.len();
            class[meta.shape] = *classes.entry(offer_class(job)).or_insert(next);
        }
        OwnShapes {
            nodes: nodes.into_iter().map(Option::unwrap_or_default).collect(),
            class,
        }
    }
}

/// An owner job that found nothing on its own nodes: every offer was to wait, with no
/// free GPU it could use. Kept per (lab, offer class) with the sum of its own nodes'
/// change counts (which only grow) and its end (`end_of`, `Time::MAX` without a limit).
struct Nothing {
    changes: u64,
    limit: Time,
    reason: usize,
    at: Time,
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
/// 3. Every own node that could hold the job ([`OwnShapes`]) makes an offer: start now (best fit wins:
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
    own: &OwnShapes,
    round: &mut Round,
) -> Vec<usize> {
    let mut phase = Phase {
        elsewhere: Vec::new(),
        offers: Offers::default(),
        hopeless: vec![None; world.shapes],
        found_nothing: FxHashMap::default(),
    };
    for &j in jobs {
        phase.place(world, j, own, round);
    }
    phase.elsewhere
}

/// What the owner phase carries from one job to the next (steps 4 and 5 of
/// [`place_owner_jobs`]).
struct Phase {
    /// Owner jobs that wait for their own nodes and may run elsewhere meanwhile.
    elsewhere: Vec<usize>,
    offers: Offers,
    /// Per shape: the reason its jobs wait, once one found nothing at all.
    hopeless: Vec<Option<usize>>,
    found_nothing: FxHashMap<(usize, usize), Nothing>,
}

impl Phase {
    /// Steps 2-5 of [`place_owner_jobs`] for queued job `j`.
    fn place(&mut self, world: &mut World, j: usize, own: &OwnShapes, round: &mut Round) {
        let shape = world.meta[j].shape;
        if world.meta[j].share {
            if crate::owner_share::place_owner_share(world, j, &own.nodes[shape], round) {
                self.elsewhere.push(j);
            }
            return;
        }
        let job = world.queue[j];
        if let Some(reason) = member_block(world, j) {
            round.wait(j, reason);
            return;
        }
        if let Some(r) = self.hopeless[shape] {
            round.pending.push((j, r));
            self.elsewhere.push(j);
            return;
        }
        let class = (world.meta[j].lab, own.class[shape]);
        let changes: u64 = own.nodes[shape]
            .iter()
            .map(|&n| u64::from(world.nodes[n].changes))
            .sum();
        let limit = end_of(world.now, job).unwrap_or(Time::MAX);
        if let Some(seen) = self
            .found_nothing
            .get(&class)
            .filter(|s| s.changes == changes && limit >= s.limit)
        {
            // The same offers as a job of this class that found nothing: its own nodes
            // have not changed since, and a later end cannot use more claimed GPUs.
            round.pending.push((j, seen.reason));
            if seen.at < Time::MAX {
                round.estimate(j, seen.at);
            }
            self.hopeless[shape] = Some(seen.reason);
            self.elsewhere.push(j);
            return;
        }
        let offers: Vec<&Offer> = self
            .offers
            .refresh(world, job, class, &own.nodes[shape])
            .iter()
            .flatten()
            .map(|k| &k.offer)
            .collect();
        let Some(chosen) = best_offer(world, &offers) else {
            return;
        };
        if let Kind::Start { gpus, .. } = &offers[chosen].kind {
            let (n, gpus) = (offers[chosen].node, gpus.clone());
            round.starts.push(world.start(j, n, gpus));
            round.started.push(j);
            return;
        }
        if matches!(offers[chosen].kind, Kind::Preempt { .. }) {
            if let Some((n, gpus)) = safe_elsewhere(world, j) {
                round.starts.push(world.start(j, n, gpus));
                round.started.push(j);
                return;
            }
        }
        // The job waits. It claims the free GPUs it could use on every own node, so that
        // no guest lands where it waits, whichever node frees first.
        let r = wait_on(world, j, offers[chosen], round, &mut self.elsewhere);
        if offers
            .iter()
            .all(|o| matches!(o.kind, Kind::Wait) && o.usable.is_empty())
        {
            self.hopeless[shape] = Some(r);
            let at = offers[chosen].at;
            self.found_nothing.insert(
                class,
                Nothing {
                    changes,
                    limit,
                    reason: r,
                    at,
                },
            );
        }
        claim_usable(world, &offers, chosen);
    }
}

/// A waiting owner job claims the usable free GPUs of every offer: until now on the
/// chosen node when it preempts there, else until its expected start on each node.
fn claim_usable(world: &mut World, offers: &[&Offer], chosen: usize) {
    for (i, o) in offers.iter().enumerate() {
        let until = if i == chosen && matches!(o.kind, Kind::Start { .. } | Kind::Preempt { .. }) {
            world.now
        } else {
            o.at
        };
        for &g in &o.usable {
            world.claim(g, until, false);
        }
    }
}

/// Start now (best fit), else preempt (cheapest), else wait (earliest); ties go to the
/// lowest node id (offers are in node order and comparisons are strict). With
/// patience, waiting for the lab's own jobs that free the GPUs soon beats preempting
/// (its key is negative, costs are not). Returns the index of the chosen offer.
fn best_offer(world: &World, offers: &[&Offer]) -> Option<usize> {
    let patient = world.now.saturating_add(world.policy.owner_patience_s);
    let mut best: Option<(u8, i64, usize)> = None;
    for (i, o) in offers.iter().enumerate() {
        let key = match &o.kind {
            Kind::Start { left, .. } => (0, i64::from(*left)),
            Kind::Preempt { cost, .. } => (1, *cost),
            Kind::Spare { .. } => (2, o.at),
            Kind::Wait if o.at <= patient && world.policy.owner_patience_s > 0 => {
                (1, o.at.saturating_sub(patient).saturating_sub(1))
            }
            Kind::Wait => (2, o.at),
        };
        if best.is_none_or(|b| key < (b.0, b.1)) {
            best = Some((key.0, key.1, i));
        }
    }
    best.map(|(_, _, i)| i)
}

/// Owner job `j` waits on offer `o`: for the guests it preempts there (told to stop
/// now, their GPUs claimed), or for its lab's own jobs (then it may run elsewhere
/// meanwhile: pushed to `elsewhere`). Returns the index of its reason.
fn wait_on(
    world: &mut World,
    j: usize,
    o: &Offer,
    round: &mut Round,
    elsewhere: &mut Vec<usize>,
) -> usize {
    let job = world.queue[j];
    let n = o.node;
    let name = world.node_name(n);
    let reason = if let Kind::Preempt { victims, .. } = &o.kind {
        for &r in victims {
            for g in world.running[r].gpus.clone() {
                if gpu_matches(job, world.gpus[g].gpu) {
                    world.claim(g, world.now, false);
                }
            }
            if !world.running[r].preempting {
                let why = format!("the owner lab of node {name} needs its GPUs back");
                let cap = owner_delay_cap(job, world.policy);
                round.preempts.push(world.preempt(r, why, cap));
            }
        }
        let grace_s = world.nodes[n].grace_s;
        Reason::WaitingForGuestsToLeave {
            node: name,
            grace_s,
        }
    } else if let Kind::Spare { cost } = o.kind {
        // Not elsewhere: as a guest there it could be taken back in turn (which, in
        // the simulator's suite, left labs worse off than alone).
        let until = job
            .submitted_at
            .saturating_add(spare_wait_s(job, world.policy));
        Reason::SparingGuests {
            node: name,
            lost_gpu_hours: (cost as f64 / 3600.0).round() as u64,
            wait_s: until.saturating_sub(world.now),
        }
    } else {
        elsewhere.push(j);
        Reason::WaitingForOwnJobs { node: name }
    };
    let r = round.wait(j, reason);
    if o.at < Time::MAX {
        round.estimate(j, o.at);
    }
    r
}
