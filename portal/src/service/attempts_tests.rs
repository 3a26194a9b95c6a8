use super::*;
use crate::service::testkit::{campus, postgres, sqlite, statements, take, PgGuard};

pub(super) const TIMING: Timing = Timing {
    lease_ttl_s: 60,
    default_grace_s: 300,
    default_disk_gb: 20,
};

pub(super) fn report(job: &Job, state: AttemptState, stop: Option<StopReason>) -> AttemptReport {
    AttemptReport {
        job: job.id,
        attempt: 1,
        state,
        exit_code: None,
        stop,
        reason: None,
        gpu_memory_used_mb: None,
    }
}

/// A fresh database: PostgreSQL when `pg`, else SQLite (the guards keep it alive).
pub(super) fn backend(pg: bool) -> (Option<tempfile::TempDir>, Option<PgGuard>, DbConn) {
    if pg {
        let (g, c) = postgres();
        (None, Some(g), c)
    } else {
        let (d, c) = sqlite();
        (Some(d), None, c)
    }
}

/// The agent reports attempt 1 of `job` running on `node`.
pub(super) fn running(c: &mut DbConn, node: i64, job: &Job) -> ReportOutcome {
    apply_report(c, node, &report(job, AttemptState::Running, None), TIMING).unwrap()
}

#[test]
fn a_start_that_crosses_the_hello_is_delivered_again_not_lost() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 1);
    let job = &k.jobs[0];
    // The agent's Hello does not list the attempt: its Start is still on the wire.
    assert_eq!(reconcile_missing(&mut c, k.node.id, &[]).unwrap(), 0);
    assert_eq!(
        db::jobs::get(&mut c, job.id).unwrap().state,
        JobState::Starting
    );
    let clock = k.node.agent_clock().unwrap();
    let again = undelivered_starts(&mut c, k.node.id, &[], &clock, TIMING).unwrap();
    assert!(
        matches!(&again[..], [PortalMsg::Start { job: j, attempt: 1, lease, .. }]
            if *j == job.id && lease.session == 7 && lease.valid_for_s == 60),
        "{again:?}"
    );
    // Once running, an attempt its agent no longer reports is not lost at once (a
    // container may still run it somewhere until its lease ends): it is no longer
    // renewed, and requeued only when its lease has run out.
    running(&mut c, k.node.id, job);
    assert_eq!(reconcile_missing(&mut c, k.node.id, &[]).unwrap(), 1);
    assert_eq!(
        db::jobs::get(&mut c, job.id).unwrap().state,
        JobState::Running
    );
    let lease = |c: &mut DbConn| {
        db::attempts::find(c, job.id, 1)
            .unwrap()
            .unwrap()
            .lease_until
    };
    let before = lease(&mut c);
    let later = AgentClock {
        seq: clock.seq + 1,
        received_at: clock.received_at + chrono::Duration::seconds(30),
        ..clock
    };
    let PortalMsg::Renew { attempts, .. } =
        renew(&mut c, k.node.id, &later, 60, Renewable::Reported(&[])).unwrap()
    else {
        panic!("not a renewal")
    };
    assert!(attempts.is_empty(), "{attempts:?}");
    assert_eq!(lease(&mut c), before, "not renewed");
    let second = chrono::Duration::seconds(1);
    assert_eq!(expire_leases(&mut c, before - second).unwrap(), 0);
    assert_eq!(
        db::jobs::get(&mut c, job.id).unwrap().state,
        JobState::Running,
        "not before its lease ran out"
    );
    assert_eq!(expire_leases(&mut c, before + second).unwrap(), 1);
    assert_eq!(
        db::jobs::get(&mut c, job.id).unwrap().state,
        JobState::Queued
    );
}

#[test]
fn a_renewal_extends_what_the_agent_reports_and_what_still_starts() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 3);
    for j in &k.jobs[..2] {
        running(&mut c, k.node.id, j);
    }
    let clock = k.node.agent_clock().unwrap();
    // Job 0 reported, job 1 not (running), job 2 starting.
    let PortalMsg::Renew { attempts, .. } = renew(
        &mut c,
        k.node.id,
        &clock,
        60,
        Renewable::Reported(&[k.jobs[0].id]),
    )
    .unwrap() else {
        panic!("not a renewal")
    };
    assert_eq!(attempts, [(k.jobs[0].id, 1), (k.jobs[2].id, 1)]);
    // At shutdown, without reports: what the last renewal extended, and what starts.
    let until = clock.lease_until(60);
    let PortalMsg::Renew { attempts, .. } = renew(
        &mut c,
        k.node.id,
        &clock,
        600,
        Renewable::RenewedUntil(until),
    )
    .unwrap() else {
        panic!("not a renewal")
    };
    assert_eq!(attempts, [(k.jobs[0].id, 1), (k.jobs[2].id, 1)]);
}

#[test]
fn stop_reasons_decide_requeue_or_end() {
    for (why, end) in [
        (StopReason::LeaseExpired, JobState::Queued),
        (StopReason::Lost, JobState::Queued),
        (StopReason::TimeLimit, JobState::Failed),
    ] {
        let (_d, mut c) = sqlite();
        let k = campus(&mut c, 1);
        let job = &k.jobs[0];
        let t = TIMING;
        running(&mut c, k.node.id, job);
        let out = apply_report(
            &mut c,
            k.node.id,
            &report(job, AttemptState::Stopped, Some(why)),
            t,
        )
        .unwrap();
        assert!(out.freed);
        assert_eq!(db::jobs::get(&mut c, job.id).unwrap().state, end, "{why}");
    }
}

#[test]
fn a_preempted_guest_gets_its_grace_on_every_path() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 2);
    let t = TIMING;
    for j in &k.jobs {
        running(&mut c, k.node.id, j);
    }
    // Job 0 is being preempted, job 1 cancelled.
    let a0 = db::attempts::find(&mut c, k.jobs[0].id, 1)
        .unwrap()
        .unwrap();
    db::attempts::set_status(&mut c, a0.id, AttemptStatus::Stopping).unwrap();
    set_state(&mut c, k.jobs[0].id, JobState::Preempting, "preempting").unwrap();
    db::jobs::cancel(&mut c, &k.jobs[1], "alice").unwrap();
    let grace = |msgs: &[PortalMsg], job: i64| {
        msgs.iter()
            .find_map(|m| match m {
                PortalMsg::Stop {
                    job: j,
                    grace_s,
                    reason,
                    ..
                } if *j == job => Some((*grace_s, *reason)),
                _ => None,
            })
            .unwrap()
    };
    // After a reconnect: the campus default, then the node's own grace.
    let stops = pending_stops(&mut c, k.node.id, t).unwrap();
    assert_eq!(grace(&stops, k.jobs[0].id), (300, StopReason::Preempted));
    assert_eq!(
        grace(&stops, k.jobs[1].id),
        (SHORT_GRACE_S, StopReason::Cancelled)
    );
    db::nodes::set_lending(&mut c, k.node.id, "{}", 77, false).unwrap();
    let stops = pending_stops(&mut c, k.node.id, t).unwrap();
    assert_eq!(grace(&stops, k.jobs[0].id), (77, StopReason::Preempted));
    // In a heartbeat that still reports it running.
    let out = running(&mut c, k.node.id, &k.jobs[0]);
    assert_eq!(
        grace(out.stop.as_slice(), k.jobs[0].id),
        (77, StopReason::Preempted)
    );
}

#[test]
fn leases_count_from_when_the_portal_received_the_agents_message_and_never_shrink() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 1);
    let base = db::now();
    let clock = |seq, secs| AgentClock {
        session: 7,
        seq,
        received_at: base + chrono::Duration::seconds(secs),
    };
    let lease_of = |c: &mut DbConn| {
        db::attempts::find(c, k.jobs[0].id, 1)
            .unwrap()
            .unwrap()
            .lease_until
    };
    renew(
        &mut c,
        k.node.id,
        &clock(2, 0),
        1800,
        Renewable::Reported(&[]),
    )
    .unwrap();
    assert_eq!(lease_of(&mut c), base + chrono::Duration::seconds(1800));
    // A later, shorter renewal does not shrink what the agent may already hold.
    let msg = renew(
        &mut c,
        k.node.id,
        &clock(3, 10),
        60,
        Renewable::Reported(&[]),
    )
    .unwrap();
    assert_eq!(lease_of(&mut c), base + chrono::Duration::seconds(1800));
    assert!(
        matches!(msg, PortalMsg::Renew { lease, .. } if lease.seq == 3 && lease.valid_for_s == 60)
    );
    renew(
        &mut c,
        k.node.id,
        &clock(4, 2000),
        60,
        Renewable::Reported(&[]),
    )
    .unwrap();
    assert_eq!(lease_of(&mut c), base + chrono::Duration::seconds(2060));
}

#[test]
fn a_renewal_is_one_update_and_one_read_whatever_the_attempts() {
    use diesel::connection::{Connection, InstrumentationEvent};
    use std::sync::{Arc, Mutex};
    for n in [0, 1, 6] {
        let (_d, mut c) = sqlite();
        let k = campus(&mut c, n);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = e {
                s.lock().unwrap().push(query.to_string());
            }
        });
        let clock = AgentClock {
            session: 7,
            seq: 2,
            received_at: db::now(),
        };
        let PortalMsg::Renew {
            attempts,
            time_limits,
            ..
        } = renew(&mut c, k.node.id, &clock, 60, Renewable::Reported(&[])).unwrap()
        else {
            panic!("not a renewal")
        };
        assert_eq!((attempts.len(), time_limits.len()), (n, n));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), if n == 0 { 1 } else { 2 }, "{seen:#?}");
    }
}

#[test]
fn a_running_report_moves_its_job_once_and_keeps_the_first_start() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 1);
    let job = &k.jobs[0];
    running(&mut c, k.node.id, job);
    let j = db::jobs::get(&mut c, job.id).unwrap();
    assert_eq!(j.state, JobState::Running);
    let first = j.started_at.expect("a first start");
    // Reported again: nothing moves, no second history row.
    running(&mut c, k.node.id, job);
    let events = db::jobs::events(&mut c, job.id).unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.message == "attempt 1 running")
            .count(),
        1
    );
    // A later attempt keeps the job's first start time.
    assert!(db::jobs::set_running(&mut c, job.id, 1, first).is_ok_and(|m| !m));
    db::jobs::set_state(&mut c, job.id, JobState::Starting, "again").unwrap();
    let later = first + chrono::Duration::seconds(60);
    assert!(db::jobs::set_running(&mut c, job.id, 1, later).unwrap());
    assert_eq!(
        db::jobs::get(&mut c, job.id).unwrap().started_at,
        Some(first)
    );
    assert!(
        !db::jobs::set_running(&mut c, job.id, 2, later).unwrap(),
        "another attempt's report does not move it"
    );
}

/// The usual `Running` report is one statement on PostgreSQL (it was six: BEGIN, the
/// read, two UPDATEs, the history row, COMMIT), and does the same on both backends: the
/// attempt and its job run once, one history row, and a report from another node or
/// for an attempt that is not starting goes the general way.
#[test]
fn a_running_report_is_one_statement_on_postgres_and_the_same_on_both() {
    for pg in [false, true] {
        let (_sqlite, _pg, mut c) = backend(pg);
        let k = campus(&mut c, 2);
        let (job, other) = (&k.jobs[0], &k.jobs[1]);
        let seen = statements(&mut c);
        let out = running(&mut c, k.node.id, job);
        let sent = take(&seen);
        assert_eq!(sent.len(), if pg { 1 } else { 6 }, "pg {pg}: {sent:#?}");
        assert!(out.stop.is_none() && !out.freed);
        let a = db::attempts::find(&mut c, job.id, 1).unwrap().unwrap();
        let j = db::jobs::get(&mut c, job.id).unwrap();
        assert_eq!(
            (a.state, j.state),
            (AttemptStatus::Running, JobState::Running)
        );
        assert!(
            a.started_at.is_some() && j.started_at == a.started_at,
            "pg {pg}"
        );
        let running_rows = |c: &mut DbConn, id| {
            db::jobs::events(c, id)
                .unwrap()
                .iter()
                .filter(|e| e.message == "attempt 1 running" && e.state == JobState::Running)
                .count()
        };
        assert_eq!(running_rows(&mut c, job.id), 1, "pg {pg}");

        // Again: the attempt is running already, nothing moves, no second row.
        let out = running(&mut c, k.node.id, job);
        assert!(out.stop.is_none());
        assert_eq!(running_rows(&mut c, job.id), 1, "pg {pg}");

        // From a node that does not run it: told to stop, and nothing moves.
        let out = running(&mut c, k.node.id + 1, other);
        assert!(
            matches!(
                out.stop,
                Some(PortalMsg::Stop {
                    reason: StopReason::NotExpected,
                    ..
                })
            ),
            "pg {pg}: {:?}",
            out.stop
        );
        let a = db::attempts::find(&mut c, other.id, 1).unwrap().unwrap();
        assert_eq!(a.state, AttemptStatus::Starting, "pg {pg}");
        assert_eq!(running_rows(&mut c, other.id), 0, "pg {pg}");
    }
}
