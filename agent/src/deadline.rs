//! The one rule for when a running attempt's time is up: its lease lapsed or its time
//! limit was reached. The agent's reconcile loop and the attempt's guard both ask it, so
//! the two can never disagree about a deadline (only about who acts on it).
//!
//! Pure: times are [`Duration`]s on the boot clock (`clock`), `now` is an argument.
//!
//! Invariants:
//! - A lease holds up to and including its deadline, and has lapsed only after it: the
//!   portal grants "until t", and a stop at exactly t would cut short what it granted.
//! - A time limit is reached at its deadline: the job had all the time it was given.
//! - The lease is asked first: when both ran out, the attempt stops because its lease
//!   lapsed, which the portal requeues (the server lost contact), rather than for its time
//!   limit, which would end the job.

use commons_proto::StopReason;
use std::time::Duration;

/// Whether a lease granted until `until` has lapsed at `now`.
pub fn lease_lapsed(until: Duration, now: Duration) -> bool {
    now > until
}

/// Whether a time limit that ends at `at` has been reached at `now`.
pub fn time_limit_reached(at: Duration, now: Duration) -> bool {
    now >= at
}

/// Why an attempt must stop at `now`, if one of its deadlines passed: `lease` is when its
/// lease runs out, `time_limit` when its time limit does (`None`: not known here).
pub fn passed(
    lease: Option<Duration>,
    time_limit: Option<Duration>,
    now: Duration,
) -> Option<StopReason> {
    if lease.is_some_and(|until| lease_lapsed(until, now)) {
        return Some(StopReason::LeaseExpired);
    }
    if time_limit.is_some_and(|at| time_limit_reached(at, now)) {
        return Some(StopReason::TimeLimit);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lease_lapses_only_after_its_deadline() {
        assert_eq!(passed(Some(s(10)), None, s(9)), None);
        assert_eq!(passed(Some(s(10)), None, s(10)), None, "granted until 10");
        assert_eq!(
            passed(Some(s(10)), None, s(10) + MS),
            Some(StopReason::LeaseExpired)
        );
    }

    #[test]
    fn a_time_limit_is_reached_at_its_deadline() {
        assert_eq!(passed(None, Some(s(20)), s(20) - MS), None);
        assert_eq!(
            passed(None, Some(s(20)), s(20)),
            Some(StopReason::TimeLimit),
            "the job had all its time"
        );
        assert_eq!(
            passed(None, Some(s(20)), s(99)),
            Some(StopReason::TimeLimit)
        );
    }

    #[test]
    fn neither_deadline_passed_or_known() {
        assert_eq!(passed(Some(s(10)), Some(s(20)), s(5)), None);
        assert_eq!(passed(None, None, s(1_000_000)), None, "nothing to enforce");
        assert_eq!(passed(Some(Duration::ZERO), None, Duration::ZERO), None);
    }

    #[test]
    fn the_lease_comes_first_when_both_ran_out() {
        assert_eq!(
            passed(Some(s(10)), Some(s(10)), s(11)),
            Some(StopReason::LeaseExpired)
        );
        assert_eq!(
            passed(Some(s(30)), Some(s(10)), s(30)),
            Some(StopReason::TimeLimit),
            "the lease still holds at its deadline; the time limit is over"
        );
    }
}
