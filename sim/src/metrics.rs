//! From the raw outcome of a simulation to the figures of the JSON output, and the
//! comparison of policies against the targets.
//!
//! Definitions (all times in seconds, span = first to last submission):
//! - `utilization`: busy GPU-seconds inside the span / (campus GPUs x span length);
//!   a GPU is busy while a job holds it, including a grace period and work later lost.
//! - `goodput`: the same without the GPU-seconds of work lost to stops (and re-run).
//! - `jct`: finish - submission; `wait`: first start - submission, over completed jobs.
//! - `owner_wait`: waits of the jobs whose first attempt ran on their own lab's nodes.
//! - `interactive_wait`, `batch_wait`: waits of the interactive jobs (see
//!   `trace::is_interactive_by_rule` for traces without a job kind) and of the others.
//! - `labs_worse_off`: labs whose mean JCT is more than 5% and more than the grace
//!   period above their mean JCT under `isolated`, both over the lab's jobs that fit
//!   one of its own nodes (`jct_mean_fitting_s`: the jobs `isolated` can run; a job
//!   wider than every node of its lab runs only when shared, which is no loss). A lab
//!   that completes nothing under `isolated`, e.g. one without nodes, cannot be worse
//!   off.
//!
//! - `estimate_*`: over the completed jobs that got a start-time estimate from the
//!   scheduler before their first start (`commons` policies): the absolute error of the
//!   first estimate (first start - estimated start), and the share of jobs whose wait
//!   from that estimate was within 2x of the predicted wait (both at least one minute:
//!   `max(actual, 60) <= 2 max(predicted, 60)` and the other way round).
//!
//! Means and percentiles of empty sets are `null` in JSON. Percentiles are nearest-rank.

use crate::campus::Campus;
use crate::engine::SimOutput;
use crate::policy::PolicyKind;
use crate::trace::Workload;
use serde::Serialize;
use std::collections::BTreeMap;

/// The figures of one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyMetrics {
    pub utilization: f64,
    pub goodput: f64,
    pub jct_mean_s: Option<f64>,
    pub jct_p50_s: Option<f64>,
    pub jct_p95_s: Option<f64>,
    pub wait_mean_s: Option<f64>,
    pub wait_p95_s: Option<f64>,
    pub owner_wait_mean_s: Option<f64>,
    pub owner_wait_p95_s: Option<f64>,
    /// Interactive jobs in the workload (completed or not).
    pub interactive_jobs: u64,
    pub interactive_wait_mean_s: Option<f64>,
    pub interactive_wait_p95_s: Option<f64>,
    pub batch_wait_mean_s: Option<f64>,
    pub batch_wait_p95_s: Option<f64>,
    pub preemptions: u64,
    pub lost_gpu_hours: f64,
    pub completed_jobs: u64,
    /// Jobs that never finished (e.g. of a lab without nodes under `isolated`).
    pub unfinished_jobs: u64,
    pub migrations_ok: u64,
    pub migrations_failed: u64,
    /// `null` when `isolated` was not simulated in the same run.
    pub labs_worse_off: Option<u32>,
    pub busy_gpu_hours: f64,
    /// Virtual seconds from the first submission to the last event.
    pub simulated_s: i64,
    pub plan_calls: u64,
    /// Completed jobs that got a start-time estimate before their first start.
    pub estimated_jobs: u64,
    pub estimate_abs_error_median_s: Option<f64>,
    pub estimate_abs_error_p95_s: Option<f64>,
    /// Share of `estimated_jobs` that started within 2x of their first estimate.
    pub estimate_within_2x: Option<f64>,
    pub per_lab: BTreeMap<String, LabMetrics>,
}

/// The figures of one lab under one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LabMetrics {
    pub jobs: u64,
    pub completed: u64,
    pub wait_mean_s: Option<f64>,
    pub jct_mean_s: Option<f64>,
    pub owner_wait_mean_s: Option<f64>,
    /// Mean JCT of the completed jobs that fit one of the lab's own nodes.
    pub jct_mean_fitting_s: Option<f64>,
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| round(v.iter().sum::<f64>() / v.len() as f64, 1))
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// JCTs and waits of the completed jobs, sorted.
pub struct Samples {
    pub jct: Vec<f64>,
    pub wait: Vec<f64>,
    pub owner_wait: Vec<f64>,
    pub interactive_wait: Vec<f64>,
    pub batch_wait: Vec<f64>,
}

impl Samples {
    pub fn new(work: &Workload, out: &SimOutput) -> Samples {
        let mut s = Samples {
            jct: Vec::new(),
            wait: Vec::new(),
            owner_wait: Vec::new(),
            interactive_wait: Vec::new(),
            batch_wait: Vec::new(),
        };
        for (j, o) in work.jobs.iter().zip(&out.jobs) {
            if let (Some(start), Some(finish)) = (o.first_start, o.finish) {
                s.jct.push((finish - j.submit) as f64);
                s.wait.push((start - j.submit) as f64);
                if o.owner_start {
                    s.owner_wait.push((start - j.submit) as f64);
                }
                let by_kind = if j.interactive {
                    &mut s.interactive_wait
                } else {
                    &mut s.batch_wait
                };
                by_kind.push((start - j.submit) as f64);
            }
        }
        let all = [
            &mut s.jct,
            &mut s.wait,
            &mut s.owner_wait,
            &mut s.interactive_wait,
            &mut s.batch_wait,
        ];
        for v in all {
            v.sort_by(f64::total_cmp);
        }
        s
    }
}

/// Summarise one simulation (without `labs_worse_off`, see [`fill_labs_worse_off`]).
pub fn summarize(campus: &Campus, work: &Workload, out: &SimOutput) -> PolicyMetrics {
    let s = Samples::new(work, out);
    let span = (work.span.1 - work.span.0) as f64;
    let capacity = campus.total_gpus() as f64 * span;
    let acct = &out.accounting;
    let ratio = |x: f64| {
        if capacity > 0.0 {
            round(x / capacity, 4)
        } else {
            0.0
        }
    };
    let per_lab = per_lab(campus, work, out);
    let (errors, within) = estimate_errors(out);
    PolicyMetrics {
        estimated_jobs: errors.len() as u64,
        estimate_abs_error_median_s: percentile(&errors, 50.0),
        estimate_abs_error_p95_s: percentile(&errors, 95.0),
        estimate_within_2x: (!errors.is_empty())
            .then(|| round(within as f64 / errors.len() as f64, 4)),
        utilization: ratio(acct.busy_gpu_s),
        goodput: ratio(acct.busy_gpu_s - acct.lost_in_span_gpu_s),
        jct_mean_s: mean(&s.jct),
        jct_p50_s: percentile(&s.jct, 50.0),
        jct_p95_s: percentile(&s.jct, 95.0),
        wait_mean_s: mean(&s.wait),
        wait_p95_s: percentile(&s.wait, 95.0),
        owner_wait_mean_s: mean(&s.owner_wait),
        owner_wait_p95_s: percentile(&s.owner_wait, 95.0),
        interactive_jobs: work.jobs.iter().filter(|j| j.interactive).count() as u64,
        interactive_wait_mean_s: mean(&s.interactive_wait),
        interactive_wait_p95_s: percentile(&s.interactive_wait, 95.0),
        batch_wait_mean_s: mean(&s.batch_wait),
        batch_wait_p95_s: percentile(&s.batch_wait, 95.0),
        preemptions: out.preemptions,
        lost_gpu_hours: round(acct.lost_gpu_s / 3600.0, 2),
        completed_jobs: s.jct.len() as u64,
        unfinished_jobs: (work.jobs.len() - s.jct.len()) as u64,
        migrations_ok: out.migrations_ok,
        migrations_failed: out.migrations_failed,
        labs_worse_off: None,
        busy_gpu_hours: round(acct.busy_gpu_s / 3600.0, 2),
        simulated_s: out.end_time - work.span.0,
        plan_calls: out.plan_calls,
        per_lab,
    }
}

/// Each lab's figures under one simulation.
fn per_lab(campus: &Campus, work: &Workload, out: &SimOutput) -> BTreeMap<String, LabMetrics> {
    let mut per_lab = BTreeMap::new();
    let mut widest = vec![0; campus.labs.len()];
    for n in &campus.nodes {
        widest[n.lab] = widest[n.lab].max(n.gpus);
    }
    for (i, lab) in campus.labs.iter().enumerate() {
        let (mut jobs, mut wait, mut jct, mut owner) = (0, Vec::new(), Vec::new(), Vec::new());
        let mut fitting = Vec::new();
        for (j, o) in work.jobs.iter().zip(&out.jobs).filter(|(j, _)| j.lab == i) {
            jobs += 1;
            if let (Some(start), Some(finish)) = (o.first_start, o.finish) {
                wait.push((start - j.submit) as f64);
                jct.push((finish - j.submit) as f64);
                if o.owner_start {
                    owner.push((start - j.submit) as f64);
                }
                if j.gpus <= widest[i] {
                    fitting.push((finish - j.submit) as f64);
                }
            }
        }
        per_lab.insert(
            lab.name.clone(),
            LabMetrics {
                jobs,
                completed: jct.len() as u64,
                wait_mean_s: mean(&wait),
                jct_mean_s: mean(&jct),
                owner_wait_mean_s: mean(&owner),
                jct_mean_fitting_s: mean(&fitting),
            },
        );
    }
    per_lab
}

/// The absolute errors of the first start-time estimates (sorted), and how many jobs
/// started within 2x of theirs (see the module docs).
fn estimate_errors(out: &SimOutput) -> (Vec<f64>, u64) {
    let (mut errors, mut within) = (Vec::new(), 0u64);
    for o in &out.jobs {
        if let (Some((at, est)), Some(start), Some(_)) = (o.first_estimate, o.first_start, o.finish)
        {
            errors.push((start - est).abs() as f64);
            let (actual, predicted) = ((start - at).max(60), (est - at).max(60));
            if actual <= 2 * predicted && predicted <= 2 * actual {
                within += 1;
            }
        }
    }
    errors.sort_by(f64::total_cmp);
    (errors, within)
}

/// Labs whose mean JCT under `m` is more than 5% and more than `grace_s` above theirs
/// under `isolated`, over the jobs that fit their own nodes.
pub fn labs_worse_off(m: &PolicyMetrics, isolated: &PolicyMetrics, grace_s: i64) -> u32 {
    let mut n = 0;
    for (name, lab) in &m.per_lab {
        let base = isolated
            .per_lab
            .get(name)
            .and_then(|l| l.jct_mean_fitting_s);
        if worse_off(lab.jct_mean_fitting_s, base, grace_s) {
            n += 1;
        }
    }
    n
}

/// Whether a lab with mean JCT `jct` is worse off than with `base` alone: more than 5%
/// and more than `grace_s` above it, or it completes nothing where it completed jobs
/// alone (a lab that completes nothing alone, e.g. one without nodes, cannot be).
pub fn worse_off(jct: Option<f64>, base: Option<f64>, grace_s: i64) -> bool {
    match (base, jct) {
        (Some(base), Some(jct)) => jct > base * 1.05 && jct > base + grace_s as f64,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Set `labs_worse_off` on every policy when `isolated` is among them.
pub fn fill_labs_worse_off(all: &mut BTreeMap<String, PolicyMetrics>, grace_s: i64) {
    let Some(iso) = all.get(PolicyKind::Isolated.name()).cloned() else {
        return;
    };
    for m in all.values_mut() {
        m.labs_worse_off = Some(labs_worse_off(m, &iso, grace_s));
    }
}

/// One target of the issue and whether this run meets it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    pub name: String,
    /// What was measured (a ratio, a count or seconds, see `name`).
    pub value: Option<f64>,
    pub limit: f64,
    pub met: bool,
}

/// The targets for `commons`, each against the baseline it names; a target
/// whose policies were not simulated is left out.
pub fn targets(all: &BTreeMap<String, PolicyMetrics>, grace_s: i64) -> Vec<Target> {
    let mut t = Targets(Vec::new());
    let Some(c) = all.get(PolicyKind::Commons.name()) else {
        return t.0;
    };
    if let Some(i) = all.get(PolicyKind::Isolated.name()) {
        let util = ratio(Some(c.utilization), Some(i.utilization));
        t.push("utilization_vs_isolated_at_least", util, 1.3, true);
        let worse = c.labs_worse_off.map(f64::from);
        t.push("labs_worse_off_at_most", worse, 0.0, false);
        let owner = difference(c.owner_wait_mean_s, i.owner_wait_mean_s);
        let name = "owner_wait_mean_minus_isolated_s_at_most";
        t.push(name, owner, grace_s as f64, false);
    }
    if let Some(f) = all.get(PolicyKind::ShareFifo.name()) {
        let goodput = ratio(Some(c.goodput), Some(f.goodput));
        t.push("goodput_vs_share_fifo_at_least", goodput, 0.99, true);
        let jct = ratio(c.jct_mean_s, f.jct_mean_s);
        t.push("jct_mean_vs_share_fifo_at_most", jct, 0.8, false);
    }
    if let Some(f) = all.get(PolicyKind::ShareFairshare.name()) {
        let jct = ratio(c.jct_mean_s, f.jct_mean_s);
        t.push("jct_mean_vs_share_fairshare_at_most", jct, 1.0, false);
    }
    if let Some(o) = all.get(PolicyKind::CommonsOld.name()) {
        t.against_commons_old(c, o);
    }
    if let Some(n) = all.get(PolicyKind::CommonsNoCkpt.name()) {
        let lost = Some(count_ratio(c.lost_gpu_hours, n.lost_gpu_hours));
        t.push("lost_gpu_hours_vs_nockpt_at_most", lost, 0.1, false);
    }
    t.0
}

/// `a / b` rounded to 4 digits; `None` when either is missing or `b` is not positive.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(round(a / b, 4)),
        _ => None,
    }
}

/// `a - b` rounded to 0.1, when both are there.
fn difference(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(round(a - b, 1)),
        _ => None,
    }
}

/// `a / b` for counts: 0 when both are 0, infinite when only `b` is.
fn count_ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        round(a / b, 4)
    } else if a > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// The targets of one run as they are measured.
struct Targets(Vec<Target>);

impl Targets {
    fn push(&mut self, name: &str, value: Option<f64>, limit: f64, at_least: bool) {
        let met = value.is_some_and(|v| if at_least { v >= limit } else { v <= limit });
        self.0.push(Target {
            name: name.into(),
            value,
            limit,
            met,
        });
    }

    /// `commons` (`c`) against `commons-old` (`o`).
    fn against_commons_old(&mut self, c: &PolicyMetrics, o: &PolicyMetrics) {
        let preempt = count_ratio(c.preemptions as f64, o.preemptions as f64);
        self.push(
            "preemptions_vs_commons_old_at_most",
            Some(preempt),
            0.5,
            false,
        );
        let lost = count_ratio(c.lost_gpu_hours, o.lost_gpu_hours);
        self.push(
            "lost_gpu_hours_vs_commons_old_at_most",
            Some(lost),
            0.5,
            false,
        );
        let jct = ratio(c.jct_mean_s, o.jct_mean_s);
        self.push("jct_mean_vs_commons_old_at_most", jct, 1.05, false);
        let owner = difference(c.owner_wait_mean_s, o.owner_wait_mean_s);
        let name = "owner_wait_mean_minus_commons_old_s_at_most";
        self.push(name, owner, 0.0, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(10.0));
        assert_eq!(percentile(&v, 95.0), Some(19.0));
        assert_eq!(percentile(&v, 100.0), Some(20.0));
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(mean(&[1.0, 2.0]), Some(1.5));
    }
}
