//! The `commons-sim` binary end to end on a tiny trace.

use crate::support::HEADER;
use std::process::Command;

#[test]
fn replay_writes_json_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    let campus = dir.path().join("c.toml");
    std::fs::write(
        &trace,
        format!(
            "{HEADER}0,0,-,100,1,va,0\n1,10,-,200,2,vb,1\n2,20,-,50,1,va,2\n3,30,-,70,16,vb,3\n"
        ),
    )
    .unwrap();
    std::fs::write(
        &campus,
        "[[lab]]\nname = \"a\"\ntenants = [\"va\"]\nnodes = 1\n[[lab]]\nname = \"b\"\ntenants = [\"vb\"]\nnodes = 1\ngpus_per_node = 4\n",
    )
    .unwrap();
    let json = dir.path().join("out.json");
    let report = dir.path().join("report");
    let status = Command::new(env!("CARGO_BIN_EXE_commons-sim"))
        .args([
            "replay",
            "--quiet",
            "--policies",
            "isolated,share-fifo,commons,commons-nockpt",
        ])
        .arg("--trace")
        .arg(&trace)
        .arg("--campus")
        .arg(&campus)
        .arg("--json")
        .arg(&json)
        .arg("--report")
        .arg(&report)
        .status()
        .unwrap();
    assert!(status.success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["capped_jobs"], 1);
    for p in ["isolated", "share-fifo", "commons", "commons-nockpt"] {
        let m = &v["policies"][p];
        for key in [
            "utilization",
            "goodput",
            "jct_mean_s",
            "jct_p50_s",
            "jct_p95_s",
            "wait_mean_s",
            "wait_p95_s",
            "owner_wait_mean_s",
            "owner_wait_p95_s",
            "interactive_jobs",
            "interactive_wait_mean_s",
            "interactive_wait_p95_s",
            "batch_wait_mean_s",
            "batch_wait_p95_s",
            "preemptions",
            "lost_gpu_hours",
            "completed_jobs",
            "migrations_ok",
            "migrations_failed",
            "per_lab",
            "labs_worse_off",
        ] {
            assert!(m.get(key).is_some(), "{p}.{key} missing");
        }
        // The 16-GPU job is capped to the widest node (a's 8 GPUs): lab b alone, with
        // 4-GPU nodes, can never run it.
        let completed = if p == "isolated" { 3 } else { 4 };
        assert_eq!(m["completed_jobs"], completed, "{p}");
        assert!(m["per_lab"]["a"]["jobs"] == 2 && m["per_lab"]["b"]["wait_mean_s"].is_number());
    }
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(html.contains("<svg"), "the report has no plot");
}

#[test]
fn a_bad_campus_file_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let campus = dir.path().join("c.toml");
    std::fs::write(
        &campus,
        "[[lab]]\nname = \"a\"\nnodes = 1\ngpus_per_node = 0\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_commons-sim"))
        .arg("check-campus")
        .arg(&campus)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lab[0].gpus_per_node"), "{err}");
}

#[test]
fn a_time_window_replays_the_jobs_submitted_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    let campus = dir.path().join("c.toml");
    std::fs::write(
        &trace,
        format!("{HEADER}0,0,-,100,1,va,0\n1,1000,-,200,2,va,1\n2,2000,-,50,1,va,2\n3,3000,-,70,1,va,3\n"),
    )
    .unwrap();
    std::fs::write(
        &campus,
        "[[lab]]\nname = \"a\"\ntenants = [\"va\"]\nnodes = 1\n",
    )
    .unwrap();
    let replay = |window: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_commons-sim"))
            .args(["replay", "--quiet", "--policies", "share-fifo,commons"])
            .args(["--tick", "0", "--json", "-"])
            .arg("--trace")
            .arg(&trace)
            .arg("--campus")
            .arg(&campus)
            .args(window)
            .output()
            .unwrap()
    };
    // [1000, 3000): jobs 1 and 2, on their own clock (not shifted to 0).
    let out = replay(&["--from-s", "1000", "--until-s", "3000"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"], 2);
    assert_eq!(v["span_s"], 1000);
    for p in ["share-fifo", "commons"] {
        assert_eq!(v["policies"][p]["completed_jobs"], 2, "{p}");
        // Both start at submission on an idle campus: no wait, JCT = run time.
        assert_eq!(v["policies"][p]["wait_mean_s"], 0.0, "{p}");
        assert_eq!(v["policies"][p]["jct_mean_s"], 125.0, "{p}");
    }
    // --limit counts inside the window; one bound alone is fine.
    let out = replay(&["--from-s", "1000", "--limit", "1"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"], 1);
    assert_eq!(v["policies"]["commons"]["jct_mean_s"], 200.0);
    // Bad windows are errors that say what is wrong.
    let out = replay(&["--from-s", "3000", "--until-s", "1000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--from-s (3000) must be below --until-s (1000)"),
        "{err}"
    );
    let out = replay(&["--from-s", "5000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no job of the trace was submitted in [5000, inf)"),
        "{err}"
    );
}
