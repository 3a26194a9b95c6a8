//! What the scheduler does with what the portal knows of checkpoints: write times
//! (`RunningJob::checkpoint_write_s`) for victims and grace periods, and guests that
//! would lose much work (`Policy::spare_costly_guests_gpu_hours`).

use crate::support::*;
use commons_sched::*;

/// Lab 1 owns node 1 (4 GPUs) where lab 2's guests run; lab 1 submits a 4-GPU job of
/// 100 hours (2 % of it, the most it is delayed for guests' sake, is 2 hours).
fn owner_needs_the_node(guests: Vec<RunningJob>) -> Snapshot {
    let mut owner = job(1, 1, 10, 4);
    owner.time_limit_s = 100 * H;
    let mut s = snap(vec![node(1, 1, 1, 4, "A100", 80)], guests, vec![owner]);
    s.nodes[0].grace_s = 60;
    s
}

#[test]
fn a_guest_whose_checkpoint_takes_longer_than_the_grace_gets_a_longer_one() {
    let policy = Policy::default();
    let grace = |write: Option<i64>| {
        let mut guest = run(100, 2, 1, &[1, 2, 3, 4], NOW - 600);
        guest.last_checkpoint_at = Some(NOW - 60);
        guest.checkpoint_write_s = write;
        let p = plan(&owner_needs_the_node(vec![guest]), &policy, NOW);
        assert_eq!(preempted(&p), vec![100], "{p:#?}");
        p.preempt[0].grace_s
    };
    // Unknown or within the node's 60 s: the node's grace.
    assert_eq!(grace(None), 60);
    assert_eq!(grace(Some(45)), 60);
    // 200 s: a quarter more, 250 s.
    assert_eq!(grace(Some(200)), 250);
    // 500 s: 625 s capped at the policy's 600 s.
    assert_eq!(grace(Some(500)), 600);
    // 700 s cannot be covered: the node's grace.
    assert_eq!(grace(Some(700)), 60);
    // A one-hour owner job is delayed by at most 2 % of it, 72 s: a 100 s write gets
    // 125 s, a 200 s one cannot be covered.
    let short = |write: i64| {
        let mut guest = run(100, 2, 1, &[1, 2, 3, 4], NOW - 600);
        guest.checkpoint_write_s = Some(write);
        let mut s = owner_needs_the_node(vec![guest]);
        s.queue[0].time_limit_s = H;
        plan(&s, &policy, NOW).preempt[0].grace_s
    };
    assert_eq!(short(100), 125);
    assert_eq!(short(200), 60);
    let off = Policy {
        grace_covers_checkpoint_s: 0,
        ..Policy::default()
    };
    let mut guest = run(100, 2, 1, &[1, 2, 3, 4], NOW - 600);
    guest.checkpoint_write_s = Some(200);
    let p = plan(&owner_needs_the_node(vec![guest]), &off, NOW);
    assert_eq!(p.preempt[0].grace_s, 60);
}

#[test]
fn a_guest_that_saves_on_stop_is_the_cheaper_victim() {
    // Two 2-GPU guests; the owner needs 2 GPUs. Guest 100 checkpointed 20 minutes ago;
    // guest 101 an hour ago but writes its checkpoint in 30 s, within the grace: it
    // loses nothing but its restart when stopped, so it goes first.
    let mut a = run(100, 2, 1, &[1, 2], NOW - 3 * H);
    a.last_checkpoint_at = Some(NOW - 1200);
    let mut b = run(101, 3, 1, &[3, 4], NOW - 3 * H);
    b.last_checkpoint_at = Some(NOW - H);
    b.checkpoint_write_s = Some(30);
    let mut s = owner_needs_the_node(vec![a.clone(), b.clone()]);
    s.queue = vec![job(1, 1, 10, 2)];
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![101]);
    // Blind to write times (commons-old), the least work since a checkpoint wins.
    let old = Policy::default().without_churn_knobs();
    let p = plan(&s, &old, NOW);
    assert_eq!(preempted(&p), vec![100]);
}

/// The rule for costly guests is off by default; on at 8 GPU-hours.
fn sparing() -> Policy {
    Policy {
        spare_costly_guests_gpu_hours: 8.0,
        ..Policy::default()
    }
}

#[test]
fn an_owner_job_spares_guests_that_would_lose_much_work_for_a_while() {
    // A 4-GPU guest without a checkpoint for 3 hours: stopping it loses 12 GPU-hours.
    let guest = run(100, 2, 1, &[1, 2, 3, 4], NOW - 3 * H);
    let s = owner_needs_the_node(vec![guest]);
    assert_eq!(preempted(&plan(&s, &Policy::default(), NOW)), vec![100]);
    let p = plan(&s, &sparing(), NOW);
    assert!(p.preempt.is_empty(), "{p:#?}");
    let waited = NOW - s.queue[0].submitted_at;
    match reason(&p, 1) {
        Reason::SparingGuests {
            node,
            lost_gpu_hours,
            wait_s,
        } => {
            assert_eq!(node, "n1");
            assert_eq!(lost_gpu_hours, 12);
            assert_eq!(wait_s, 2 * H - waited);
        }
        other => panic!("{other:?}"),
    }
    assert!(reason(&p, 1).to_string().contains("12 GPU-hours"));
    // The same plan again: nothing new (a fixed point).
    let again = plan(&apply(&s, &p, NOW), &sparing(), NOW);
    assert!(again.preempt.is_empty() && again.start.is_empty());
    // Two hours after its submission it stops the guest.
    let later = s.queue[0].submitted_at + 2 * H;
    let p = plan(&s, &sparing(), later);
    assert_eq!(preempted(&p), vec![100]);
    // A one-hour owner job spares it for 2 % of its hour, 72 s: long gone by now.
    let mut short = s.clone();
    short.queue[0].time_limit_s = H;
    assert_eq!(preempted(&plan(&short, &sparing(), NOW)), vec![100]);
    // A recent checkpoint makes the guest cheap: stopped at once.
    let mut cheap = run(100, 2, 1, &[1, 2, 3, 4], NOW - 3 * H);
    cheap.last_checkpoint_at = Some(NOW - 600);
    let p = plan(&owner_needs_the_node(vec![cheap]), &sparing(), NOW);
    assert_eq!(preempted(&p), vec![100]);
    // commons-old never spares.
    let old = sparing().without_churn_knobs();
    assert_eq!(preempted(&plan(&s, &old, NOW)), vec![100]);
}

#[test]
fn the_owner_job_spares_guests_only_where_nothing_cheaper_exists() {
    // Node 1 has the costly guest, node 2 (also lab 1's) a cheap one: node 2 it is.
    let costly = run(100, 2, 1, &[1, 2, 3, 4], NOW - 3 * H);
    let mut cheap = run(101, 2, 2, &[5, 6, 7, 8], NOW - 3 * H);
    cheap.last_checkpoint_at = Some(NOW - 300);
    let mut s = owner_needs_the_node(vec![costly, cheap]);
    s.nodes.push(node(2, 1, 5, 4, "A100", 80));
    let p = plan(&s, &sparing(), NOW);
    assert_eq!(preempted(&p), vec![101]);
}
