//! The ratios the suite reports per case, their distribution over a set of cases, and
//! the targets on them.
//!
//! Every ratio compares a policy with a baseline simulated on the same case (same
//! campus, jobs, departures and checkpoint model), so lower is better for all of them
//! and the worst case is the largest value. Percentiles are nearest-rank over the
//! cases; a case where a ratio is undefined (a baseline with no completed job or no
//! owner wait) is left out of that ratio's distribution.

use super::{CaseResult, Figures};
use crate::metrics::worse_off;
use crate::policy::PolicyKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A ratio of the suite: its name, what it is, and the limit on it.
pub struct Ratio {
    pub name: &'static str,
    pub what: &'static str,
    pub limit: f64,
}

/// The ratios, in the order the tables show them.
pub const RATIOS: [Ratio; 8] = [
    Ratio {
        name: "jct_vs_share_fairshare",
        what: "mean JCT / share-fairshare's",
        limit: 1.0,
    },
    Ratio {
        name: "jct_vs_commons_old",
        what: "mean JCT / commons-old's",
        limit: 1.0,
    },
    Ratio {
        name: "preemptions_vs_commons_old",
        what: "preemptions / commons-old's",
        limit: 0.5,
    },
    Ratio {
        name: "owner_wait_vs_share_fairshare",
        what: "owner mean wait / share-fairshare's",
        limit: 0.5,
    },
    Ratio {
        name: "owner_wait_vs_share_fairshare_contested",
        what: "the same where share-fairshare's owners wait 10 min or more",
        limit: 0.5,
    },
    Ratio {
        name: "owner_wait_min",
        what: "owner mean wait (minutes)",
        limit: f64::INFINITY,
    },
    Ratio {
        name: "labs_worse_off",
        what: "labs worse off than alone (count)",
        limit: 0.0,
    },
    Ratio {
        name: "lost_gpu_hours_vs_commons_old",
        what: "lost GPU-hours / commons-old's",
        limit: 0.5,
    },
];

/// Share-fairshare's owner mean wait from which a case counts as contested for owners:
/// below it owners wait about a tick and a grace period in every policy, and the ratio
/// says little.
pub const CONTESTED_OWNER_WAIT_S: f64 = 600.0;

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// `a / b` for counts: 0 when both are 0, infinite when only `b` is.
fn count_div(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else if a > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// Labs of `p` worse off than under `isolated` (the rule of
/// [`crate::metrics::labs_worse_off`]).
pub fn labs_worse_off(p: &Figures, isolated: &Figures, grace_s: i64) -> u32 {
    p.lab_jct_mean_s
        .iter()
        .filter(|(lab, jct)| {
            let base = isolated.lab_jct_mean_s.get(*lab).copied().flatten();
            worse_off(**jct, base, grace_s)
        })
        .count() as u32
}

/// The value of ratio `name` for `policy` on one case (`None`: undefined there).
pub fn value(case: &CaseResult, policy: &str, name: &str) -> Option<f64> {
    let get = |p: PolicyKind| case.policies.get(p.name());
    let p = case.policies.get(policy)?;
    let (sf, old) = (get(PolicyKind::ShareFairshare), get(PolicyKind::CommonsOld));
    match name {
        "jct_vs_share_fairshare" => div(p.jct_mean_s, sf?.jct_mean_s),
        "jct_vs_commons_old" => div(p.jct_mean_s, old?.jct_mean_s),
        "preemptions_vs_commons_old" => {
            Some(count_div(p.preemptions as f64, old?.preemptions as f64))
        }
        "owner_wait_vs_share_fairshare" => div(p.owner_wait_mean_s, sf?.owner_wait_mean_s),
        "owner_wait_vs_share_fairshare_contested" => {
            let sf = sf?
                .owner_wait_mean_s
                .filter(|&w| w >= CONTESTED_OWNER_WAIT_S);
            div(p.owner_wait_mean_s, sf)
        }
        "owner_wait_min" => p.owner_wait_mean_s.map(|w| w / 60.0),
        "labs_worse_off" => {
            let iso = get(PolicyKind::Isolated)?;
            Some(f64::from(labs_worse_off(p, iso, case.info.grace_s)))
        }
        "lost_gpu_hours_vs_commons_old" => Some(count_div(p.lost_gpu_hours, old?.lost_gpu_hours)),
        _ => None,
    }
}

/// The distribution of one ratio over a set of cases. Infinite values (a baseline
/// with none where the policy has some) are `null` in JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Dist {
    /// Cases where the ratio is defined.
    pub cases: usize,
    pub median: Option<f64>,
    pub p10: Option<f64>,
    pub p90: Option<f64>,
    /// The largest value (every ratio is lower-is-better).
    pub worst: Option<f64>,
    /// The seed of the case with the largest value.
    pub worst_seed: Option<u64>,
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn round4(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e4).round() / 1e4
    } else {
        x
    }
}

/// The distribution of ratio `name` of `policy` over `cases`.
pub fn distribution(cases: &[&CaseResult], policy: &str, name: &str) -> Dist {
    let mut values: Vec<(f64, u64)> = cases
        .iter()
        .filter_map(|c| value(c, policy, name).map(|v| (v, c.info.seed)))
        .collect();
    values.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let sorted: Vec<f64> = values.iter().map(|v| v.0).collect();
    let worst = values.last().copied();
    Dist {
        cases: values.len(),
        median: percentile(&sorted, 50.0).map(round4),
        p10: percentile(&sorted, 10.0).map(round4),
        p90: percentile(&sorted, 90.0).map(round4),
        worst: worst.map(|w| round4(w.0)),
        worst_seed: worst.map(|w| w.1),
    }
}

/// Every ratio's distribution for every policy: policy -> ratio -> distribution.
pub fn distributions(
    cases: &[&CaseResult],
    policies: &[String],
) -> BTreeMap<String, BTreeMap<String, Dist>> {
    policies
        .iter()
        .map(|p| {
            let per_ratio = RATIOS
                .iter()
                .map(|r| (r.name.to_string(), distribution(cases, p, r.name)))
                .collect();
            (p.clone(), per_ratio)
        })
        .collect()
}

/// One of the targets on one set's median and worst case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteTarget {
    pub set: String,
    pub policy: String,
    pub ratio: String,
    pub limit: f64,
    pub median_met: bool,
    pub worst_met: bool,
}

/// The targets of every policy on every set's distributions.
pub fn targets(
    dists: &BTreeMap<String, BTreeMap<String, BTreeMap<String, Dist>>>,
) -> Vec<SuiteTarget> {
    let mut out = Vec::new();
    for (set, per_policy) in dists {
        for (policy, per_ratio) in per_policy {
            for r in RATIOS.iter().filter(|r| r.limit.is_finite()) {
                let Some(d) = per_ratio.get(r.name) else {
                    continue;
                };
                let met = |v: Option<f64>| v.is_some_and(|v| v <= r.limit);
                out.push(SuiteTarget {
                    set: set.clone(),
                    policy: policy.clone(),
                    ratio: r.name.to_string(),
                    limit: r.limit,
                    median_met: met(d.median),
                    worst_met: met(d.worst),
                });
            }
        }
    }
    out
}

/// A value for a table: two decimals, "inf", or "-".
pub fn cell(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_infinite() => "inf".into(),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

/// The report's tables in Markdown: the distributions, then one row per case.
pub fn markdown(report: &super::SuiteReport) -> String {
    let mut out = String::new();
    out += "| set | policy | ratio | median | p10 | p90 | worst (seed) | limit | median met | worst met |\n";
    out += "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n";
    for (set, per_policy) in &report.distributions {
        for (policy, per_ratio) in per_policy {
            for r in &RATIOS {
                let Some(d) = per_ratio.get(r.name) else {
                    continue;
                };
                let met = |v: Option<f64>| match v {
                    _ if r.limit.is_infinite() => "-",
                    Some(v) if v <= r.limit => "yes",
                    Some(_) => "no",
                    None => "-",
                };
                let worst = match d.worst_seed {
                    Some(s) => format!("{} ({s})", cell(d.worst)),
                    None => "-".into(),
                };
                out += &format!(
                    "| {set} | `{policy}` | {} | {} | {} | {} | {worst} | {} | {} | {} |\n",
                    r.what,
                    cell(d.median),
                    cell(d.p10),
                    cell(d.p90),
                    if r.limit.is_finite() {
                        r.limit.to_string()
                    } else {
                        "-".into()
                    },
                    met(d.median),
                    met(d.worst),
                );
            }
        }
    }
    out += "\n";
    out += &cases_table(report);
    out
}

/// One row per case and evaluated policy: the case, then its ratios.
fn cases_table(report: &super::SuiteReport) -> String {
    let mut out = String::from(
        "| seed | set | window | labs (borrow-only) | GPUs | models | jobs | load | grace (s) | departures | policy |",
    );
    for r in &RATIOS {
        out += &format!(" {} |", r.name);
    }
    out += "\n|";
    out += &" --- |".repeat(11 + RATIOS.len());
    out += "\n";
    for c in &report.cases {
        let i = &c.info;
        for p in &report.policies {
            out += &format!(
                "| {} | {} | {} | {} ({}) | {} | {} | {} | {:.2} | {} | {} | `{p}` |",
                i.seed,
                i.set,
                i.window,
                i.labs,
                i.borrow_only_labs,
                i.gpus,
                i.models.join(", "),
                i.jobs,
                i.load,
                i.grace_s,
                i.random_departures,
            );
            for r in &RATIOS {
                out += &format!(" {} |", cell(value(c, p, r.name)));
            }
            out += "\n";
        }
    }
    out
}
