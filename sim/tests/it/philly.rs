//! A small slice of the shipped Philly trace on the shipped campus (the full replay is
//! a benchmark, not a test). CI has `shared/` beside the clone, at `../shared/` from
//! the repository root.

use commons_sim::{read_trace, replay, CampusFile, PolicyKind, ReplaySettings, Workload};
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn shipped_campus_has_about_600_gpus_and_15_labs() {
    let c = CampusFile::read(&repo().join("sim/campus/philly15.toml"))
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
    let trace_path = repo().join("../shared/traces/philly_sep_oct_2017.csv");
    let trace = read_trace(&trace_path, Some(3000)).unwrap_or_else(|e| {
        panic!("{e}: the Philly trace is expected at ../shared/traces/ beside the repository")
    });
    let c = CampusFile::read(&repo().join("sim/campus/philly15.toml"))
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
    assert_eq!(r.summary.targets.len(), 6);
}
