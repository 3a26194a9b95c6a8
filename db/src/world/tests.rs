//! The world kept from the change log equals a fresh read after every kind of change the
//! portal makes, on both backends; a change the log lost is found by the check.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::rows::Rows;
use super::{changes, describe_difference, Update, World};
use crate::models::{AttemptStatus, JobState};
use crate::schema::*;
use crate::testkit;
use crate::{now, DbConn};
use commons_sched::Policy;
use diesel::prelude::*;

/// Takes in the changes, then compares with a fresh read built at the same instant.
fn follows(w: &mut World, c: &mut DbConn, step: &str) -> Update {
    let update = w.update(c).unwrap();
    let policy = Policy::default();
    let t = now();
    let ours = super::built(&w.rows, &policy, t);
    let theirs = super::built(&Rows::load(c, t).unwrap(), &policy, t);
    assert_eq!(describe_difference(&ours, &theirs), None, "after {step}");
    update
}

fn every_change(c: &mut DbConn) {
    let campus = testkit::campus(c, 2);
    let node = campus.node.id;
    let lab = campus.node.lab_id;
    let user = campus.jobs[0].user_id;
    let mut w = World::load(c).unwrap();
    assert_eq!(w.snapshot(&Policy::default()).running.len(), 2);
    assert_eq!(follows(&mut w, c, "nothing"), Update::Changes(0));

    // Submissions, a job held back and released, a cancel.
    let queued: Vec<i64> = (0..3)
        .map(|_| {
            crate::jobs::insert(c, user, &testkit::demo_job(lab))
                .unwrap()
                .id
        })
        .collect();
    follows(&mut w, c, "three submissions");
    assert_eq!(w.queued(), 3);
    diesel::update(jobs::table.find(queued[0]))
        .set(jobs::held.eq(true))
        .execute(c)
        .unwrap();
    follows(&mut w, c, "a job held");
    assert_eq!(w.queued(), 2);
    diesel::update(jobs::table.find(queued[0]))
        .set(jobs::held.eq(false))
        .execute(c)
        .unwrap();
    crate::jobs::set_state(c, queued[2], JobState::Cancelled, "cancelled").unwrap();
    follows(&mut w, c, "a job released, another cancelled");

    // What waiting jobs show, written by the scheduler, leaves no change: it notes that
    // in its world itself. A reason written by anyone else is a change, also in the
    // same transaction right after the scheduler's write.
    // (Estimates are whole seconds, as the scheduler's are: PostgreSQL keeps microseconds.)
    let second = chrono::DateTime::from_timestamp(now().and_utc().timestamp(), 0);
    let waiting = crate::plan::Waiting {
        reason: Some("waiting behind job 1".into()),
        position: Some(2),
        estimated_start: second.map(|t| t.naive_utc()),
    };
    crate::plan::set_waiting(c, &[(queued[1], waiting.clone())], &[true]).unwrap();
    w.noted_waiting(&[(queued[1], waiting)]);
    let noted = follows(&mut w, c, "the scheduler's reason, noted");
    assert_eq!(noted, Update::Changes(0));
    crate::transaction(c, |c| {
        let waiting = crate::plan::Waiting {
            reason: Some("waiting for 1 GPU".into()),
            position: Some(1),
            estimated_start: None,
        };
        crate::plan::set_waiting(c, &[(queued[1], waiting)], &[true])?;
        diesel::update(jobs::table.find(queued[1]))
            .set(jobs::reason.eq(Some("held back by its lab")))
            .execute(c)?;
        Ok::<_, crate::DbError>(())
    })
    .unwrap();
    let other = follows(&mut w, c, "a reason written by another writer");
    assert_eq!(other, Update::Changes(1));

    // Attempts: one runs, one ends and its job is queued again (a take-back, being on
    // another lab's node), a checkpoint is stored.
    let first = crate::attempts::find(c, campus.jobs[0].id, 1)
        .unwrap()
        .unwrap();
    crate::attempts::mark_running(c, first.id, now()).unwrap();
    crate::jobs::set_state(c, campus.jobs[0].id, JobState::Running, "running").unwrap();
    follows(&mut w, c, "an attempt running");
    let other = crate::users::create_lab(c, "physics", "Physics").unwrap();
    diesel::update(jobs::table.find(campus.jobs[1].id))
        .set(jobs::lab_id.eq(other.id))
        .execute(c)
        .unwrap();
    let second = crate::attempts::find(c, campus.jobs[1].id, 1)
        .unwrap()
        .unwrap();
    crate::attempts::mark_running(c, second.id, now()).unwrap();
    crate::attempts::end(c, second.id, AttemptStatus::Stopped, None, None, now()).unwrap();
    crate::jobs::set_state(c, campus.jobs[1].id, JobState::Queued, "taken back").unwrap();
    follows(&mut w, c, "a guest taken back and queued again");
    let snap = w.snapshot(&Policy::default());
    let back = snap
        .queue
        .iter()
        .find(|q| q.id == campus.jobs[1].id)
        .unwrap();
    assert_eq!(back.take_backs, 1);
    diesel::insert_into(checkpoints::table)
        .values((
            checkpoints::job_id.eq(campus.jobs[0].id),
            checkpoints::attempt.eq(1),
            checkpoints::seq.eq(1),
            checkpoints::node_id.eq(node),
            checkpoints::lab_id.eq(lab),
            checkpoints::prefix.eq("k/1"),
            checkpoints::bytes.eq(10_i64),
            checkpoints::sha256.eq("00"),
            checkpoints::parts.eq(1),
            checkpoints::created_at.eq(now()),
        ))
        .execute(c)
        .unwrap();
    follows(&mut w, c, "a checkpoint");

    // The node and its GPUs: lending, draining, a GPU added, one in local use.
    crate::nodes::set_lending(c, node, r#"{"mode":"always"}"#, 30, false).unwrap();
    crate::nodes::set_draining(c, node, true).unwrap();
    follows(&mut w, c, "lending and draining");
    let gpus: Vec<commons_proto::GpuInfo> = (0..2)
        .map(|i| commons_proto::GpuInfo {
            uuid: format!("GPU-{}", i + 1),
            index: i,
            model: "A100".into(),
            memory_mb: 80_000,
            fake: true,
        })
        .collect();
    crate::nodes::upsert_gpus(c, node, "0", &gpus).unwrap();
    diesel::update(gpus::table.filter(gpus::uuid.eq("GPU-2")))
        .set(gpus::local_use.eq(true))
        .execute(c)
        .unwrap();
    follows(&mut w, c, "a GPU added, in local use");

    // Labs, members, datasets.
    crate::users::set_lab_quota(c, lab, true, r#"{"gpu_hours_per_week": 10}"#).unwrap();
    let bob = crate::users::create_user(c, "bob", "bob@x.test", false).unwrap();
    crate::users::set_membership(c, bob.id, lab, crate::models::Role::Member).unwrap();
    let req = commons_api::datasets::DatasetRequest {
        name: "cifar".into(),
        source: "node:cifar".into(),
        description: String::new(),
        visibility: commons_api::datasets::Visibility::Word("lab".into()),
    };
    crate::datasets::insert(c, lab, &req, "carol").unwrap();
    follows(&mut w, c, "a quota, a member, a dataset");

    // A revoked node leaves the world.
    crate::nodes::revoke(c, node).unwrap();
    follows(&mut w, c, "the node revoked");
    assert!(w.snapshot(&Policy::default()).nodes.is_empty());
}

#[test]
fn the_world_follows_every_change_on_sqlite() {
    let (_dir, mut c) = testkit::sqlite();
    every_change(&mut c);
}

#[test]
fn the_world_follows_every_change_on_postgres() {
    let (_guard, mut c) = testkit::postgres();
    every_change(&mut c);
}

/// One node running one job, and one job queued.
fn campus_and_a_queued_job(c: &mut DbConn) -> (testkit::Campus, crate::models::Job) {
    let campus = testkit::campus(c, 1);
    let demo = testkit::demo_job(campus.node.lab_id);
    let job = crate::jobs::insert(c, campus.jobs[0].user_id, &demo).unwrap();
    (campus, job)
}

/// A change the log lost (here: taken out by hand) leaves the world behind; the check
/// finds it, says what differs, and repairs the world from its fresh read.
#[test]
fn a_lost_change_is_found_by_the_check_and_repaired() {
    let (_dir, mut c) = testkit::sqlite();
    let c = &mut c;
    let (_campus, job) = campus_and_a_queued_job(c);
    let mut w = World::load(c).unwrap();
    diesel::update(jobs::table.find(job.id))
        .set(jobs::gpus.eq(4))
        .execute(c)
        .unwrap();
    changes::clear(c).unwrap();
    let policy = Policy::default();
    let (_, found) = w.check(c, &policy).unwrap();
    let found = found.expect("the check sees the lost change");
    assert!(found.starts_with("queue:"), "{found}");
    assert!(found.contains("\"gpus\":4"), "{found}");
    assert_eq!(w.check(c, &policy).unwrap().1, None, "repaired");
}

/// Heartbeats, lease renewals and the waiting jobs' places (which the scheduler writes
/// and notes itself) change nothing the world reads: they leave no change.
#[test]
fn updates_the_scheduler_does_not_read_leave_no_change() {
    let (_dir, mut c) = testkit::sqlite();
    let c = &mut c;
    let (campus, job) = campus_and_a_queued_job(c);
    changes::clear(c).unwrap();
    let stat = commons_proto::GpuStat {
        uuid: "GPU-1".into(),
        utilization_pct: 55,
        memory_used_mb: 1000,
        local_use: false,
        fault: None,
    };
    crate::gpu_stats::update_gpu_stats(c, campus.node.id, &[stat], &mut Default::default())
        .unwrap();
    diesel::update(nodes::table.find(campus.node.id))
        .set(nodes::last_seen_at.eq(Some(now())))
        .execute(c)
        .unwrap();
    let jobs = [campus.jobs[0].id];
    let later = now() + chrono::Duration::seconds(60);
    crate::attempts::renew_on(
        c,
        campus.node.id,
        later,
        crate::attempts::Renewable::Reported(&jobs),
    )
    .unwrap();
    // Its place and estimate (a reason it writes leaves none either: `every_change`).
    let waiting = crate::plan::Waiting {
        reason: job.reason.clone(),
        position: Some(1),
        estimated_start: Some(now()),
    };
    crate::plan::set_waiting(c, &[(job.id, waiting)], &[true]).unwrap();
    assert_eq!(changes::take(c).unwrap(), changes::Changes::default());
}

/// A waiting job's place is kept apart from its row (`job_places`) and only while it
/// waits: a job that leaves the queue loses it, one that comes back shows none until the
/// scheduler writes it again, and one that no longer waits gets none written.
fn places_belong_to_waiting_jobs(c: &mut DbConn) {
    let (_campus, job) = campus_and_a_queued_job(c);
    let waiting = |position| crate::plan::Waiting {
        reason: Some("waiting for 1 GPU".into()),
        position: Some(position),
        estimated_start: Some(now()),
    };
    let places = |c: &mut DbConn| crate::plan::places(c, &[job.id]).unwrap();
    crate::plan::set_waiting(c, &[(job.id, waiting(3))], &[true]).unwrap();
    assert_eq!(places(c)[0].1, Some(3));
    assert_eq!(
        World::load(c).unwrap().shows(job.id).unwrap().position,
        Some(3)
    );
    // A place alone leaves the job's row as it was.
    let before = crate::jobs::get(c, job.id).unwrap();
    crate::plan::set_waiting(c, &[(job.id, waiting(2))], &[false]).unwrap();
    assert_eq!(places(c)[0].1, Some(2));
    assert_eq!(
        format!("{:?}", crate::jobs::get(c, job.id).unwrap()),
        format!("{before:?}")
    );
    let node = crate::nodes::list_with_gpus(c).unwrap()[0].0.id;
    assert_eq!(
        crate::plan::claim_queued(c, &[(job.id, node)])
            .unwrap()
            .len(),
        1
    );
    assert_eq!(places(c), vec![], "a job that starts loses its place");
    crate::plan::set_waiting(c, &[(job.id, waiting(1))], &[true]).unwrap();
    assert_eq!(
        places(c),
        vec![],
        "nothing written for a job that no longer waits"
    );
    diesel::update(jobs::table.find(job.id))
        .set(jobs::state.eq(JobState::Queued))
        .execute(c)
        .unwrap();
    assert_eq!(places(c), vec![]);
    assert_eq!(
        World::load(c).unwrap().shows(job.id).unwrap().position,
        None
    );
}

#[test]
fn places_belong_to_waiting_jobs_on_sqlite() {
    let (_dir, mut c) = testkit::sqlite();
    places_belong_to_waiting_jobs(&mut c);
}

#[test]
fn places_belong_to_waiting_jobs_on_postgres() {
    let (_guard, mut c) = testkit::postgres();
    places_belong_to_waiting_jobs(&mut c);
}

/// A line of `EXPLAIN`'s output.
#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text)]
    #[diesel(column_name = "QUERY PLAN")]
    line: String,
}

/// `n` queued copies of the campus's first job and, for the last `with_attempts` of
/// them, three attempts each; the ids of the last 500, which a round's changes name.
fn many_jobs(
    pg: &mut diesel::PgConnection,
    campus: &testkit::Campus,
    n: usize,
    with_attempts: usize,
) -> Vec<i64> {
    let template = campus.jobs[0].id;
    diesel::sql_query(format!(
        "INSERT INTO jobs (user_id, lab_id, image, command, env, gpus, gpu_models, \
             min_gpu_memory_mb, cpus, memory_mb, time_limit_s, kind, state, reason, \
             attempts, log_bytes, created_at, image_digest, image_signature) \
         SELECT t.user_id, t.lab_id, t.image, t.command, t.env, t.gpus, t.gpu_models, \
             t.min_gpu_memory_mb, t.cpus, t.memory_mb, t.time_limit_s, t.kind, 'queued', \
             NULL, 0, 0, t.created_at, t.image_digest, t.image_signature \
         FROM jobs t, generate_series(1, {n}) WHERE t.id = {template}"
    ))
    .execute(pg)
    .unwrap();
    diesel::sql_query(format!(
        "INSERT INTO job_attempts (job_id, attempt, node_id, gpu_ids, state, lease_until, \
             created_at) \
         SELECT j.id, a, {node}, '[]', 'stopped', now(), now() \
         FROM (SELECT id FROM jobs WHERE id <> {template} ORDER BY id DESC LIMIT {with_attempts}) j, \
             generate_series(1, 3) AS a",
        node = campus.node.id
    ))
    .execute(pg)
    .unwrap();
    diesel::sql_query(format!(
        "SELECT id FROM jobs WHERE id <> {template} ORDER BY id DESC LIMIT 500"
    ))
    .load::<Id>(pg)
    .unwrap()
    .into_iter()
    .map(|r| r.id)
    .collect()
}

/// PostgreSQL's plan for the reload's read of the attempts of `ids` with their jobs.
fn attempts_plan(pg: &mut diesel::PgConnection, ids: &[i64]) -> String {
    let query = super::rows::attempts_of_jobs!(ids.to_vec());
    let sql = diesel::debug_query::<diesel::pg::Pg, _>(&query).to_string();
    let sql = sql.split(" -- binds").next().unwrap().to_string();
    // Its two binds: the ids on the attempts' side and on the jobs' side.
    type Ids = diesel::sql_types::Array<diesel::sql_types::BigInt>;
    diesel::sql_query(format!("EXPLAIN {sql}"))
        .bind::<Ids, _>(ids)
        .bind::<Ids, _>(ids)
        .load::<PlanLine>(pg)
        .unwrap()
        .into_iter()
        .map(|l| l.line.chars().take(160).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The reload reads a round's changed attempts with their jobs by the jobs' key, also
/// when PostgreSQL expects many attempts per job (50,000 jobs, the last 1,000 with
/// three attempts each): with only the attempts' side filtered, it hashed every job
/// instead (in the load test, 20-90 ms a round).
#[test]
fn reload_looks_jobs_up_by_key() {
    let (_guard, mut c) = testkit::postgres();
    let campus = testkit::campus(&mut c, 1);
    let DbConn::Pg(pg) = &mut c else {
        unreachable!("testkit::postgres gives a PostgreSQL connection")
    };
    let ids = many_jobs(pg, &campus, 50_000, 1_000);
    // Statistics now.
    diesel::sql_query("ANALYZE jobs, job_attempts")
        .execute(pg)
        .unwrap();
    let plan = attempts_plan(pg, &ids);
    assert!(
        !plan.contains("Seq Scan on jobs"),
        "the jobs are scanned:\n{plan}"
    );
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// Rows of `jobs` and `job_attempts` the current transaction read, and how often it
/// scanned each table whole.
#[derive(QueryableByName, Debug)]
struct Reads {
    #[diesel(sql_type = diesel::sql_types::Text)]
    relname: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq_scan: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    rows: i64,
}

/// Runs `f` in a transaction that then says what it read. PostgreSQL 15 and later keep
/// a backend's counts pending across transactions until it flushes them, so it is told
/// to flush first; parallel workers' reads would not be in the leader's view, so there
/// are none.
fn reading<T>(
    c: &mut DbConn,
    f: impl FnOnce(&mut DbConn) -> Result<T, crate::DbError>,
) -> (T, Vec<Reads>) {
    let DbConn::Pg(pg) = c else {
        unreachable!("testkit::postgres gives a PostgreSQL connection")
    };
    diesel::sql_query(
        "DO $$ BEGIN IF current_setting('server_version_num')::int >= 150000 THEN \
             PERFORM pg_stat_force_next_flush(); END IF; END $$",
    )
    .execute(pg)
    .unwrap();
    crate::transaction(c, |c| {
        diesel::sql_query("SET LOCAL max_parallel_workers_per_gather = 0").execute(c)?;
        let v = f(c)?;
        let DbConn::Pg(pg) = c else { unreachable!() };
        let reads = diesel::sql_query(
            "SELECT CAST(relname AS TEXT) AS relname, seq_scan, \
                 seq_tup_read + COALESCE(idx_tup_fetch, 0) AS rows \
             FROM pg_stat_xact_user_tables WHERE relname IN ('jobs', 'job_attempts') \
             ORDER BY relname",
        )
        .load::<Reads>(pg)?;
        Ok::<_, crate::DbError>((v, reads))
    })
    .unwrap()
}

/// Asserts that `reads` of `job_attempts` and `jobs` stayed within `most` rows each,
/// with no scan of either table when `scans` is false.
fn read_at_most(reads: &[Reads], most: [usize; 2], scans: bool, what: &str) {
    assert_eq!(reads.len(), 2, "{what}: {reads:?}");
    for (r, most) in reads.iter().zip(most) {
        assert!(
            r.rows <= most as i64 && (scans || r.seq_scan == 0),
            "{what} read {} rows of {} in {} scans of the whole table (at most {most})",
            r.rows,
            r.relname,
            r.seq_scan
        );
    }
}

/// The estimate of `jobs`' rows PostgreSQL's statistics hold.
fn jobs_estimate(c: &mut DbConn) -> f64 {
    #[derive(QueryableByName)]
    struct Estimate {
        #[diesel(sql_type = diesel::sql_types::Double)]
        n: f64,
    }
    diesel::sql_query("SELECT CAST(reltuples AS FLOAT8) AS n FROM pg_class WHERE relname = 'jobs'")
        .get_result::<Estimate>(c)
        .unwrap()
        .n
}

/// Bursts that PostgreSQL's statistics have not seen (taken while the tables were
/// small; autovacuum, which would take them again within a minute, kept off):
/// 1. 15,000 submissions, 1,000 of them with three stopped attempts, which one round
///    takes in (under the full read's threshold): it looks every row up by key
///    ([`super::by_key`]) instead of scanning the tables;
/// 2. 20,000 more, 2,000 with attempts, 100 of those another lab's (so taken back): a
///    replica that starts leading now reads in full on the old statistics, each row a
///    few times, not once per pair of rows (before: every queued job scanned for each
///    stopped attempt, 6 minutes at 50,000 jobs); the leader's next round reads in full
///    after analysing the tables the burst grew ([`super::analyse_burst`]).
///
/// After each round the world equals a fresh read; the take-backs are the ones written.
#[test]
fn bursts_on_stale_statistics_are_read_by_key_and_in_full_once() {
    let (_guard, mut c) = testkit::postgres();
    let campus = testkit::campus(&mut c, 1);
    let mut w = World::load(&mut c).unwrap();
    let DbConn::Pg(pg) = &mut c else {
        unreachable!("testkit::postgres gives a PostgreSQL connection")
    };
    for sql in [
        "ALTER TABLE jobs SET (autovacuum_enabled = false)",
        "ALTER TABLE job_attempts SET (autovacuum_enabled = false)",
        "ANALYZE",
    ] {
        diesel::sql_query(sql).execute(pg).unwrap();
    }
    let stale = jobs_estimate(&mut c);

    // 1. Under the threshold: by key.
    let DbConn::Pg(pg) = &mut c else {
        unreachable!()
    };
    many_jobs(pg, &campus, 15_000, 1_000);
    let (update, reads) = reading(&mut c, |c| w.update(c));
    assert_eq!(update, Update::Changes(18_000));
    read_at_most(
        &reads,
        [3 * 3_000, 3 * 15_000],
        false,
        "a round of 18,000 changes",
    );
    follows(&mut w, &mut c, "the first burst");

    // 2. Over it.
    let DbConn::Pg(pg) = &mut c else {
        unreachable!()
    };
    let ids = many_jobs(pg, &campus, 20_000, 2_000);
    // A hundred of them are another lab's, so their attempts on this lab's node were
    // taken back: three each, the last ended at 10:03.
    let physics = crate::users::create_lab(&mut c, "physics", "Physics").unwrap();
    let guests = &ids[..100];
    diesel::update(jobs::table.filter(jobs::id.eq_any(guests)))
        .set(jobs::lab_id.eq(physics.id))
        .execute(&mut c)
        .unwrap();
    let ten = chrono::NaiveDate::from_ymd_opt(2026, 12, 1)
        .unwrap()
        .and_hms_opt(10, 0, 0)
        .unwrap();
    for attempt in 1..=3 {
        diesel::update(
            job_attempts::table
                .filter(job_attempts::job_id.eq_any(guests))
                .filter(job_attempts::attempt.eq(attempt)),
        )
        .set(job_attempts::ended_at.eq(ten + chrono::Duration::minutes(attempt.into())))
        .execute(&mut c)
        .unwrap();
    }
    let (jobs, attempts) = (35_001, 9_000);
    let (_, reads) = reading(&mut c, |c| Rows::load(c, now()));
    read_at_most(
        &reads,
        [4 * attempts, 4 * jobs],
        true,
        "a new leader's full read",
    );
    assert_eq!(
        jobs_estimate(&mut c),
        stale,
        "statistics analysed too early"
    );
    let (update, reads) = reading(&mut c, |c| w.update(c));
    assert_eq!(update, Update::Full);
    read_at_most(
        &reads,
        [4 * attempts, 5 * jobs],
        true,
        "the round's full read",
    );
    let analysed = jobs_estimate(&mut c);
    assert!(
        analysed >= 30_000.0,
        "after the burst PostgreSQL still estimates {analysed} jobs (before it, {stale})"
    );
    follows(&mut w, &mut c, "the second burst");
    let snap = w.snapshot(&Policy::default());
    let backs: Vec<(i64, u32, i64)> = snap
        .queue
        .iter()
        .filter(|q| q.take_backs > 0)
        .map(|q| (q.id, q.take_backs, q.taken_back_at))
        .collect();
    let last = super::rows::secs(ten + chrono::Duration::minutes(3));
    let mut want: Vec<(i64, u32, i64)> = guests.iter().map(|&id| (id, 3, last)).collect();
    want.sort_unstable();
    assert_eq!(backs, want, "the take-backs after the burst");
}
