//! The policies the simulator compares, and the two baselines it implements itself.
//!
//! - `isolated`: each lab runs only on its own nodes, first come first served (FCFS).
//! - `share-fifo`: one campus-wide FCFS queue over every node, no owners, no preemption.
//! - `commons`: the real policy, [`commons_sched::plan`], with the campus' checkpoints.
//! - `commons-nockpt`: the same policy with checkpoints switched off (a stopped job
//!   restarts from scratch).
//! - `commons-boost`: `commons` with every lab's interactive boost on
//!   (`LabInfo::interactive_boost`): each lab's interactive jobs go ahead of its batch
//!   jobs. Not in the default list; add it to compare interactive waits.
//!
//! The baselines live here rather than in `sched` so that they stay exactly "strict
//! FCFS" while `sched` grows (backfill, fair share, ...). Their placement matches
//! `sched`'s: all GPUs of a job on one node, the node whose free GPUs fit it most tightly.

use std::fmt;

/// A policy to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    Isolated,
    ShareFifo,
    Commons,
    CommonsNoCkpt,
    CommonsBoost,
}

/// A policy name that does not exist.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown policy \"{0}\" (known: isolated, share-fifo, commons, commons-nockpt, commons-boost)"
)]
pub struct UnknownPolicy(pub String);

impl PolicyKind {
    /// The policies a replay compares by default.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Isolated,
        PolicyKind::ShareFifo,
        PolicyKind::Commons,
        PolicyKind::CommonsNoCkpt,
    ];
    /// Every policy there is, the default ones first.
    pub const KNOWN: [PolicyKind; 5] = [
        PolicyKind::Isolated,
        PolicyKind::ShareFifo,
        PolicyKind::Commons,
        PolicyKind::CommonsNoCkpt,
        PolicyKind::CommonsBoost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Isolated => "isolated",
            PolicyKind::ShareFifo => "share-fifo",
            PolicyKind::Commons => "commons",
            PolicyKind::CommonsNoCkpt => "commons-nockpt",
            PolicyKind::CommonsBoost => "commons-boost",
        }
    }

    /// Parse a comma-separated list, keeping the given order and dropping repeats.
    pub fn parse_list(text: &str) -> Result<Vec<PolicyKind>, UnknownPolicy> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let p = part.parse()?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err(UnknownPolicy(text.to_string()));
        }
        Ok(out)
    }

    /// Whether the policy calls the real scheduler.
    pub fn uses_sched(self) -> bool {
        matches!(
            self,
            PolicyKind::Commons | PolicyKind::CommonsNoCkpt | PolicyKind::CommonsBoost
        )
    }

    /// Whether every lab's interactive jobs go ahead of its batch jobs.
    pub fn boosts_interactive(self) -> bool {
        self == PolicyKind::CommonsBoost
    }

    /// Whether jobs keep checkpoints under this policy.
    pub fn checkpoints(self) -> bool {
        self != PolicyKind::CommonsNoCkpt
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::KNOWN
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Strict first-come-first-served placement over a pool of nodes.
///
/// 1. Walk `queue` (job, GPUs) in the order given (the caller passes submission order).
/// 2. A job wider than every node of the pool can never run here: skip it (it does not
///    block the queue).
/// 3. Otherwise place it on the up node with the fewest free GPUs that still fit it
///    (ties: lowest node index). If none fits now, stop: later jobs may not overtake.
///
/// `free[i]` is the number of free GPUs of `pool[i]`, `size[i]` its GPU count, `up[i]`
/// whether it takes new jobs. Returns `(job, index into pool)` for every job to start.
pub fn fcfs(
    queue: impl IntoIterator<Item = (usize, u32)>,
    free: &[u32],
    size: &[u32],
    up: &[bool],
) -> Vec<(usize, usize)> {
    let widest = size.iter().copied().max().unwrap_or(0);
    let mut free = free.to_vec();
    let mut out = Vec::new();
    for (job, gpus) in queue {
        if gpus > widest {
            continue;
        }
        let best = (0..free.len())
            .filter(|&i| up[i] && free[i] >= gpus)
            .min_by_key(|&i| (free[i], i));
        match best {
            Some(i) => {
                free[i] -= gpus;
                out.push((job, i));
            }
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), p);
        }
        assert_eq!(
            PolicyKind::parse_list("commons, isolated,commons").unwrap(),
            vec![PolicyKind::Commons, PolicyKind::Isolated]
        );
        assert!(PolicyKind::parse_list("fifo").is_err());
        assert!(PolicyKind::parse_list("").is_err());
    }

    #[test]
    fn fcfs_is_strict_and_best_fit() {
        // Two nodes of 4 and 8 GPUs with 2 and 8 free.
        let starts = fcfs([(0, 2), (1, 8), (2, 1)], &[2, 8], &[4, 8], &[true, true]);
        assert_eq!(starts, vec![(0, 0), (1, 1)]);
        // The head does not fit now: nobody overtakes it.
        let starts = fcfs([(0, 4), (1, 1)], &[2, 3], &[4, 8], &[true, true]);
        assert!(starts.is_empty());
        // A job wider than every node is skipped, not blocking.
        let starts = fcfs([(0, 16), (1, 1)], &[2, 3], &[4, 8], &[true, true]);
        assert_eq!(starts, vec![(1, 0)]);
        // Down nodes take nothing.
        let starts = fcfs([(0, 1)], &[2, 3], &[4, 8], &[false, true]);
        assert_eq!(starts, vec![(0, 1)]);
    }
}
