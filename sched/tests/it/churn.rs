//! Fewer preemptions: guests placed where the owner is least likely to come back,
//! victims over their fair share first, and the re-lending hysteresis.

use crate::support::*;
use commons_sched::*;

/// Expected owner take-backs per hour, the same in every hour of the week.
fn rates(per_hour: f64) -> Vec<f64> {
    vec![per_hour; WEEK_HOURS]
}

#[test]
fn a_guest_goes_where_the_owner_rarely_comes_back() {
    // Two lending nodes; node 1 (the tighter fit) has an owner that comes back often.
    let mut busy = node(1, 2, 10, 2, "A100", 80);
    busy.owner_return_rate = rates(0.5);
    let mut quiet = node(2, 3, 20, 4, "A100", 80);
    quiet.owner_return_rate = rates(0.001);
    let mut j = job(1, 1, 10, 1);
    j.time_limit_s = 8 * H;
    let s = snap(vec![busy.clone(), quiet.clone()], vec![], vec![j.clone()]);
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(p.start[0].node, 2);
    // Without the knob best fit wins, as before.
    let old = Policy::default().without_churn_knobs();
    assert_eq!(plan(&s, &old, NOW).start[0].node, 1);
    // A short job has a low risk everywhere: best fit again.
    let mut short = j;
    short.time_limit_s = 60;
    let s = snap(vec![busy, quiet], vec![], vec![short]);
    assert_eq!(plan(&s, &Policy::default(), NOW).start[0].node, 1);
}

#[test]
fn a_risk_difference_under_one_class_leaves_best_fit() {
    // Over an 8-hour guest, node 1 expects 0.4 take-backs and node 2 about 0.01: with
    // the default classes of a tenth the safer node wins; with classes of one whole
    // take-back they are in one class and best fit (node 1) wins.
    let mut busy = node(1, 2, 10, 2, "A100", 80);
    busy.owner_return_rate = rates(0.05);
    let mut quiet = node(2, 3, 20, 4, "A100", 80);
    quiet.owner_return_rate = rates(0.001);
    let mut j = job(1, 1, 10, 1);
    j.time_limit_s = 8 * H;
    let s = snap(vec![busy, quiet], vec![], vec![j]);
    assert_eq!(plan(&s, &Policy::default(), NOW).start[0].node, 2);
    let whole = Policy {
        return_risk_step: 1.0,
        ..Policy::default()
    };
    assert_eq!(plan(&s, &whole, NOW).start[0].node, 1);
    // Nonsense widths read as a tenth.
    for step in [0.0, -1.0, f64::NAN] {
        let p = Policy {
            return_risk_step: step,
            ..Policy::default()
        };
        assert_eq!(p.return_risk_step_tenths(), 1);
    }
}

#[test]
fn victims_over_their_fair_share_go_first() {
    // Two guests on lab 1's node; lab 2 used far more than its share, lab 3 little.
    // Lab 3's guest checkpointed a minute ago, so without the knob it is the cheaper
    // victim; with it, lab 2's guest goes first.
    let mut heavy = run(100, 2, 1, &[10], NOW - 5 * H);
    heavy.last_checkpoint_at = Some(NOW - 2 * H);
    let mut light = run(101, 3, 1, &[11], NOW - 5 * H);
    light.last_checkpoint_at = Some(NOW - 60);
    let mut s = snap(
        vec![node(1, 1, 10, 2, "A100", 80)],
        vec![heavy, light],
        vec![job(1, 1, 10, 1)],
    );
    s.labs = vec![
        LabInfo {
            id: 2,
            used_gpu_hours: 5_000.0,
            ledger_at: NOW,
            ..Default::default()
        },
        LabInfo {
            id: 3,
            used_gpu_hours: 1.0,
            ledger_at: NOW,
            ..Default::default()
        },
    ];
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![100]);
    let old = Policy::default().without_churn_knobs();
    assert_eq!(preempted(&plan(&s, &old, NOW)), vec![101]);
}

#[test]
fn a_gpu_the_owner_just_released_is_not_lent_at_once() {
    let mut n = node(1, 2, 10, 1, "A100", 80);
    n.gpus[0].idle_since = NOW - 120;
    n.owner_return_rate = rates(0.2);
    let s = snap(vec![n.clone()], vec![], vec![job(1, 1, 10, 1)]);
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.start.is_empty());
    assert!(matches!(reason(&p, 1), Reason::NotLent { .. }), "{p:?}");
    // After the delay it is lent.
    assert_eq!(started(&plan(&s, &Policy::default(), NOW + 3600)), vec![1]);
    // An owner that rarely comes back: lent at once.
    n.owner_return_rate = rates(0.01);
    let s = snap(vec![n], vec![], vec![job(1, 1, 10, 1)]);
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), vec![1]);
}

#[test]
fn an_owner_job_borrows_a_safe_free_gpu_instead_of_preempting() {
    let own = node(1, 1, 10, 1, "A100", 80);
    let mut safe = node(2, 3, 20, 1, "A100", 80);
    safe.owner_return_rate = rates(0.001);
    let guest = run(100, 2, 1, &[10], NOW - 2 * H);
    let s = snap(
        vec![own.clone(), safe.clone()],
        vec![guest.clone()],
        vec![job(1, 1, 10, 1)],
    );
    // Off by default (it raised preemptions in the simulator, see docs/src/reports/simulator.md).
    assert_eq!(preempted(&plan(&s, &Policy::default(), NOW)), vec![100]);
    let on = Policy {
        owner_borrows_before_preempting: true,
        ..Policy::default()
    };
    let p = plan(&s, &on, NOW);
    assert!(p.preempt.is_empty(), "{p:?}");
    assert_eq!(p.start[0].node, 2);
    // The same campus under the old policy preempts the guest.
    let old = Policy::default().without_churn_knobs();
    assert_eq!(preempted(&plan(&s, &old, NOW)), vec![100]);
    // A risky node is no way out: the owner preempts on its own node.
    safe.owner_return_rate = rates(1.0);
    let s = snap(vec![own, safe], vec![guest], vec![job(1, 1, 10, 1)]);
    assert_eq!(preempted(&plan(&s, &on, NOW)), vec![100]);
}

#[test]
fn an_owner_job_waits_for_its_own_job_that_ends_soon_instead_of_preempting() {
    let campus = vec![node(1, 1, 10, 2, "A100", 80)];
    let mut own = run(100, 1, 1, &[10], NOW - H);
    own.time_limit_s = H + 300;
    let guest = run(101, 2, 1, &[11], NOW - 2 * H);
    let s = snap(
        campus.clone(),
        vec![own.clone(), guest.clone()],
        vec![job(1, 1, 10, 1)],
    );
    let patient = Policy {
        owner_patience_s: 600,
        ..Policy::default()
    };
    // Off by default (it made owners wait longer in the simulator, see docs/src/reports/simulator.md).
    assert_eq!(preempted(&plan(&s, &Policy::default(), NOW)), vec![101]);
    let p = plan(&s, &patient, NOW);
    assert!(p.preempt.is_empty() && p.start.is_empty(), "{p:?}");
    assert_eq!(
        reason(&p, 1),
        Reason::WaitingForOwnJobs { node: "n1".into() }
    );
    assert_eq!(p.pending[0].estimated_start, Some(NOW + 300));
    let old = Policy::default().without_churn_knobs();
    assert_eq!(preempted(&plan(&s, &old, NOW)), vec![101]);
    // An own job that ends in 20 minutes is too far off: the guest is preempted.
    own.time_limit_s = H + 1200;
    let s = snap(campus, vec![own, guest], vec![job(1, 1, 10, 1)]);
    assert_eq!(preempted(&plan(&s, &patient, NOW)), vec![101]);
}
