//! Fair share among guests: which waiting job gets the next chance.
//!
//! A lab's standing is its usage per share: `(decayed usage + charge x GPUs it
//! borrows now) / (base share + decayed contribution)`, lowest first. Inside a lab the
//! member with the lowest `decayed usage + charge x GPUs held` goes first, and a
//! member's own jobs go first come, first served.
//!
//! Invariants:
//! - Keys are recomputed as jobs start, so one plan spreads free GPUs over labs of
//!   equal standing instead of handing them all to one.
//! - Ties break by lab id, then user id, then (submitted_at, job id): the order is total
//!   and deterministic.
//! - A lab without GPUs has the base share, so its key stays finite and it is never
//!   starved by lending labs.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};

use crate::model::{LabId, QueuedJob, Time, UserId};
use crate::state::World;

/// `value` decayed from `from` to `to` with the half-life `half_life_s` (no decay if the
/// half-life is not positive). The portal uses it to keep its ledgers in the same
/// units: `ledger = decay(ledger, ledger_at, now, h) + gpu_hours_since`.
pub fn decay(value: f64, from: Time, to: Time, half_life_s: i64) -> f64 {
    if half_life_s <= 0 || to <= from {
        return value;
    }
    value * 0.5f64.powf((to - from) as f64 / half_life_s as f64)
}

/// A member's standing inside a lab: decayed usage plus the charge for GPUs held now.
pub(crate) fn member_key(world: &World, lab: LabId, user: UserId) -> f64 {
    let p = world.policy;
    let used = world.members.get(&(lab, user)).map_or(0.0, |m| {
        decay(m.used_gpu_hours, m.ledger_at, world.now, p.half_life_s)
    });
    let held = world.member_use.get(&(lab, user)).map_or(0, |u| u.gpus);
    used.max(0.0) + p.running_charge_gpu_hours * f64::from(held)
}

/// An `f64` with a total order, for heap keys.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key(f64);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

struct UserQ {
    user: UserId,
    usage: f64,
    jobs: Vec<usize>,
    next: usize,
}

struct LabQ {
    lab: LabId,
    usage: f64,
    share: f64,
    users: Vec<UserQ>,
    heap: BinaryHeap<Reverse<(Key, UserId, usize)>>,
}

impl LabQ {
    fn key(&self) -> Key {
        Key(self.usage / self.share)
    }
}

/// The queue of waiting guests in fair-share order.
pub(crate) struct FairQueue {
    labs: Vec<LabQ>,
    heap: BinaryHeap<Reverse<(Key, LabId, usize)>>,
    charge: f64,
}

/// Which lab and member a popped job came from, to charge it if it starts.
pub(crate) struct Ticket {
    lab: usize,
    user: usize,
}

impl FairQueue {
    /// Build the queue over `jobs` (indices into `queue`).
    pub fn new(world: &World, queue: &[&QueuedJob], jobs: &[usize]) -> Self {
        let p = world.policy;
        let now = world.now;
        let charge = p.running_charge_gpu_hours;
        let mut by_lab: BTreeMap<LabId, BTreeMap<UserId, Vec<usize>>> = BTreeMap::new();
        for &j in jobs {
            let job = queue[j];
            by_lab.entry(job.lab).or_default().entry(job.user).or_default().push(j);
        }
        let mut labs = Vec::with_capacity(by_lab.len());
        for (lab, users) in by_lab {
            let info = world.labs.get(&lab);
            let held = world.lab_use.get(&lab).map_or(0, |u| u.gpus);
            let (used, lent) = info.map_or((0.0, 0.0), |i| {
                (
                    decay(i.used_gpu_hours, i.ledger_at, now, p.half_life_s),
                    decay(i.lent_gpu_hours, i.ledger_at, now, p.half_life_s),
                )
            });
            let base = info
                .and_then(|i| i.base_share_gpu_hours)
                .unwrap_or(p.base_share_gpu_hours);
            let mut lq = LabQ {
                lab,
                usage: used.max(0.0) + charge * f64::from(held),
                share: (base + lent.max(0.0)).max(1e-9),
                users: Vec::with_capacity(users.len()),
                heap: BinaryHeap::new(),
            };
            for (user, mut js) in users {
                js.sort_by_key(|&j| (queue[j].submitted_at, queue[j].id));
                let uq = UserQ {
                    user,
                    usage: member_key(world, lab, user),
                    jobs: js,
                    next: 0,
                };
                lq.heap.push(Reverse((Key(uq.usage), user, lq.users.len())));
                lq.users.push(uq);
            }
            labs.push(lq);
        }
        let heap = labs
            .iter()
            .enumerate()
            .map(|(i, l)| Reverse((l.key(), l.lab, i)))
            .collect();
        FairQueue { labs, heap, charge }
    }

    /// The next job to consider, or `None` when every job had its turn. Call
    /// [`FairQueue::done`] with the ticket before the next `pop`.
    pub fn pop(&mut self) -> Option<(usize, Ticket)> {
        let Reverse((_, _, l)) = self.heap.pop()?;
        let lab = &mut self.labs[l];
        let Reverse((_, _, u)) = lab.heap.pop()?;
        let user = &mut lab.users[u];
        let job = user.jobs[user.next];
        user.next += 1;
        Some((job, Ticket { lab: l, user: u }))
    }

    /// Put the lab and member back, charged for `started_gpus` (0 if the job waits).
    pub fn done(&mut self, ticket: Ticket, started_gpus: u32) {
        let add = self.charge * f64::from(started_gpus);
        let lab = &mut self.labs[ticket.lab];
        lab.usage += add;
        let user = &mut lab.users[ticket.user];
        user.usage += add;
        if user.next < user.jobs.len() {
            lab.heap.push(Reverse((Key(user.usage), user.user, ticket.user)));
        }
        if !lab.heap.is_empty() {
            self.heap.push(Reverse((lab.key(), lab.lab, ticket.lab)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_halves_per_half_life() {
        assert_eq!(decay(100.0, 0, 3600, 3600), 50.0);
        assert_eq!(decay(100.0, 0, 7200, 3600), 25.0);
        assert_eq!(decay(100.0, 10, 5, 3600), 100.0);
        assert_eq!(decay(100.0, 0, 7200, 0), 100.0);
    }
}
