//! How attempts end: the usual end as one statement on PostgreSQL, the same rows as the
//! general path on both backends, and an end that crosses a cancel.

use super::tests::{backend, report, running, TIMING};
use super::*;
use crate::service::testkit::{campus, postgres, statements, take};

/// What an end left in a job's and its attempt's rows, to compare the two backends.
type EndRows = (
    JobState,
    Option<i64>,
    Option<String>,
    bool,
    Vec<(JobState, String)>,
    AttemptStatus,
    Option<i64>,
    Option<String>,
    bool,
);

fn end_rows(c: &mut DbConn, job: i64) -> EndRows {
    let j = db::jobs::get(c, job).unwrap();
    let a = db::attempts::find(c, job, 1).unwrap().unwrap();
    let events = db::jobs::events(c, job)
        .unwrap()
        .into_iter()
        .map(|e| (e.state, e.message))
        .collect();
    (
        j.state,
        j.exit_code,
        j.reason,
        j.finished_at.is_some(),
        events,
        a.state,
        a.exit_code,
        a.reason,
        a.ended_at.is_some(),
    )
}

fn ended(
    job: &Job,
    state: AttemptState,
    exit_code: Option<i64>,
    why: Option<&str>,
) -> AttemptReport {
    AttemptReport {
        exit_code,
        reason: why.map(str::to_string),
        ..report(job, state, None)
    }
}

/// The usual end (an exit, a failure) is three statements on PostgreSQL (it was nine:
/// BEGIN, the attempt's read and update, the job's read, its result, state, end time and
/// history row, COMMIT), and every end leaves the same rows on both backends: a success,
/// an exit code, a failure with its reason, a preempted guest that ended by itself
/// (settled) or failed (requeued: the general path), a cancelled job's container, and a
/// report from a node that does not run the attempt (nothing moves).
#[test]
fn an_end_is_three_statements_on_postgres_and_the_same_rows_on_both() {
    let mut seen_rows: Vec<Vec<EndRows>> = Vec::new();
    for pg in [false, true] {
        let (_sqlite, _pg, mut c) = backend(pg);
        let k = campus(&mut c, 7);
        let node = k.node.id;
        for j in &k.jobs {
            running(&mut c, node, j);
        }
        for j in &k.jobs[3..5] {
            let a = db::attempts::find(&mut c, j.id, 1).unwrap().unwrap();
            db::attempts::set_status(&mut c, a.id, AttemptStatus::Stopping).unwrap();
            set_state(&mut c, j.id, JobState::Preempting, "preempting").unwrap();
        }
        db::jobs::cancel(&mut c, &k.jobs[5], "alice").unwrap();

        let seen = statements(&mut c);
        let out = apply_report(
            &mut c,
            node,
            &ended(&k.jobs[0], AttemptState::Exited, Some(0), None),
            TIMING,
        )
        .unwrap();
        let sent = take(&seen);
        if pg {
            assert_eq!(sent.len(), 3, "{sent:#?}");
        }
        assert!(out.freed && out.stop.is_none(), "pg {pg}: {out:?}");
        let reports = [
            (
                1,
                ended(&k.jobs[1], AttemptState::Exited, Some(3), None),
                node,
            ),
            (
                2,
                ended(&k.jobs[2], AttemptState::Failed, None, Some("no such file")),
                node,
            ),
            (
                3,
                ended(&k.jobs[3], AttemptState::Exited, Some(0), None),
                node,
            ),
            (
                4,
                ended(&k.jobs[4], AttemptState::Failed, None, Some("oom")),
                node,
            ),
            (
                5,
                ended(&k.jobs[5], AttemptState::Exited, Some(137), None),
                node,
            ),
            (
                6,
                ended(&k.jobs[6], AttemptState::Exited, Some(0), None),
                node + 1,
            ),
        ];
        for (i, r, from) in reports {
            let out = apply_report(&mut c, from, &r, TIMING).unwrap();
            assert_eq!(out.freed, i != 6, "pg {pg}, job {i}");
            assert!(out.stop.is_none(), "pg {pg}, job {i}: {out:?}");
        }
        let rows: Vec<EndRows> = k.jobs.iter().map(|j| end_rows(&mut c, j.id)).collect();
        let states: Vec<(JobState, AttemptStatus)> = rows.iter().map(|r| (r.0, r.5)).collect();
        assert_eq!(
            states,
            [
                (JobState::Succeeded, AttemptStatus::Exited),
                (JobState::Failed, AttemptStatus::Exited),
                (JobState::Failed, AttemptStatus::Failed),
                (JobState::Succeeded, AttemptStatus::Exited),
                (JobState::Queued, AttemptStatus::Failed),
                (JobState::Cancelled, AttemptStatus::Exited),
                (JobState::Running, AttemptStatus::Running),
            ],
            "pg {pg}"
        );
        let last = |r: &EndRows| r.4.last().cloned().unwrap();
        assert_eq!(
            last(&rows[1]),
            (JobState::Failed, "exited with code 3".into())
        );
        assert_eq!(last(&rows[2]), (JobState::Failed, "no such file".into()));
        assert_eq!(rows[2].2.as_deref(), Some("no such file"));
        assert_eq!(
            last(&rows[5]),
            (JobState::Cancelled, "container stopped".into())
        );
        assert!(
            rows[0].3 && rows[0].8 && rows[0].1 == Some(0),
            "pg {pg}: {:?}",
            rows[0]
        );
        seen_rows.push(rows);
    }
    assert_eq!(seen_rows[0], seen_rows[1], "SQLite against PostgreSQL");
}

/// A cancel committed while an exit's statement waits for the job's row: the attempt
/// ends, and the job, no longer running, is settled by the general rules in the same
/// transaction (cancelled, its container stopped), not marked succeeded.
#[test]
fn an_exit_that_crosses_a_cancel_leaves_the_job_cancelled() {
    use diesel::{Connection, RunQueryDsl};
    let (g, mut c) = postgres();
    let k = campus(&mut c, 1);
    let (node, job) = (k.node.id, k.jobs[0].clone());
    running(&mut c, node, &job);
    // Another session cancels the job and holds its row until told to commit.
    let mut other = diesel::PgConnection::establish(&g.url()).unwrap();
    diesel::sql_query("BEGIN").execute(&mut other).unwrap();
    diesel::sql_query(format!(
        "UPDATE jobs SET state = 'cancelled' WHERE id = {}",
        job.id
    ))
    .execute(&mut other)
    .unwrap();
    let url = g.url();
    let report = ended(&job, AttemptState::Exited, Some(0), None);
    let exit = std::thread::spawn(move || {
        let mut c = crate::db::establish(&url).unwrap();
        apply_report(&mut c, node, &report, TIMING).unwrap()
    });
    // Wait, with a generous deadline, until the exit's statement waits for the row (seen
    // from a third session: one inside a transaction sees the activity of its start).
    let mut watch = diesel::PgConnection::establish(&g.url()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    #[derive(diesel::QueryableByName)]
    struct Waiting {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    loop {
        let w: Waiting = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .get_result(&mut watch)
        .unwrap();
        if w.n > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the exit never waited for the job's row (finished: {})",
            exit.is_finished()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    diesel::sql_query("COMMIT").execute(&mut other).unwrap();
    let out = exit.join().unwrap();
    assert!(out.freed);
    let rows = end_rows(&mut c, job.id);
    assert_eq!(
        (rows.0, rows.5),
        (JobState::Cancelled, AttemptStatus::Exited)
    );
    assert_eq!(
        rows.4.last().cloned().unwrap(),
        (JobState::Cancelled, "container stopped".into())
    );
    assert!(
        !rows.4.iter().any(|e| e.0 == JobState::Succeeded),
        "{:?}",
        rows.4
    );
}
