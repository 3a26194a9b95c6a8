//! The robustness suite, tiny: four generated cases of the shipped trace in a debug
//! build (the full suite is for release builds, see docs/src/reports/robustness.md).

use commons_sim::checkpoint::CheckpointModel;
use commons_sim::suite::stats::{value, RATIOS};
use commons_sim::suite::{generate::generate, run_suite, Set, SuiteSettings, SuiteSpec};
use commons_sim::{read_trace, PolicyKind, Tuning};
use std::path::PathBuf;
use std::process::Command;

fn trace_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces/philly_sep_oct_2017.csv");
    assert!(
        p.is_file(),
        "{} is missing: it ships with the repository; restore it with `git checkout -- sim/traces`",
        p.display()
    );
    p
}

fn settings(threads: usize) -> SuiteSettings {
    SuiteSettings {
        spec: SuiteSpec::tiny(),
        set: None,
        policies: vec![PolicyKind::Commons],
        tuning: Tuning::default(),
        checkpoints: Some(CheckpointModel {
            no_checkpoint_share: 0.3,
            gbps: Some(1.0),
            seed: 1,
        }),
        tick_s: 30,
        window_per_lab: 8,
        threads,
        dump: None,
    }
}

#[test]
fn generated_cases_have_the_promised_shape() {
    let trace = read_trace(&trace_path(), None).unwrap();
    let spec = SuiteSpec::tiny();
    for seed in 0..spec.cases {
        let g = generate(&trace, &spec, seed).unwrap();
        let i = &g.info;
        assert!((5..=8).contains(&i.labs), "{i:?}");
        assert!(i.borrow_only_labs <= i.labs / 5, "{i:?}");
        assert_eq!(i.set, Set::of(seed).name());
        assert_eq!(i.jobs, g.work.jobs.len());
        assert!(i.jobs >= 1 && i.jobs <= 2 * spec.max_jobs as usize, "{i:?}");
        // Every lab submits for at least one tenant part, every owning lab has a node.
        assert!(g.campus.labs.iter().all(|l| !l.tenants.is_empty()));
        let owning = (0..i.labs)
            .filter(|&l| g.campus.nodes.iter().any(|n| n.lab == l))
            .count();
        assert_eq!(owning + i.borrow_only_labs, i.labs);
        // The window: jobs submitted inside it, at most two days long.
        assert!(i.until_s - i.from_s <= 2 * 86_400);
        assert!(g
            .work
            .jobs
            .iter()
            .all(|j| (i.from_s..i.until_s).contains(&j.submit)));
        // The same seed, the same case.
        assert_eq!(generate(&trace, &spec, seed).unwrap().info, g.info);
    }
}

#[test]
fn the_tiny_suite_reports_every_ratio_per_set_whatever_the_threads() {
    let trace = read_trace(&trace_path(), None).unwrap();
    let one = run_suite(&trace, &settings(1), None, &|_| {}).unwrap();
    assert_eq!(one.cases.len(), 4);
    for set in ["tuning", "test"] {
        let d = &one.distributions[set]["commons"];
        for r in &RATIOS {
            assert!(d.contains_key(r.name), "{set}: {} missing", r.name);
        }
        let jct = &d["jct_vs_share_fairshare"];
        assert_eq!(jct.cases, 2, "{set}: {jct:?}");
        assert!(jct.p10 <= jct.median && jct.median <= jct.p90 && jct.p90 <= jct.worst);
    }
    for c in &one.cases {
        for p in ["isolated", "share-fairshare", "commons-old", "commons"] {
            assert!(c.policies.contains_key(p), "case {}: {p}", c.info.seed);
        }
        assert!(value(c, "commons", "labs_worse_off").is_some());
    }
    let figures = |r: &commons_sim::suite::SuiteReport| {
        r.cases
            .iter()
            .map(|c| (c.info.clone(), c.policies.clone()))
            .collect::<Vec<_>>()
    };
    let two = run_suite(&trace, &settings(2), None, &|_| {}).unwrap();
    assert_eq!(figures(&one), figures(&two));
    assert_eq!(one.distributions, two.distributions);
    // The JSON reads back, and its baselines are reused for the same cases.
    let json = serde_json::to_string(&one).unwrap();
    let back: commons_sim::suite::SuiteReport = serde_json::from_str(&json).unwrap();
    let test_only = SuiteSettings {
        set: Some(Set::Test),
        ..settings(1)
    };
    let reused = run_suite(&trace, &test_only, Some(&back), &|_| {}).unwrap();
    assert_eq!(reused.cases.len(), 2);
    assert!(reused.cases.iter().all(|c| c.info.set == "test"));
    assert_eq!(reused.distributions["test"], one.distributions["test"]);
}

#[test]
fn suite_command_prints_the_tables_and_writes_json_and_cases() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("suite.json");
    let out = Command::new(env!("CARGO_BIN_EXE_commons-sim"))
        .args(["suite", "--tiny", "--quiet", "--set", "test", "--policies"])
        .arg("commons,old+hysteresis")
        .arg("--trace")
        .arg(trace_path())
        .arg("--json")
        .arg(&json)
        .arg("--dump")
        .arg(dir.path())
        .args(["--no-checkpoint-share", "0.3", "--checkpoint-gbps", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| test | `commons` | mean JCT / share-fairshare's |"));
    assert!(stdout.contains("| test | `old+hysteresis` | lost GPU-hours / commons-old's |"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["set"], "test");
    assert_eq!(v["cases"].as_array().unwrap().len(), 2);
    assert_eq!(v["key"]["checkpoint_model"]["no_checkpoint_share"], 0.3);
    // A dumped case replays with `commons-sim replay` to the suite's figures.
    let case = &v["cases"][0];
    let seed = case["info"]["seed"].as_u64().unwrap();
    let replayed = dir.path().join("replay.json");
    let status = Command::new(env!("CARGO_BIN_EXE_commons-sim"))
        .args(["replay", "--quiet", "--policies", "commons"])
        .arg("--trace")
        .arg(dir.path().join(format!("case{seed}.csv")))
        .arg("--campus")
        .arg(dir.path().join(format!("case{seed}.toml")))
        .args(["--seed", &seed.to_string(), "--random-departures"])
        .arg(case["info"]["random_departures"].to_string())
        .args(["--no-checkpoint-share", "0.3", "--checkpoint-gbps", "1"])
        .arg("--json")
        .arg(&replayed)
        .status()
        .unwrap();
    assert!(status.success());
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&replayed).unwrap()).unwrap();
    assert_eq!(
        r["policies"]["commons"]["jct_mean_s"],
        case["policies"]["commons"]["jct_mean_s"]
    );
    assert_eq!(
        r["policies"]["commons"]["preemptions"],
        case["policies"]["commons"]["preemptions"]
    );
}
