//! The policies the simulator compares, and the baselines it implements itself.
//!
//! - `isolated`: each lab runs only on its own nodes, first come first served (FCFS).
//! - `share-fifo`: one campus-wide FCFS queue over every node, no owners, no preemption.
//! - `share-backfill`: one campus-wide queue, no owners, EASY backfill (the head job
//!   reserves its earliest start; later jobs start now only if they do not delay it),
//!   best fit (see [`crate::backfill`]).
//! - `share-fairshare`: `share-backfill` with the queue in Slurm-like fair-share order:
//!   labs with the least decayed usage against equal shares first.
//! - `commons`: the real policy, [`commons_sched::plan`], with the campus' checkpoints
//!   and the churn knobs of issue 16 (return-risk placement, victims over their fair
//!   share first, re-lending hysteresis, each node's owner take-back rate learned from
//!   the replay so far), and its stopped guests checkpoint within the grace period.
//! - `commons-old`: `commons` as it was before issue 16 (no churn knobs).
//! - `old+place`, `old+victims`, `old+hysteresis`, `old+patience`, `old+elsewhere`,
//!   `old+stopckpt`: `commons-old` with one knob each (`old+patience`: an owner job
//!   waits for its lab's own jobs that end within 10 minutes instead of preempting;
//!   `old+elsewhere`: an owner job that would preempt
//!   starts on safe free GPUs of another lab instead; `old+stopckpt`: every stopped
//!   guest checkpoints within its grace period, `checkpoint_on_stop`; `old+saves`:
//!   victims and grace periods use checkpoint write times, which matters only with the
//!   checkpoint model of [`crate::checkpoint`]), to measure each knob alone. Not in the
//!   default list.
//! - `commons-nockpt`: `commons` with checkpoints switched off (a stopped job restarts
//!   from scratch).
//! - `commons-boost`: `commons` with every lab's interactive boost on
//!   (`LabInfo::interactive_boost`): each lab's interactive jobs go ahead of its batch
//!   jobs. Not in the default list; add it to compare interactive waits.
//!
//! The baselines live here rather than in `sched` so that they stay exactly what they
//! are while `sched` grows. Their placement matches `sched`'s: all GPUs of a job on one
//! node, the node whose free GPUs fit it most tightly.

use std::fmt;

/// A policy to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    Isolated,
    ShareFifo,
    ShareBackfill,
    ShareFairshare,
    Commons,
    CommonsOld,
    OldPlace,
    OldVictims,
    OldHysteresis,
    OldStopCkpt,
    OldElsewhere,
    OldPatience,
    CommonsNoCkpt,
    CommonsBoost,
    OldSaves,
}

/// The churn knobs of `sched` (issue 16) a policy turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Knobs {
    /// `Policy::return_risk_placement`.
    pub place: bool,
    /// `Policy::victims_over_share_first`.
    pub victims: bool,
    /// `Policy::relend_delay_s` (on at its default, off at 0).
    pub hysteresis: bool,
    /// Every stopped job checkpoints within its grace period.
    pub stop_ckpt: bool,
    /// `Policy::owner_borrows_before_preempting`.
    pub elsewhere: bool,
    /// `Policy::owner_patience_s` (on at its default, off at 0).
    pub patience: bool,
    /// `Policy::victims_save_aware` and `Policy::grace_covers_checkpoint_s` (on at its
    /// default, off at 0): victims and grace periods that use checkpoint write times.
    pub saves: bool,
}

/// A policy name that does not exist.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown policy \"{0}\" (known: isolated, share-fifo, share-backfill, share-fairshare, commons, commons-old, old+place, old+victims, old+hysteresis, old+patience, old+elsewhere, old+stopckpt, old+saves, commons-nockpt, commons-boost)"
)]
pub struct UnknownPolicy(pub String);

impl PolicyKind {
    /// The policies a replay compares by default.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Isolated,
        PolicyKind::ShareFifo,
        PolicyKind::ShareBackfill,
        PolicyKind::ShareFairshare,
        PolicyKind::Commons,
        PolicyKind::CommonsOld,
        PolicyKind::CommonsNoCkpt,
    ];
    /// Every policy there is, the default ones first.
    pub const KNOWN: [PolicyKind; 15] = [
        PolicyKind::Isolated,
        PolicyKind::ShareFifo,
        PolicyKind::ShareBackfill,
        PolicyKind::ShareFairshare,
        PolicyKind::Commons,
        PolicyKind::CommonsOld,
        PolicyKind::CommonsNoCkpt,
        PolicyKind::OldPlace,
        PolicyKind::OldVictims,
        PolicyKind::OldHysteresis,
        PolicyKind::OldPatience,
        PolicyKind::OldElsewhere,
        PolicyKind::OldStopCkpt,
        PolicyKind::OldSaves,
        PolicyKind::CommonsBoost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Isolated => "isolated",
            PolicyKind::ShareFifo => "share-fifo",
            PolicyKind::ShareBackfill => "share-backfill",
            PolicyKind::ShareFairshare => "share-fairshare",
            PolicyKind::Commons => "commons",
            PolicyKind::CommonsOld => "commons-old",
            PolicyKind::OldPlace => "old+place",
            PolicyKind::OldVictims => "old+victims",
            PolicyKind::OldHysteresis => "old+hysteresis",
            PolicyKind::OldStopCkpt => "old+stopckpt",
            PolicyKind::OldElsewhere => "old+elsewhere",
            PolicyKind::OldPatience => "old+patience",
            PolicyKind::CommonsNoCkpt => "commons-nockpt",
            PolicyKind::CommonsBoost => "commons-boost",
            PolicyKind::OldSaves => "old+saves",
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
        !matches!(
            self,
            PolicyKind::Isolated
                | PolicyKind::ShareFifo
                | PolicyKind::ShareBackfill
                | PolicyKind::ShareFairshare
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

    /// The churn knobs of a `sched` policy (all off for the baselines).
    pub fn knobs(self) -> Knobs {
        let all = Knobs {
            place: true,
            victims: true,
            hysteresis: true,
            stop_ckpt: true,
            elsewhere: false,
            patience: false,
            saves: true,
        };
        match self {
            PolicyKind::Commons | PolicyKind::CommonsNoCkpt | PolicyKind::CommonsBoost => all,
            PolicyKind::OldPlace => Knobs {
                place: true,
                ..Knobs::default()
            },
            PolicyKind::OldVictims => Knobs {
                victims: true,
                ..Knobs::default()
            },
            PolicyKind::OldHysteresis => Knobs {
                hysteresis: true,
                ..Knobs::default()
            },
            PolicyKind::OldPatience => Knobs {
                patience: true,
                ..Knobs::default()
            },
            PolicyKind::OldElsewhere => Knobs {
                elsewhere: true,
                ..Knobs::default()
            },
            PolicyKind::OldStopCkpt => Knobs {
                stop_ckpt: true,
                ..Knobs::default()
            },
            PolicyKind::OldSaves => Knobs {
                saves: true,
                ..Knobs::default()
            },
            _ => Knobs::default(),
        }
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
        for p in PolicyKind::KNOWN {
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
