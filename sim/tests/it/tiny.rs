//! Hand-made traces with known answers, through the real scheduler and the baselines.

use crate::support::{campus, run, times, workload};
use commons_sim::{replay, PolicyKind, ReplaySettings};

const ONE_LAB: &str = r#"
grace_seconds = 60
checkpoint_interval_minutes = 10
[[lab]]
name = "a"
tenants = ["va"]
nodes = 1
gpus_per_node = 2
"#;

#[test]
fn one_lab_queues_first_come_first_served() {
    let c = campus(ONE_LAB);
    // A 2-GPU job holds the node for 100 s; a 1-GPU job submitted at 10 waits for it.
    let w = workload(&c, &[(0, 100, 2, "va"), (10, 50, 1, "va")]);
    for p in PolicyKind::ALL {
        let (out, m) = run(&c, &w, p);
        assert_eq!(
            times(&out),
            vec![(Some(0), Some(100)), (Some(100), Some(150))],
            "{p}"
        );
        assert_eq!(m.jct_mean_s, Some(120.0), "{p}");
        assert_eq!(m.wait_mean_s, Some(45.0), "{p}");
        assert_eq!(m.wait_p95_s, Some(90.0), "{p}");
        assert_eq!(m.owner_wait_mean_s, Some(45.0), "{p}");
        // Both GPUs are busy over the whole span [0, 10].
        assert_eq!(m.utilization, 1.0, "{p}");
        assert_eq!(m.goodput, 1.0, "{p}");
        assert_eq!(m.completed_jobs, 2);
        assert_eq!(m.preemptions, 0);
    }
}

const TWO_LABS: &str = r#"
[[lab]]
name = "a"
tenants = ["va"]
nodes = 1
gpus_per_node = 1
[[lab]]
name = "b"
tenants = ["vb"]
nodes = 1
gpus_per_node = 1
[[lab]]
name = "c"
tenants = ["vc"]
"#;

#[test]
fn two_labs_share_idle_gpus_only_when_pooled() {
    let c = campus(TWO_LABS);
    // Lab b submits two jobs at once; lab a is idle until t=1000.
    let w = workload(
        &c,
        &[(0, 100, 1, "vb"), (0, 100, 1, "vb"), (1000, 10, 1, "va")],
    );
    let (out, m) = run(&c, &w, PolicyKind::Isolated);
    assert_eq!(
        times(&out),
        vec![
            (Some(0), Some(100)),
            (Some(100), Some(200)),
            (Some(1000), Some(1010))
        ]
    );
    assert_eq!(m.per_lab["b"].jct_mean_s, Some(150.0));
    // 200 busy GPU-seconds of 2 GPUs x 1000 s (lab a's job runs after the span).
    assert_eq!(m.utilization, 0.1);
    for p in [PolicyKind::ShareFifo, PolicyKind::Commons] {
        let (out, m) = run(&c, &w, p);
        assert_eq!(
            times(&out),
            vec![
                (Some(0), Some(100)),
                (Some(0), Some(100)),
                (Some(1000), Some(1010))
            ],
            "{p}"
        );
        assert_eq!(m.per_lab["b"].jct_mean_s, Some(100.0), "{p}");
        // Only the job that ran on b's own node counts as an owner wait.
        assert_eq!(m.owner_wait_mean_s, Some(0.0), "{p}");
        assert_eq!(m.labs_worse_off, None);
    }
}

#[test]
fn borrow_only_lab_runs_nowhere_when_isolated() {
    let c = campus(TWO_LABS);
    let w = workload(&c, &[(0, 100, 1, "vc"), (50, 100, 1, "va")]);
    let r = replay(&c, &w, &ReplaySettings::default(), &mut |_, _| {}).unwrap();
    let iso = &r.summary.policies["isolated"];
    assert_eq!(iso.unfinished_jobs, 1);
    assert_eq!(iso.per_lab["c"].jct_mean_s, None);
    let fifo = &r.summary.policies["share-fifo"];
    assert_eq!(fifo.completed_jobs, 2);
    assert_eq!(fifo.per_lab["c"].jct_mean_s, Some(100.0));
    // Lab c is not worse off for getting served at all; lab a is as fast as alone.
    assert_eq!(fifo.labs_worse_off, Some(0));
    assert_eq!(iso.labs_worse_off, Some(0));
}

#[test]
fn wide_jobs_are_capped_to_the_widest_node() {
    let c = campus(ONE_LAB);
    let w = workload(&c, &[(0, 100, 16, "va")]);
    assert_eq!(w.capped, 1);
    let (out, m) = run(&c, &w, PolicyKind::Commons);
    assert_eq!(times(&out), vec![(Some(0), Some(100))]);
    assert_eq!(m.completed_jobs, 1);
}

#[test]
fn same_seed_gives_the_same_json() {
    let c = campus(TWO_LABS);
    let rows: Vec<(i64, i64, u32, &str)> = (0..200)
        .map(|i| {
            (
                i * 37,
                500 + (i * 7919) % 4000,
                1,
                ["va", "vb", "vc"][i as usize % 3],
            )
        })
        .collect();
    let w = workload(&c, &rows);
    let settings = ReplaySettings {
        seed: 7,
        random_departures: 4,
        ..ReplaySettings::default()
    };
    let json = || {
        let r = replay(&c, &w, &settings, &mut |_, _| {}).unwrap();
        serde_json::to_string_pretty(&r.summary).unwrap()
    };
    let first = json();
    assert_eq!(first, json());
    assert!(first.contains("\"random_departures\": 4"));
    // Policies on threads of their own: the same JSON, the outputs in the same order.
    let threaded = ReplaySettings {
        threads: 3,
        ..settings.clone()
    };
    let r = replay(&c, &w, &threaded, &mut |_, _| {}).unwrap();
    assert_eq!(serde_json::to_string_pretty(&r.summary).unwrap(), first);
    let order: Vec<_> = r.outputs.iter().map(|o| o.policy).collect();
    assert_eq!(order, settings.policies);
    let other = ReplaySettings {
        seed: 8,
        ..settings.clone()
    };
    let r = replay(&c, &w, &other, &mut |_, _| {}).unwrap();
    assert_eq!(r.summary.seed, 8);
}

const GUEST_CAMPUS: &str = r#"
grace_seconds = 60
checkpoint_interval_minutes = 10
[[lab]]
name = "a"
tenants = ["va"]
nodes = 1
gpus_per_node = 1
[[lab]]
name = "b"
tenants = ["vb"]
nodes = 1
gpus_per_node = 1
"#;

#[test]
fn owner_arriving_while_a_guest_runs_under_the_real_policy() {
    let c = campus(GUEST_CAMPUS);
    // Lab b fills both GPUs at t=0 (one job is a guest on a's node); lab a's job
    // arrives at t=1000 and takes its GPU back after the 60 s grace.
    let w = workload(
        &c,
        &[
            (0, 10_000, 1, "vb"),
            (0, 3_000, 1, "vb"),
            (1000, 500, 1, "va"),
        ],
    );
    // `commons` also checkpoints within the grace period (`checkpoint_on_stop`) and
    // loses nothing.
    for (policy, lost_h) in [
        (PolicyKind::Commons, 0.0),
        (PolicyKind::CommonsOld, 0.13),
        (PolicyKind::OldStopCkpt, 0.0),
        (PolicyKind::CommonsNoCkpt, 0.29),
    ] {
        let (out, m) = run(&c, &w, policy);
        assert_eq!(times(&out)[2], (Some(1060), Some(1560)), "{policy}");
        assert_eq!(m.preemptions, 1, "{policy}");
        assert_eq!(m.per_lab["a"].owner_wait_mean_s, Some(60.0), "{policy}");
        // The guest ran 1060 s: with a checkpoint every 600 s it loses 460 s, else all.
        assert_eq!(m.lost_gpu_hours, lost_h, "{policy}");
        assert_eq!(m.completed_jobs, 3);
    }
    // The baselines never preempt: the owner waits for the guest to finish.
    let (out, m) = run(&c, &w, PolicyKind::ShareFifo);
    assert_eq!(m.preemptions, 0);
    assert_eq!(times(&out)[2].0, Some(3000));
}

#[test]
fn the_scheduler_runs_on_ticks() {
    let c = campus(ONE_LAB);
    let w = workload(
        &c,
        &[(5, 100, 1, "va"), (30, 100, 1, "va"), (31, 10, 2, "va")],
    );
    let opts = commons_sim::SimOptions {
        tick_s: 30,
        ..commons_sim::SimOptions::new(PolicyKind::Commons)
    };
    let out = commons_sim::simulate(&c, &w, &opts, &mut |_| {}).unwrap();
    // Submitted at 5: planned at the tick at 30. The 2-GPU job waits for both GPUs
    // (free at 130) and starts at the next tick, 150.
    assert_eq!(
        times(&out),
        vec![
            (Some(30), Some(130)),
            (Some(30), Some(130)),
            (Some(150), Some(160))
        ]
    );
}

#[test]
fn lending_rules_and_borrowing_quota_bind_the_commons_policy() {
    for rule in ["lend = \"never\"", "max_lent_gpus_per_node = 0"] {
        for (a_rule, b_rule) in [(rule, ""), ("", "max_borrowed_gpus = 0")] {
            let c = campus(&format!(
                "[[lab]]\nname = \"a\"\ntenants = [\"va\"]\nnodes = 1\ngpus_per_node = 1\n{a_rule}\n\
                 [[lab]]\nname = \"b\"\ntenants = [\"vb\"]\nnodes = 1\ngpus_per_node = 1\n{b_rule}\n"
            ));
            let w = workload(&c, &[(0, 100, 1, "vb"), (0, 100, 1, "vb")]);
            let (out, _) = run(&c, &w, PolicyKind::Commons);
            let case = (a_rule, b_rule);
            assert_eq!(
                times(&out),
                vec![(Some(0), Some(100)), (Some(100), Some(200))],
                "{case:?}"
            );
            // share-fifo knows no owners and no rules.
            let (out, _) = run(&c, &w, PolicyKind::ShareFifo);
            assert_eq!(times(&out)[1], (Some(0), Some(100)), "{case:?}");
        }
    }
}
