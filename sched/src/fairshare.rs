//! Fair share among guests: which waiting job gets the next chance.
//!
//! A lab's standing is its usage per share: `(decayed usage + charge x GPUs it
//! borrows now) / (base share + decayed contribution)`, lowest first. Inside a lab the
//! member with the lowest `decayed usage + charge x GPUs held` goes first, and a
//! member's own jobs go first come, first served. A lab that boosts interactive jobs
//! ([`crate::LabInfo::interactive_boost`]) has its members' interactive jobs go first:
//! a member whose next job is boosted goes before every member whose next job is not.
//!
//! Invariants:
//! - Keys are recomputed as jobs start, so one plan spreads free GPUs over labs of
//!   equal standing instead of handing them all to one.
//! - Ties break by lab id, then user id, then (submitted_at, job id): the order is total
//!   and deterministic.
//! - A lab without GPUs has the base share, so its key stays finite and it is never
//!   starved by lending labs.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::model::Time;
use crate::state::World;

/// `value` decayed from `from` to `to` with the half-life `half_life_s` (no decay if the
/// half-life is not positive). The portal uses it to keep its ledgers in the same
/// units: `ledger = decay(ledger, ledger_at, now, h) + gpu_hours_since`.
pub fn decay(value: f64, from: Time, to: Time, half_life_s: i64) -> f64 {
    if half_life_s <= 0 || to <= from {
        return value;
    }
    value * 0.5f64.powf(to.saturating_sub(from) as f64 / half_life_s as f64)
}

/// A member's standing inside a lab (by member slot): decayed usage plus the charge
/// for GPUs held now.
pub(crate) fn member_key(world: &World, member: usize) -> f64 {
    world.members[member].usage
        + world.policy.running_charge_gpu_hours * world.member_use[member].gpus()
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
    usage: f64,
    /// Range of the member's jobs in `FairQueue::jobs`, first come first.
    next: usize,
    end: usize,
}

struct LabQ {
    usage: f64,
    share: f64,
    users: Vec<UserQ>,
    /// Members by (tier of their next job, usage, slot).
    heap: BinaryHeap<Reverse<(u8, Key, usize)>>,
}

impl LabQ {
    fn key(&self) -> Key {
        Key(self.usage / self.share)
    }
}

/// The queue of waiting guests in fair-share order.
pub(crate) struct FairQueue {
    jobs: Vec<usize>,
    /// Tier of each queued job, by queue index.
    tiers: Vec<u8>,
    labs: Vec<LabQ>,
    heap: BinaryHeap<Reverse<(Key, usize)>>,
    charge: f64,
}

/// Which lab and member a popped job came from, to charge it if it starts.
pub(crate) struct Ticket {
    lab: usize,
    user: usize,
}

impl FairQueue {
    /// Build the queue over `jobs` (queue indices), which must be sorted by (lab slot,
    /// member slot, tier, submitted_at, id); slots are in id order, so heap ties between
    /// equal keys break by lab id and user id.
    pub fn new(world: &World, jobs: Vec<usize>) -> Self {
        let charge = world.policy.running_charge_gpu_hours;
        let meta = &world.meta;
        let mut labs: Vec<LabQ> = Vec::new();
        let mut next = 0;
        // `chunk_by` yields non-empty runs, so `[0]` is always there.
        for lab_jobs in jobs.chunk_by(|&a, &b| meta[a].lab == meta[b].lab) {
            let l = meta[lab_jobs[0]].lab;
            let mut users = Vec::new();
            for user_jobs in lab_jobs.chunk_by(|&a, &b| meta[a].member == meta[b].member) {
                users.push(UserQ {
                    usage: member_key(world, meta[user_jobs[0]].member),
                    next,
                    end: next + user_jobs.len(),
                });
                next += user_jobs.len();
            }
            labs.push(LabQ {
                usage: world.labs[l].usage + charge * world.lab_use[l].gpus(),
                share: world.labs[l].share,
                users,
                heap: BinaryHeap::new(),
            });
        }
        for lab in &mut labs {
            lab.heap = lab
                .users
                .iter()
                .enumerate()
                .map(|(u, q)| Reverse((meta[jobs[q.next]].tier, Key(q.usage), u)))
                .collect();
        }
        let heap = labs
            .iter()
            .enumerate()
            .map(|(i, l)| Reverse((l.key(), i)))
            .collect();
        FairQueue {
            tiers: meta.iter().map(|m| m.tier).collect(),
            jobs,
            labs,
            heap,
            charge,
        }
    }

    /// The next job to consider, or `None` when every job had its turn. Call
    /// [`FairQueue::done`] with the ticket before the next `pop`.
    pub fn pop(&mut self) -> Option<(usize, Ticket)> {
        let Reverse((_, l)) = self.heap.pop()?;
        let lab = &mut self.labs[l];
        let Reverse((_, _, u)) = lab.heap.pop()?;
        let user = &mut lab.users[u];
        let job = self.jobs[user.next];
        user.next += 1;
        Some((job, Ticket { lab: l, user: u }))
    }

    /// Put the lab and member back, charged for `started_gpus` (0 if the job waits; a
    /// share counts as its fraction).
    pub fn done(&mut self, ticket: Ticket, started_gpus: f64) {
        let add = self.charge * started_gpus;
        let lab = &mut self.labs[ticket.lab];
        lab.usage += add;
        let user = &mut lab.users[ticket.user];
        user.usage += add;
        if user.next < user.end {
            let tier = self.tiers[self.jobs[user.next]];
            lab.heap.push(Reverse((tier, Key(user.usage), ticket.user)));
        }
        if !lab.heap.is_empty() {
            self.heap.push(Reverse((lab.key(), ticket.lab)));
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
