//! The engine's mechanics (grace periods, checkpoints, requeues, departures, plan
//! checks) with known answers, using a scripted planner or the FCFS baselines so that
//! the answers do not depend on how the real policy evolves.

use crate::support::{campus, times, workload};
use commons_sched::{Plan, Preempt, Start};
use commons_sim::engine::SimError;
use commons_sim::metrics::summarize;
use commons_sim::{simulate_with, PolicyKind, SimOptions};

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

fn start(job: i64, node: i64, gpu: i64) -> Start {
    Start {
        job,
        node,
        gpus: vec![gpu],
        share: None,
    }
}

/// Owner `a` arrives at t=1000 while b's guest job 1 runs on a's only GPU: the script
/// preempts the guest, which stops after the 60 s grace; the owner starts then.
fn owner_reclaims(now: i64) -> Plan {
    let mut plan = Plan::default();
    match now {
        0 => plan.start = vec![start(0, 1, 100), start(1, 0, 0)],
        1000 => {
            plan.preempt = vec![Preempt {
                job: 1,
                grace_s: 60,
                reason: "owner".into(),
            }]
        }
        1060 => plan.start = vec![start(2, 0, 0)],
        1560 => plan.start = vec![start(1, 0, 0)],
        _ => {}
    }
    plan
}

#[test]
fn owner_arriving_while_a_guest_runs() {
    let c = campus(GUEST_CAMPUS);
    let w = workload(
        &c,
        &[
            (0, 10_000, 1, "vb"),
            (0, 3_000, 1, "vb"),
            (1000, 500, 1, "va"),
        ],
    );
    // With checkpoints every 600 s the guest keeps 600 s of its 1060 s and loses 460.
    // Without, it loses all 1060 s and runs its 3000 s again.
    for (policy, b1_finish, lost_h, goodput) in [
        (PolicyKind::CommonsOld, 1560 + 2400, 0.13, 0.8),
        (PolicyKind::CommonsNoCkpt, 1560 + 3000, 0.29, 0.5),
    ] {
        let opts = SimOptions::new(policy);
        let mut planner = |_: &_, _: &_, now| owner_reclaims(now);
        let out = simulate_with(&c, &w, &opts, &mut planner, &mut |_| {}).unwrap();
        assert_eq!(
            times(&out),
            vec![
                (Some(0), Some(10_000)),
                (Some(0), Some(b1_finish)),
                (Some(1060), Some(1560))
            ],
            "{policy}"
        );
        assert_eq!(out.jobs[1].attempts, 2);
        let m = summarize(&c, &w, &out);
        assert_eq!(m.preemptions, 1);
        assert_eq!(m.lost_gpu_hours, lost_h, "{policy}");
        assert_eq!(m.utilization, 1.0);
        assert_eq!(m.goodput, goodput, "{policy}");
        // The owner waited exactly the grace period.
        assert_eq!(m.per_lab["a"].owner_wait_mean_s, Some(60.0));
    }
}

#[test]
fn a_plan_that_double_books_a_gpu_is_an_error() {
    let c = campus(GUEST_CAMPUS);
    let w = workload(&c, &[(0, 100, 1, "va"), (0, 100, 1, "va")]);
    let mut planner = |_: &_, _: &_, _| Plan {
        start: vec![start(0, 0, 0), start(1, 0, 0)],
        ..Plan::default()
    };
    let opts = SimOptions::new(PolicyKind::Commons);
    let err = simulate_with(&c, &w, &opts, &mut planner, &mut |_| {}).unwrap_err();
    let SimError::BadPlan { now, message } = err;
    assert_eq!(now, 0);
    assert!(message.contains("not all free"), "{message}");
}

fn departing(checkpoint_minutes: u32, on_stop: bool, abrupt: bool) -> commons_sim::Campus {
    campus(&format!(
        r#"
        grace_seconds = 60
        checkpoint_interval_minutes = {checkpoint_minutes}
        checkpoint_on_stop = {on_stop}
        [[lab]]
        name = "a"
        tenants = ["va"]
        nodes = 2
        gpus_per_node = 1
        [[departure]]
        node = "a-0"
        leave_at_s = 1000
        return_at_s = 5000
        abrupt = {abrupt}
        "#
    ))
}

#[test]
fn a_leaving_node_migrates_its_jobs() {
    // (checkpoint minutes, checkpoint on stop, abrupt) -> finish, ok, failed
    let cases = [
        // Drains for 60 s, keeps 600 s of 1060 s, resumes on a-1 at 1060.
        ((10, false, false), 1060 + 2400, 1, 0),
        // Checkpoints when told to stop: nothing lost.
        ((10, true, false), 1060 + 1940, 1, 0),
        // Vanishes at 1000: keeps 600 s.
        ((10, false, true), 1000 + 2400, 1, 0),
        // No checkpoints: all 1060 s are lost, more than one interval.
        ((0, false, false), 1060 + 3000, 0, 1),
    ];
    for ((minutes, on_stop, abrupt), finish, ok, failed) in cases {
        let c = departing(minutes, on_stop, abrupt);
        let w = workload(&c, &[(0, 3000, 1, "va"), (6000, 10, 1, "va")]);
        let opts = SimOptions::new(PolicyKind::Isolated);
        let out = commons_sim::simulate(&c, &w, &opts, &mut |_| {}).unwrap();
        let case = (minutes, on_stop, abrupt);
        assert_eq!(out.jobs[0].finish, Some(finish), "{case:?}");
        assert_eq!(
            (out.migrations_ok, out.migrations_failed, out.preemptions),
            (ok, failed, 0),
            "{case:?}"
        );
        assert_eq!(out.jobs[1].finish, Some(6010));
    }
}
