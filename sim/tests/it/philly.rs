//! A small slice of the shipped Philly trace on the shipped campus (the full replay is
//! a benchmark, not a test). Both files are in the repository: `sim/traces/` and
//! `sim/campus/`.

use commons_sim::{read_trace, replay, CampusFile, PolicyKind, ReplaySettings, Workload};
use std::path::PathBuf;

/// A file shipped with the simulator, by its path under `sim/`; a missing one fails
/// the test with what is missing and where it should be.
fn shipped(path: &str) -> PathBuf {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    assert!(
        file.is_file(),
        "{} is missing: it ships with the repository (sim/{path}); restore it with \
         `git checkout -- sim/{path}`",
        file.display()
    );
    file
}

#[test]
fn shipped_campus_has_about_600_gpus_and_15_labs() {
    let c = CampusFile::read(&shipped("campus/philly15.toml"))
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.labs.len(), 15);
    assert!((550..=650).contains(&c.total_gpus()), "{}", c.total_gpus());
    assert_eq!(c.grace_s, 120);
    assert_eq!(c.checkpoint_interval_s, Some(1800));
    let borrow_only = c
        .labs
        .iter()
        .enumerate()
        .filter(|(i, _)| !c.nodes.iter().any(|n| n.lab == *i))
        .count();
    assert_eq!(borrow_only, 4);
}

#[test]
fn philly_slice_replays_under_every_policy() {
    let trace = read_trace(&shipped("traces/philly_sep_oct_2017.csv"), Some(3000)).unwrap();
    let c = CampusFile::read(&shipped("campus/philly15.toml"))
        .unwrap()
        .build()
        .unwrap();
    let w = Workload::new(&trace, &c).unwrap();
    let r = replay(&c, &w, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    assert_eq!(r.summary.jobs, 3000);
    for p in PolicyKind::ALL {
        let m = &r.summary.policies[p.name()];
        assert_eq!(m.completed_jobs + m.unfinished_jobs, 3000, "{p}");
        assert!(m.utilization > 0.0 && m.utilization <= 1.0, "{p}");
        assert!(m.goodput <= m.utilization, "{p}");
        assert!(m.jct_p50_s <= m.jct_p95_s, "{p}");
        let lab_jobs: u64 = m.per_lab.values().map(|l| l.jobs).sum();
        assert_eq!(lab_jobs, 3000);
        assert!(m.labs_worse_off.is_some());
    }
    assert_eq!(r.summary.policies["isolated"].labs_worse_off, Some(0));
    assert_eq!(r.summary.targets.len(), 11);
}

#[test]
fn shipped_trace_is_the_whole_sep_oct_file() {
    let trace = read_trace(&shipped("traces/philly_sep_oct_2017.csv"), None).unwrap();
    assert_eq!(trace.len(), 52_849);
    // Submitted before 2017-11-01 00:00, counted from 2017-09-04 10:30:41.
    let first_of_november = 58 * 86_400 - (10 * 3600 + 30 * 60 + 41);
    assert!(trace.iter().all(|j| j.submit_time_s < first_of_november));
    let c = CampusFile::read(&shipped("campus/philly15.toml"))
        .unwrap()
        .build()
        .unwrap();
    // Every VC of the trace is some lab's tenant.
    assert_eq!(Workload::new(&trace, &c).unwrap().jobs.len(), 52_849);
}

/// The campus's node counts are the Helios per-VC quotas scaled by 75/352, rounded half
/// up (what the comment at the top of `philly15.toml` says).
#[test]
fn shipped_campus_scales_the_helios_quotas() {
    let text = std::fs::read_to_string(shipped("traces/philly_vc_nodes_helios.csv")).unwrap();
    let quotas: std::collections::BTreeMap<&str, u32> = text
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (vc, nodes) = l.split_once(',').unwrap();
            (vc, nodes.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(quotas.values().sum::<u32>(), 352);
    let campus = CampusFile::read(&shipped("campus/philly15.toml")).unwrap();
    for lab in &campus.lab {
        let helios: u32 = lab
            .tenants
            .iter()
            .filter_map(|t| quotas.get(t.as_str()))
            .sum();
        assert_eq!(lab.nodes, (helios * 150 + 352) / 704, "lab {}", lab.name);
    }
}
