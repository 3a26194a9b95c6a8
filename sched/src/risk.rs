//! Owner return risk: how likely a node's owner is to take its GPUs back from a guest
//! within the guest's time limit, and the re-lending hysteresis built on it.
//!
//! The caller passes each node's owner take-backs per hour for every hour of the week
//! ([`crate::Node::owner_return_rate`], campus local time). A guest running from `t`
//! for `d` seconds expects `R = integral of the rate over [t, t + d)` take-backs; with
//! arrivals as a Poisson process the chance of at least one is `1 - exp(-R)`.
//!
//! Invariants:
//! - Pure and O(1) per query: each node's rates are turned into a prefix sum once per
//!   plan, and the integral over any span (whole weeks included) is two lookups.
//! - A node without rates has zero risk and no hysteresis: it behaves exactly as before.

use crate::lending::second_of_week;
use crate::model::{GpuId, Node, QueuedJob, Snapshot, Time};
use crate::policy::Policy;
use std::collections::HashSet;

/// Hours in a week: the length of [`Node::owner_return_rate`].
pub const WEEK_HOURS: usize = 168;

/// A node's return rates, ready for integrals.
pub(crate) struct Returns {
    rate: Vec<f64>,
    /// `prefix[h]`: expected take-backs from Monday 00:00 to the start of hour `h`.
    prefix: Vec<f64>,
}

impl Returns {
    /// `None` when the node has no (positive) rates. Extra values are ignored, missing
    /// ones count as zero, negative or non-finite ones as zero.
    pub fn new(node: &Node) -> Option<Returns> {
        let mut rate = vec![0.0; WEEK_HOURS];
        for (r, v) in rate.iter_mut().zip(&node.owner_return_rate) {
            *r = if v.is_finite() { v.max(0.0) } else { 0.0 };
        }
        if rate.iter().all(|&r| r == 0.0) {
            return None;
        }
        let mut prefix = Vec::with_capacity(WEEK_HOURS + 1);
        let mut sum = 0.0;
        prefix.push(0.0);
        for &r in &rate {
            sum += r;
            prefix.push(sum);
        }
        Some(Returns { rate, prefix })
    }

    /// Expected take-backs from the start of the week to `into` seconds after it.
    fn upto(&self, into: i64) -> f64 {
        let weeks = into.div_euclid(WEEK_HOURS as i64 * 3600);
        let rest = into.rem_euclid(WEEK_HOURS as i64 * 3600);
        let h = (rest / 3600) as usize;
        let frac = (rest % 3600) as f64 / 3600.0;
        weeks as f64 * self.prefix[WEEK_HOURS] + self.prefix[h] + frac * self.rate[h]
    }

    /// Expected take-backs while a guest runs from `now` for `duration_s` seconds.
    pub fn expected(&self, now: Time, duration_s: i64, utc_offset_s: i32) -> f64 {
        let sow = second_of_week(now, utc_offset_s);
        let d = duration_s.clamp(0, 52 * 7 * 86_400);
        self.upto(sow + d) - self.upto(sow)
    }

    /// The rate in the hour that contains `now`.
    pub fn now(&self, now: Time, utc_offset_s: i32) -> f64 {
        let h = (second_of_week(now, utc_offset_s) / 3600) as usize;
        self.rate[h.min(WEEK_HOURS - 1)]
    }
}

/// Hour of the week of `t` in campus local time (0 = Monday 00:00-01:00), the index
/// into [`Node::owner_return_rate`].
pub fn hour_of_week(t: Time, utc_offset_s: i32) -> usize {
    ((second_of_week(t, utc_offset_s) / 3600) as usize).min(WEEK_HOURS - 1)
}

/// Owner return rates from a node's history: `counts[h]` take-backs (guests stopped
/// for the owner) seen in hour `h` of the week over `weeks` weeks. Take-backs are
/// sparse (a few a week), so each hour's rate is half the node's mean over the week
/// and half its count in the five hours around `h`, per week. The portal and the
/// simulator both learn rates this way.
pub fn smooth_return_rate(counts: &[f64], weeks: f64) -> Vec<f64> {
    let weeks = weeks.max(1.0);
    let at = |h: usize| counts.get(h % WEEK_HOURS).copied().unwrap_or(0.0);
    let mean = (0..WEEK_HOURS).map(at).sum::<f64>() / WEEK_HOURS as f64;
    (0..WEEK_HOURS)
        .map(|h| {
            let around: f64 = (0..5).map(|d| at(h + WEEK_HOURS + d - 2)).sum();
            (0.5 * mean + 0.5 * around / 5.0) / weeks
        })
        .collect()
}

/// The risk class of a guest of `time_limit_s` seconds (0: unknown, counted as one week)
/// on a node: the expected take-backs while it runs, in tenths (0 below 0.1, that is a
/// chance of a take-back under about 10 %). Expected take-backs rather than the chance
/// keep long jobs apart: a 3-day guest has a chance near 1 on most nodes, but expects
/// 2 take-backs on one and 20 on another.
pub(crate) fn risk_class(
    returns: Option<&Returns>,
    now: Time,
    time_limit_s: i64,
    policy: &Policy,
) -> u32 {
    let Some(r) = returns.filter(|_| policy.return_risk_placement) else {
        return 0;
    };
    let d = if time_limit_s > 0 {
        time_limit_s
    } else {
        7 * 86_400
    };
    let expected = r.expected(now, d, policy.utc_offset_s);
    (expected * 10.0).floor().clamp(0.0, 1e9) as u32
}

/// Whether [`Policy::taken_back_max_risk`] restricts where `job` may borrow now: the
/// rule is on, an owner took the job back before, and its wait since the last take-back
/// is within [`Policy::taken_back_patience_s`].
pub(crate) fn taken_back_rule_applies(job: &QueuedJob, now: Time, policy: &Policy) -> bool {
    let max = policy.taken_back_max_risk;
    !(max.is_nan() || max <= 0.0 || job.take_backs == 0)
        && now.saturating_sub(job.taken_back_at) < policy.taken_back_patience_s
}

/// Whether a guest that an owner already took back must not borrow this node now: the
/// rule applies to it ([`taken_back_rule_applies`]) and the node expects at least
/// [`Policy::taken_back_max_risk`] take-backs within the job's time limit (0: unknown,
/// counted as one week), a limit loosened on a quiet campus by
/// [`Policy::taken_back_pressure_weight`] ([`pressure_scale`]). Nodes without return
/// rates are safe.
pub(crate) fn too_risky_after_take_back(
    returns: Option<&Returns>,
    job: &QueuedJob,
    now: Time,
    policy: &Policy,
    pressure: f64,
) -> bool {
    let Some(r) = returns.filter(|_| taken_back_rule_applies(job, now, policy)) else {
        return false;
    };
    let d = if job.time_limit_s > 0 {
        job.time_limit_s
    } else {
        7 * 86_400
    };
    let scale = pressure_scale(policy.taken_back_pressure_weight, pressure);
    r.expected(now, d, policy.utc_offset_s) * scale >= policy.taken_back_max_risk
}

/// Queue pressure: the GPUs the queue asks for over the free GPUs of schedulable nodes
/// (not held, not in local use), at most 1; 0 with an empty queue. A quiet campus has
/// free GPUs to spare, a contested one has more asked than free.
pub(crate) fn pressure(snapshot: &Snapshot) -> f64 {
    let asked: u64 = snapshot.queue.iter().map(|j| u64::from(j.gpus)).sum();
    if asked == 0 {
        return 0.0;
    }
    let held: HashSet<GpuId> = snapshot
        .running
        .iter()
        .flat_map(|r| r.gpus.iter().copied())
        .collect();
    let free = snapshot
        .nodes
        .iter()
        .filter(|n| n.schedulable)
        .flat_map(|n| &n.gpus)
        .filter(|g| !g.local_use && !held.contains(&g.id))
        .count();
    (asked as f64 / free.max(1) as f64).min(1.0)
}

/// How much a churn rule weighs at queue pressure `pressure` with weight `w` (0 to 1):
/// `1 - w + w * pressure`, at least 0.1. Weight 0: always fully; weight 1: in
/// proportion to the pressure, so a quiet campus lends freely.
pub(crate) fn pressure_scale(w: f64, pressure: f64) -> f64 {
    let w = if w.is_finite() {
        w.clamp(0.0, 1.0)
    } else {
        0.0
    };
    (1.0 - w + w * pressure.clamp(0.0, 1.0)).max(0.1)
}

/// Seconds a free GPU of the node must have been free of owner work before a guest
/// gets it: the lending rule, or the hysteresis while the owner tends to come back.
///
/// With [`Policy::relend_adaptive`] the hysteresis scales with the node's take-back
/// rate this hour (in full from [`Policy::relend_full_rate`]) and with the queue
/// pressure ([`Policy::relend_pressure_weight`], [`pressure_scale`]).
pub(crate) fn min_idle_s(
    node: &Node,
    returns: Option<&Returns>,
    now: Time,
    p: &Policy,
    pressure: f64,
) -> i64 {
    let hysteresis = match returns {
        Some(r) if p.relend_delay_s > 0 && r.now(now, p.utc_offset_s) >= p.relend_min_rate => {
            if p.relend_adaptive {
                let full = p.relend_full_rate.max(p.relend_min_rate).max(1e-9);
                let by_rate = (r.now(now, p.utc_offset_s) / full).min(1.0);
                let scale = by_rate * pressure_scale(p.relend_pressure_weight, pressure);
                (p.relend_delay_s as f64 * scale).round() as i64
            } else {
                p.relend_delay_s
            }
        }
        _ => 0,
    };
    node.lending.min_idle_s.max(hysteresis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(rate: Vec<f64>) -> Node {
        Node {
            owner_return_rate: rate,
            ..Default::default()
        }
    }

    #[test]
    fn integrates_over_hours_and_weeks() {
        // Monday 1970-01-05 00:00 UTC.
        let monday = 4 * 86_400;
        let mut rate = vec![0.0; WEEK_HOURS];
        rate[0] = 2.0;
        rate[1] = 1.0;
        let r = Returns::new(&node(rate)).unwrap();
        assert!((r.expected(monday, 3600, 0) - 2.0).abs() < 1e-9);
        assert!((r.expected(monday + 1800, 3600, 0) - 1.5).abs() < 1e-9);
        assert!((r.expected(monday, 2 * 7 * 86_400, 0) - 6.0).abs() < 1e-9);
        assert!((r.expected(monday + 7200, 3600, 0)).abs() < 1e-9);
        assert_eq!(r.now(monday + 3700, 0), 1.0);
        assert!(Returns::new(&node(vec![])).is_none());
        assert!(Returns::new(&node(vec![f64::NAN, -1.0])).is_none());
    }

    #[test]
    fn smoothing_spreads_sparse_take_backs() {
        let mut counts = vec![0.0; WEEK_HOURS];
        counts[10] = 168.0;
        let r = smooth_return_rate(&counts, 2.0);
        assert!((r[10] - (0.5 * 1.0 + 0.5 * 168.0 / 5.0) / 2.0).abs() < 1e-9);
        assert_eq!(r[8], r[12]);
        assert!((r[100] - 0.25).abs() < 1e-9);
        // Monday 1970-01-05 01:30 UTC is hour 1; an hour east it is hour 2.
        assert_eq!(hour_of_week(4 * 86_400 + 5400, 0), 1);
        assert_eq!(hour_of_week(4 * 86_400 + 5400, 3600), 2);
    }

    #[test]
    fn adaptive_hysteresis_scales_with_rate_and_pressure() {
        let monday = 4 * 86_400;
        let p = Policy {
            relend_adaptive: true,
            relend_full_rate: 0.2,
            relend_pressure_weight: 1.0,
            ..Policy::default()
        };
        let r = Returns::new(&node(vec![0.1; WEEK_HOURS])).unwrap();
        // Half the full rate, full pressure: half the delay; no pressure: a tenth.
        assert_eq!(
            min_idle_s(&Node::default(), Some(&r), monday, &p, 1.0),
            1800
        );
        assert_eq!(min_idle_s(&Node::default(), Some(&r), monday, &p, 0.0), 180);
        let rate_only = Policy {
            relend_pressure_weight: 0.0,
            ..p.clone()
        };
        assert_eq!(
            min_idle_s(&Node::default(), Some(&r), monday, &rate_only, 0.0),
            1800
        );
        // Under the minimum rate: no hysteresis at all.
        let low = Returns::new(&node(vec![0.01; WEEK_HOURS])).unwrap();
        assert_eq!(min_idle_s(&Node::default(), Some(&low), monday, &p, 1.0), 0);
        assert_eq!(pressure_scale(0.0, 0.0), 1.0);
        assert_eq!(pressure_scale(1.0, 0.5), 0.5);
        assert_eq!(pressure_scale(f64::NAN, 0.0), 1.0);
    }

    #[test]
    fn pressure_is_asked_over_free_gpus() {
        let gpu = |id| crate::Gpu {
            id,
            ..Default::default()
        };
        let mut s = Snapshot {
            nodes: vec![Node {
                schedulable: true,
                gpus: (1..=4).map(gpu).collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(pressure(&s), 0.0);
        s.queue.push(QueuedJob {
            gpus: 1,
            ..Default::default()
        });
        assert_eq!(pressure(&s), 0.25);
        s.running.push(crate::RunningJob {
            gpus: vec![1, 2, 3],
            ..Default::default()
        });
        assert_eq!(pressure(&s), 1.0);
    }

    #[test]
    fn risk_classes_and_hysteresis() {
        let monday = 4 * 86_400;
        let r = Returns::new(&node(vec![1.0; WEEK_HOURS])).unwrap();
        let p = Policy::default();
        assert_eq!(risk_class(Some(&r), monday, 60, &p), 0);
        assert_eq!(risk_class(Some(&r), monday, 3600, &p), 10);
        assert_eq!(risk_class(Some(&r), monday, 0, &p), 1680);
        assert_eq!(risk_class(None, monday, 3600, &p), 0);
        let off = p.clone().without_churn_knobs();
        assert_eq!(risk_class(Some(&r), monday, 3600, &off), 0);
        assert_eq!(
            min_idle_s(&Node::default(), Some(&r), monday, &p, 1.0),
            3600
        );
        assert_eq!(min_idle_s(&Node::default(), None, monday, &p, 1.0), 0);
        assert_eq!(min_idle_s(&Node::default(), Some(&r), monday, &off, 1.0), 0);
    }
}
