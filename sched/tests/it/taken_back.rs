//! A guest that an owner already took back borrows again only where another take-back
//! is unlikely (`Policy::taken_back_max_risk`), for at most
//! `Policy::taken_back_patience_s` after its last take-back.

use crate::support::*;
use commons_sched::*;

fn rates(per_hour: f64) -> Vec<f64> {
    vec![per_hour; WEEK_HOURS]
}

/// The rule as by default: no node expecting 0.1 take-backs or more within the job's
/// limit, for 12 hours after the last take-back.
fn strict() -> Policy {
    let p = Policy::default();
    assert_eq!(
        (p.taken_back_max_risk, p.taken_back_patience_s),
        (0.1, 12 * H)
    );
    p
}

/// An 8-hour job of lab 1, taken back `n` times, the last one hour ago.
fn guest(id: JobId, n: u32) -> QueuedJob {
    let mut j = job(id, 1, 10, 1);
    j.time_limit_s = 8 * H;
    j.take_backs = n;
    j.user = 10 + id;
    j.taken_back_at = if n > 0 { NOW - H } else { 0 };
    j
}

/// A node of lab 2 whose owner comes back 0.1 times an hour (0.8 in 8 hours).
fn risky() -> Node {
    let mut n = node(1, 2, 10, 2, "A100", 80);
    n.owner_return_rate = rates(0.1);
    n
}

#[test]
fn a_taken_back_guest_waits_rather_than_borrow_a_risky_node() {
    let s = snap(vec![risky()], vec![], vec![guest(1, 1), guest(2, 0)]);
    let p = plan(&s, &strict(), NOW);
    // The job never taken back borrows the node; the other waits, and says why.
    assert_eq!(started(&p), vec![2]);
    let Reason::NotLent { detail } = reason(&p, 1) else {
        panic!("unexpected reason {:?}", reason(&p, 1));
    };
    assert!(detail.contains("taken back"), "{detail}");
    assert!(detail.contains("n1"), "{detail}");
    // It reserves nothing on the risky node either.
    assert!(p
        .pending
        .iter()
        .all(|q| q.job != 1 || q.estimated_start.is_none()));
}

#[test]
fn a_taken_back_guest_goes_to_a_safe_node_even_against_best_fit() {
    // Node 2 expects 8 x 0.01 = 0.08 take-backs: under the limit (node 1: 0.8).
    let mut safe = node(2, 3, 20, 4, "A100", 80);
    safe.owner_return_rate = rates(0.01);
    let s = snap(vec![risky(), safe], vec![], vec![guest(1, 3)]);
    let p = plan(&s, &strict(), NOW);
    assert_eq!(p.start[0].node, 2);
    // A node without known return rates is safe.
    let s = snap(
        vec![risky(), node(3, 3, 30, 4, "A100", 80)],
        vec![],
        vec![guest(1, 3)],
    );
    assert_eq!(plan(&s, &strict(), NOW).start[0].node, 3);
}

#[test]
fn the_rule_ends_with_its_patience_and_turns_off() {
    // Taken back more than the patience ago: it borrows the risky node again.
    let mut old = guest(1, 2);
    old.taken_back_at = NOW - strict().taken_back_patience_s;
    let s = snap(vec![risky()], vec![], vec![old]);
    assert_eq!(started(&plan(&s, &strict(), NOW)), vec![1]);
    // Off (0, and without the churn knobs): the rule never applies.
    let s = snap(vec![risky()], vec![], vec![guest(1, 5)]);
    let zero = Policy {
        taken_back_max_risk: 0.0,
        ..strict()
    };
    assert_eq!(started(&plan(&s, &zero, NOW)), vec![1]);
    let off = strict().without_churn_knobs();
    assert_eq!(started(&plan(&s, &off, NOW)), vec![1]);
    // Its own lab's node is always fine, whatever its history.
    let mut own = node(4, 1, 40, 2, "A100", 80);
    own.owner_return_rate = rates(1.0);
    let s = snap(vec![risky(), own], vec![], vec![guest(1, 5)]);
    assert_eq!(plan(&s, &strict(), NOW).start[0].node, 4);
}
