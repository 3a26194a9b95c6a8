//! Quotas: a plan never starts a job that would take a lab or a member over a limit.
//!
//! Invariants:
//! - Member quotas (set by lab admins) count all of a member's jobs charged to the lab,
//!   on any node. Lab quotas (set by operators) count only what the lab borrows: its
//!   jobs on other labs' nodes. A lab is never limited on its own servers.
//! - GPU-hours are checked against the period's usage, plus what running jobs may still
//!   use under their time limits, plus the new job's GPUs x time limit; so a job that
//!   starts can never push the period over its limit.
//! - A snapshot that is already over a limit starts nothing more under that limit.
//! - A share counts as its fraction of a GPU: `max_gpus` compares the sum of fractions
//!   (held and asked), and its GPU-hours are its fraction x hours. A share that names
//!   only memory is checked as 0.05 of a GPU before it is placed and again with the
//!   fraction it resolves to on its GPU ([`blocks_with`]).

use crate::model::{QueuedJob, Quota};
use crate::reason::{QuotaScope, Reason};
use crate::state::{Use, World};

/// Slack for float sums of GPU-hours, so a job that uses exactly the rest fits.
const EPS: f64 = 1e-6;

/// What a quota check needs of a job, copied so that the hot loops do not chase the
/// job's pointer (a cache miss per check on a large queue).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    /// GPUs asked for, in milli-GPU (a share: its compute, at least 0.05 of a GPU).
    pub milli: u64,
    pub time_limit_s: i64,
    /// Bytes its start fetches (for its start estimate).
    pub stage_bytes: u64,
}

impl Ask {
    pub fn of(job: &QueuedJob) -> Self {
        let milli = match job.share {
            Some(s) => u64::from(s.milli.max(crate::share::STEP_MILLI)),
            None => u64::from(job.gpus) * 1000,
        };
        Ask {
            milli,
            time_limit_s: job.time_limit_s,
            stage_bytes: job.stage_bytes,
        }
    }
}

fn check(quota: &Quota, scope: QuotaScope, usage: Use, period: f64, job: Ask) -> Option<Reason> {
    if let Some(limit_s) = quota.max_time_limit_s {
        if job.time_limit_s <= 0 || job.time_limit_s > limit_s {
            return Some(Reason::QuotaTimeLimit { scope, limit_s });
        }
    }
    if let Some(limit) = quota.max_gpus {
        if usage.milli.saturating_add(job.milli) > u64::from(limit) * 1000 {
            // Shares held count up: "4 of 4 in use" for 3.5 held and one GPU asked.
            let used = u32::try_from(usage.milli.div_ceil(1000)).unwrap_or(u32::MAX);
            return Some(Reason::QuotaGpus { scope, used, limit });
        }
    }
    if let Some(limit) = quota.max_gpu_hours {
        if job.time_limit_s <= 0 {
            return Some(Reason::QuotaNeedsTimeLimit { scope });
        }
        let used = period + usage.committed_gpu_hours;
        let needs = job_gpu_hours(job);
        if used + needs > limit + EPS {
            return Some(Reason::QuotaGpuHours {
                scope,
                used: used.max(0.0).round() as u64,
                limit: limit.max(0.0).round() as u64,
                needs: needs.ceil() as u64,
            });
        }
    }
    None
}

/// GPU-hours a job may use under its time limit.
fn job_gpu_hours(job: Ask) -> f64 {
    job.milli as f64 / 1000.0 * job.time_limit_s.max(0) as f64 / 3600.0
}

/// Why a quota stops queued job `j` once its share resolved to `milli` on a GPU
/// (the member's quota, and the lab's when it runs as a guest).
pub(crate) fn blocks_with(world: &World, j: usize, milli: u64, guest: bool) -> Option<Reason> {
    let ask = Ask {
        milli,
        ..world.meta[j].ask
    };
    let m = world.meta[j].member;
    let member = world.members[m].info.and_then(|info| {
        let usage = world.member_use[m];
        check(
            &info.quota,
            QuotaScope::Member,
            usage,
            info.period_gpu_hours,
            ask,
        )
    });
    let l = world.meta[j].lab;
    member.or_else(|| {
        let info = world.labs[l].info.filter(|_| guest)?;
        let usage = world.lab_use[l];
        check(
            &info.quota,
            QuotaScope::Lab,
            usage,
            info.period_gpu_hours,
            ask,
        )
    })
}

/// Why the member's quota in the lab stops queued job `j`, if it does.
pub(crate) fn member_block(world: &World, j: usize) -> Option<Reason> {
    let m = world.meta[j].member;
    let info = world.members[m].info?;
    let usage = world.member_use[m];
    check(
        &info.quota,
        QuotaScope::Member,
        usage,
        info.period_gpu_hours,
        world.meta[j].ask,
    )
}

/// Why the lab's borrowing quota stops queued job `j` from running as a guest.
pub(crate) fn lab_block(world: &World, j: usize) -> Option<Reason> {
    let l = world.meta[j].lab;
    let info = world.labs[l].info?;
    let usage = world.lab_use[l];
    check(
        &info.quota,
        QuotaScope::Lab,
        usage,
        info.period_gpu_hours,
        world.meta[j].ask,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(gpus: u32, hours: i64) -> QueuedJob {
        QueuedJob {
            gpus,
            time_limit_s: hours * 3600,
            ..Default::default()
        }
    }

    #[test]
    fn quota_table() {
        let q = Quota {
            max_gpus: Some(4),
            max_gpu_hours: Some(100.0),
            max_time_limit_s: Some(24 * 3600),
        };
        let held = |gpus: u64, committed| Use {
            milli: gpus * 1000,
            committed_gpu_hours: committed,
        };
        let lab = QuotaScope::Lab;
        let cases: Vec<(&str, Use, f64, QueuedJob, Option<Reason>)> = vec![
            ("fits", held(2, 10.0), 10.0, job(2, 10), None),
            (
                "gpus full",
                held(4, 0.0),
                0.0,
                job(1, 1),
                Some(Reason::QuotaGpus {
                    scope: lab,
                    used: 4,
                    limit: 4,
                }),
            ),
            (
                "exactly the rest of the hours",
                held(0, 50.0),
                30.0,
                job(2, 10),
                None,
            ),
            (
                "hours would overflow",
                held(1, 50.0),
                40.0,
                job(1, 11),
                Some(Reason::QuotaGpuHours {
                    scope: lab,
                    used: 90,
                    limit: 100,
                    needs: 11,
                }),
            ),
            (
                "too long",
                held(0, 0.0),
                0.0,
                job(1, 25),
                Some(Reason::QuotaTimeLimit {
                    scope: lab,
                    limit_s: 24 * 3600,
                }),
            ),
        ];
        for (name, usage, period, j, want) in cases {
            assert_eq!(check(&q, lab, usage, period, Ask::of(&j)), want, "{name}");
        }
        let hours_only = Quota {
            max_gpu_hours: Some(1.0),
            ..Default::default()
        };
        assert_eq!(
            check(&hours_only, lab, Use::default(), 0.0, Ask::of(&job(1, 0))),
            Some(Reason::QuotaNeedsTimeLimit { scope: lab })
        );
        assert_eq!(
            check(
                &Quota::default(),
                lab,
                held(100, 1e9),
                1e9,
                Ask::of(&job(8, 0))
            ),
            None
        );
    }
}
