//! Extending a running attempt's time limit (an interactive job's "extend"): the rule on
//! one observation, and the executor applying a `Renew`'s time limits (deadline moved,
//! `lease.json` rewritten for the guard, the attempt not stopped at its first limit).

use super::fake_runtime::*;
use super::reconcile::{running, secs, stopping};
use commons_agent::clock;
use commons_agent::reconcile::{Why, ENFORCE_GRACE};
use commons_proto::{AttemptState, StopReason, TimeLimit};

#[test]
fn a_time_limit_only_grows_and_only_while_the_attempt_runs() {
    let mut h = running(1);
    let first = h.deadline.unwrap();
    assert!(
        !h.extend_time_limit(secs(7200)),
        "unknown first limit: cannot say how far to move the deadline"
    );
    h.time_limit = Some(secs(3600));
    assert!(h.extend_time_limit(secs(5400)));
    assert_eq!(h.deadline, Some(first + secs(1800)));
    assert_eq!(h.time_limit, Some(secs(5400)));
    assert!(!h.extend_time_limit(secs(5400)), "the same limit again");
    assert!(!h.extend_time_limit(secs(60)), "a limit never shrinks");
    assert_eq!(h.deadline, Some(first + secs(1800)));

    let mut h = stopping(running(2), Why::of(StopReason::TimeLimit), 10);
    h.time_limit = Some(secs(60));
    assert!(
        !h.extend_time_limit(secs(600)),
        "too late once the stop has begun"
    );
}

#[tokio::test]
async fn a_renew_with_a_longer_time_limit_moves_the_deadline_and_lease_json() {
    let Setup {
        exec,
        mut ev,
        rt,
        dir,
    } = setup();
    let now = clock::now();
    exec.start(7, 1, spec("demo", 30), vec![], far(&exec));
    ev.state_of(7, Some(AttemptState::Running)).await;
    let first = exec.time_limit_deadline(7, 1).unwrap();
    assert_eq!(lease_file(dir.path(), 7, 1).time_limit_s, Some(30));

    // Another attempt's limit and an unknown attempt's are no business of attempt 7.
    let limits = [
        TimeLimit {
            job: 7,
            attempt: 1,
            time_limit_s: 30 + 600,
        },
        TimeLimit {
            job: 99,
            attempt: 1,
            time_limit_s: 1,
        },
    ];
    exec.set_time_limits(&limits);
    let moved = exec.time_limit_deadline(7, 1).unwrap();
    assert_eq!(moved, first + secs(600));
    let on_disk = lease_file(dir.path(), 7, 1);
    assert_eq!(
        on_disk.time_limit_deadline_ms,
        Some(clock::to_ms(moved)),
        "the guard reads the new deadline"
    );
    assert_eq!(on_disk.time_limit_s, Some(630));

    // Repeated in every Renew: the same limit moves nothing further.
    exec.set_time_limits(&limits);
    assert_eq!(exec.time_limit_deadline(7, 1), Some(moved));

    exec.step(now + secs(60));
    assert_eq!(
        state_in_reports(&exec, 7),
        Some(AttemptState::Running),
        "past its first limit, still running"
    );
    assert!(stops(&rt).is_empty());
    exec.step(now + secs(700));
    let end = ev.final_of(7).await;
    assert_eq!(end.stop, Some(StopReason::TimeLimit), "the new limit holds");
    assert_eq!(stops(&rt), [(id_of(7, 1), ENFORCE_GRACE)]);
}
