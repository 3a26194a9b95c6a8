//! The interactive boost (`LabInfo::interactive_boost`): a lab's interactive jobs go
//! ahead of its batch jobs, on its own nodes and in its turn as a guest, but never ahead
//! of another lab.

use commons_sched::*;

use crate::support::*;

fn interactive(mut j: QueuedJob) -> QueuedJob {
    j.interactive = true;
    j
}

fn boosting(id: LabId, on: bool) -> LabInfo {
    LabInfo {
        id,
        interactive_boost: on,
        ..Default::default()
    }
}

/// Lab 1 owns one node with two free GPUs; its queue is two batch jobs, then an
/// interactive one.
fn owner_queue(boost: bool) -> Snapshot {
    let mut s = snap(
        vec![node(1, 1, 1, 2, "A100", 80)],
        vec![],
        vec![
            job(1, 1, 11, 1),
            job(2, 1, 11, 1),
            interactive(job(3, 1, 11, 1)),
        ],
    );
    s.labs = vec![boosting(1, boost)];
    s
}

#[test]
fn without_the_boost_an_interactive_job_waits_its_turn() {
    let p = plan(&owner_queue(false), &Policy::default(), NOW);
    assert_eq!(started(&p), [1, 2]);
    assert_eq!(
        reason(&p, 3),
        Reason::WaitingForOwnJobs { node: "n1".into() }
    );
}

#[test]
fn with_the_boost_it_goes_ahead_of_the_labs_batch_jobs() {
    let p = plan(&owner_queue(true), &Policy::default(), NOW);
    assert_eq!(started(&p), [3, 1]);
    assert_eq!(p.pending.len(), 1);
    assert_eq!(p.pending[0].job, 2);
}

#[test]
fn the_boost_goes_across_the_labs_members() {
    // Member 12 has used far more than member 11: without the boost, 11 goes first.
    let mut s = snap(
        vec![node(1, 1, 1, 1, "A100", 80)],
        vec![],
        vec![job(1, 1, 11, 1), interactive(job(2, 1, 12, 1))],
    );
    s.members = vec![
        MemberInfo {
            lab: 1,
            user: 12,
            used_gpu_hours: 500.0,
            ledger_at: NOW,
            ..Default::default()
        },
        MemberInfo {
            lab: 1,
            user: 11,
            ledger_at: NOW,
            ..Default::default()
        },
    ];
    s.labs = vec![boosting(1, false)];
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), [1]);
    s.labs = vec![boosting(1, true)];
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), [2]);
}

#[test]
fn as_a_guest_the_boost_orders_the_labs_own_turn() {
    // Lab 2 owns nothing and borrows lab 1's one free GPU.
    let mut s = snap(
        vec![node(1, 1, 1, 1, "A100", 80)],
        vec![],
        vec![job(1, 2, 21, 1), interactive(job(2, 2, 21, 1))],
    );
    s.labs = vec![boosting(2, false)];
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), [1]);
    s.labs = vec![boosting(2, true)];
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), [2]);
}

#[test]
fn the_boost_never_takes_another_labs_turn() {
    // Labs 2 and 3 borrow; lab 3 has used less, so its batch job goes first, whatever
    // lab 2 boosts.
    let mut s = snap(
        vec![node(1, 1, 1, 1, "A100", 80)],
        vec![],
        vec![interactive(job(1, 2, 21, 1)), job(2, 3, 31, 1)],
    );
    let mut two = boosting(2, true);
    two.used_gpu_hours = 100.0;
    two.ledger_at = NOW;
    s.labs = vec![two, boosting(3, false)];
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), [2]);
    assert_eq!(reason(&p, 1), Reason::WaitingForGpus { gpus: 1 });
}

#[test]
fn a_boosted_plan_is_a_fixed_point() {
    let s = owner_queue(true);
    let p = plan(&s, &Policy::default(), NOW);
    let next = apply(&s, &p, NOW);
    let again = plan(&next, &Policy::default(), NOW);
    assert!(
        again.start.is_empty() && again.preempt.is_empty(),
        "{again:?}"
    );
}
