//! Attempts' rows: the queries the attempt lifecycle (`service::attempts`) runs. No rules
//! here beyond what a single statement guarantees.

use super::models::{Attempt, AttemptStatus, JobState};
use super::schema::*;
use super::types::to_json;
use super::DbConn;
use super::DbError;
use chrono::NaiveDateTime;
use diesel::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// The active attempts on `nodes` or of `jobs`: what committing a plan that starts jobs
/// on those nodes and preempts those jobs must see (the rest of the campus it need not
/// read).
pub fn active_on_nodes_or_of_jobs(
    c: &mut DbConn,
    nodes: &[i64],
    jobs: &[i64],
) -> Result<Vec<Attempt>, DbError> {
    if nodes.is_empty() && jobs.is_empty() {
        return Ok(Vec::new());
    }
    Ok(job_attempts::table
        .filter(job_attempts::state.eq_any(AttemptStatus::ACTIVE))
        .filter(
            job_attempts::node_id
                .eq_any(nodes)
                .or(job_attempts::job_id.eq_any(jobs)),
        )
        .order(job_attempts::id)
        .select(Attempt::as_select())
        .load(c)?)
}

/// Attempt `attempt` of `job`, if it exists.
pub fn find(c: &mut DbConn, job: i64, attempt: i32) -> Result<Option<Attempt>, DbError> {
    Ok(job_attempts::table
        .filter(job_attempts::job_id.eq(job))
        .filter(job_attempts::attempt.eq(attempt))
        .select(Attempt::as_select())
        .first(c)
        .optional()?)
}

/// A node's attempts in the given states.
pub fn on_node(
    c: &mut DbConn,
    node: i64,
    states: &[AttemptStatus],
) -> Result<Vec<Attempt>, DbError> {
    Ok(job_attempts::table
        .filter(job_attempts::node_id.eq(node))
        .filter(job_attempts::state.eq_any(states))
        .order(job_attempts::id)
        .select(Attempt::as_select())
        .load(c)?)
}

/// A job's attempts in the given states.
pub fn on_job(c: &mut DbConn, job: i64, states: &[AttemptStatus]) -> Result<Vec<Attempt>, DbError> {
    Ok(job_attempts::table
        .filter(job_attempts::job_id.eq(job))
        .filter(job_attempts::state.eq_any(states))
        .order(job_attempts::id)
        .select(Attempt::as_select())
        .load(c)?)
}

/// A node's attempts being stopped, with their jobs' states.
pub fn stopping_on(c: &mut DbConn, node: i64) -> Result<Vec<(Attempt, JobState)>, DbError> {
    Ok(job_attempts::table
        .inner_join(jobs::table)
        .filter(job_attempts::node_id.eq(node))
        .filter(job_attempts::state.eq(AttemptStatus::Stopping))
        .select((Attempt::as_select(), jobs::state))
        .load(c)?)
}

/// Active attempts whose lease ran out before `cutoff`.
pub fn expired(c: &mut DbConn, cutoff: NaiveDateTime) -> Result<Vec<Attempt>, DbError> {
    Ok(job_attempts::table
        .filter(job_attempts::state.eq_any(AttemptStatus::ACTIVE))
        .filter(job_attempts::lease_until.lt(cutoff))
        .order(job_attempts::id)
        .select(Attempt::as_select())
        .load(c)?)
}

pub fn insert(
    c: &mut DbConn,
    job: i64,
    attempt: i32,
    node: i64,
    gpus: &[i64],
    lease_until: NaiveDateTime,
    at: NaiveDateTime,
) -> Result<(), DbError> {
    let gpu_ids = to_json(gpus).map_err(DbError::Json)?;
    diesel::insert_into(job_attempts::table)
        .values((
            job_attempts::job_id.eq(job),
            job_attempts::attempt.eq(attempt),
            job_attempts::node_id.eq(node),
            job_attempts::gpu_ids.eq(&gpu_ids),
            job_attempts::state.eq(AttemptStatus::Starting),
            job_attempts::lease_until.eq(lease_until),
            job_attempts::created_at.eq(at),
        ))
        .execute(c)?;
    Ok(())
}

pub fn set_status(c: &mut DbConn, id: i64, status: AttemptStatus) -> Result<(), DbError> {
    diesel::update(job_attempts::table.find(id))
        .set(job_attempts::state.eq(status))
        .execute(c)?;
    Ok(())
}

pub fn mark_running(c: &mut DbConn, id: i64, at: NaiveDateTime) -> Result<(), DbError> {
    diesel::update(job_attempts::table.find(id))
        .set((
            job_attempts::state.eq(AttemptStatus::Running),
            job_attempts::started_at.eq(at),
        ))
        .execute(c)?;
    Ok(())
}

/// PostgreSQL only: the usual `Running` report in one statement (atomic by itself, no
/// transaction). Attempt `attempt` of `job`, on `node` and still `starting`, becomes
/// `running`; its job, if it is still starting that attempt, becomes `running` (keeping
/// its first start) with an "attempt N running" history row. `Some(true)` when the
/// attempt moved; `Some(false)` when it did not (another state, another node, unknown:
/// the caller's general path decides); `None` on SQLite.
pub fn start_running(
    c: &mut DbConn,
    node: i64,
    job: i64,
    attempt: i32,
    at: NaiveDateTime,
) -> Result<Option<bool>, DbError> {
    use diesel::sql_types::{BigInt, Integer, Timestamp};
    let DbConn::Pg(pg) = c else {
        return Ok(None);
    };
    #[derive(QueryableByName)]
    struct Moved {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let moved = diesel::sql_query(format!(
        "WITH a AS (UPDATE job_attempts SET state = '{running}', started_at = $4 \
           WHERE job_id = $1 AND attempt = $2 AND node_id = $3 AND state = '{starting}' \
           RETURNING job_id, attempt), \
         j AS (UPDATE jobs SET state = '{job_running}', \
             started_at = COALESCE(jobs.started_at, $4) \
           FROM a WHERE jobs.id = a.job_id AND jobs.state = '{job_starting}' \
             AND jobs.attempts = a.attempt \
           RETURNING jobs.id, a.attempt), \
         e AS (INSERT INTO job_events (job_id, at, state, message) \
           SELECT id, $4, '{job_running}', 'attempt ' || attempt || ' running' FROM j) \
         SELECT count(*) AS n FROM a",
        running = AttemptStatus::Running.as_str(),
        starting = AttemptStatus::Starting.as_str(),
        job_running = JobState::Running.as_str(),
        job_starting = JobState::Starting.as_str(),
    ))
    .bind::<BigInt, _>(job)
    .bind::<Integer, _>(attempt)
    .bind::<BigInt, _>(node)
    .bind::<Timestamp, _>(at)
    .get_result::<Moved>(pg)?;
    Ok(Some(moved.n > 0))
}

/// The usual end of an attempt, for [`end_with_job`]: what the attempt ends as and what
/// its job becomes, decided by the caller.
#[derive(Debug, Clone, Copy)]
pub struct JobEnd<'a> {
    pub node: i64,
    pub job: i64,
    pub attempt: i32,
    /// The attempt's end (`exited`, `failed`).
    pub status: AttemptStatus,
    pub exit_code: Option<i64>,
    pub reason: Option<&'a str>,
    /// The job's states this end settles; in any other the caller's general path decides.
    pub job_from: &'a [JobState],
    /// The job's final state, and its history row's message.
    pub job_to: JobState,
    pub message: &'a str,
    pub at: NaiveDateTime,
}

/// What [`end_with_job`] moved: the attempt, and its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub attempt: bool,
    pub job: bool,
}

/// PostgreSQL only: the usual end of an attempt in one statement (the caller's
/// transaction holds it and any rest). Attempt `e.attempt` of `e.job`, active on
/// `e.node`, ends as `e.status`, if its job runs that attempt in one of `e.job_from`; the
/// job then becomes `e.job_to` (final: `finished_at`, the exit code and the reason set)
/// with a history row. The attempt and the job are checked in one snapshot, so the job
/// can still have moved before its row is written (a cancel committed meanwhile):
/// `Ended { attempt: true, job: false }`, and the caller settles the job. `None` on
/// SQLite.
pub fn end_with_job(c: &mut DbConn, e: &JobEnd) -> Result<Option<Ended>, DbError> {
    use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamp};
    let DbConn::Pg(pg) = c else {
        return Ok(None);
    };
    #[derive(QueryableByName)]
    struct Moved {
        #[diesel(sql_type = BigInt)]
        a: i64,
        #[diesel(sql_type = BigInt)]
        j: i64,
    }
    let active: Vec<&str> = AttemptStatus::ACTIVE.iter().map(|s| s.as_str()).collect();
    let from: Vec<&str> = e.job_from.iter().map(|s| s.as_str()).collect();
    let moved = diesel::sql_query(
        "WITH a AS (UPDATE job_attempts SET state = $4, ended_at = $9, exit_code = $5, \
             reason = $6 \
           WHERE job_id = $1 AND attempt = $2 AND node_id = $3 AND state = ANY($7) \
             AND EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND attempts = $2 \
               AND state = ANY($8)) \
           RETURNING job_id, attempt), \
         j AS (UPDATE jobs SET state = $10, finished_at = $9, exit_code = $5, reason = $6 \
           FROM a WHERE jobs.id = a.job_id AND jobs.attempts = a.attempt \
             AND jobs.state = ANY($8) \
           RETURNING jobs.id), \
         h AS (INSERT INTO job_events (job_id, at, state, message) \
           SELECT id, $9, $10, $11 FROM j) \
         SELECT (SELECT count(*) FROM a) AS a, (SELECT count(*) FROM j) AS j",
    )
    .bind::<BigInt, _>(e.job)
    .bind::<Integer, _>(e.attempt)
    .bind::<BigInt, _>(e.node)
    .bind::<Text, _>(e.status.as_str())
    .bind::<Nullable<BigInt>, _>(e.exit_code)
    .bind::<Nullable<Text>, _>(e.reason)
    .bind::<Array<Text>, _>(&active)
    .bind::<Array<Text>, _>(&from)
    .bind::<Timestamp, _>(e.at)
    .bind::<Text, _>(e.job_to.as_str())
    .bind::<Text, _>(e.message)
    .get_result::<Moved>(pg)?;
    Ok(Some(Ended {
        attempt: moved.a > 0,
        job: moved.j > 0,
    }))
}

pub fn end(
    c: &mut DbConn,
    id: i64,
    status: AttemptStatus,
    exit_code: Option<i64>,
    reason: Option<&str>,
    at: NaiveDateTime,
) -> Result<(), DbError> {
    diesel::update(job_attempts::table.find(id))
        .set((
            job_attempts::state.eq(status),
            job_attempts::ended_at.eq(at),
            job_attempts::exit_code.eq(exit_code),
            job_attempts::reason.eq(reason),
        ))
        .execute(c)?;
    Ok(())
}

/// Which of a node's active attempts a renewal extends.
#[derive(Debug, Clone, Copy)]
pub enum Renewable<'a> {
    /// Those the agent reports (by job: a job has at most one active attempt, and an
    /// agent that reports an attempt of a job has that job's active one if it is on its
    /// node), and those still starting (their `Start` may be on its way).
    Reported(&'a [i64]),
    /// Those the last renewal extended (whose lease runs at least until `since`), and
    /// those still starting: the reports are not at hand (the portal shuts down).
    RenewedUntil(NaiveDateTime),
}

/// Extends the active attempts of `node` that `which` names to at least `until` (a
/// lease never shrinks here: the agent may hold a longer one granted earlier); returns
/// their (job, attempt), in job order. An attempt its agent no longer reports is not
/// extended: it is lost, and requeued, when its lease runs out. One statement.
pub fn renew_on(
    c: &mut DbConn,
    node: i64,
    until: NaiveDateTime,
    which: Renewable<'_>,
) -> Result<Vec<(i64, i32)>, DbError> {
    use diesel::dsl::case_when;
    use diesel::sql_types::Timestamp;
    let longer = case_when(
        job_attempts::lease_until.lt(until),
        until.into_sql::<Timestamp>(),
    )
    .otherwise(job_attempts::lease_until);
    let active = job_attempts::table
        .filter(job_attempts::node_id.eq(node))
        .filter(job_attempts::state.eq_any(AttemptStatus::ACTIVE));
    let starting = job_attempts::state.eq(AttemptStatus::Starting);
    let back = (job_attempts::job_id, job_attempts::attempt);
    let mut ours: Vec<(i64, i32)> = match which {
        Renewable::Reported(jobs) => {
            let update = diesel::update(
                active.filter(starting.or(job_attempts::job_id.eq_any(jobs.to_vec()))),
            )
            .set(job_attempts::lease_until.eq(longer))
            .returning(back);
            match c {
                DbConn::Pg(c) => update.load(c)?,
                DbConn::Sqlite(c) => update.load(c)?,
            }
        }
        Renewable::RenewedUntil(since) => {
            let update =
                diesel::update(active.filter(starting.or(job_attempts::lease_until.ge(since))))
                    .set(job_attempts::lease_until.eq(longer))
                    .returning(back);
            match c {
                DbConn::Pg(c) => update.load(c)?,
                DbConn::Sqlite(c) => update.load(c)?,
            }
        }
    };
    ours.sort_unstable();
    Ok(ours)
}

/// Owner take-backs of the jobs `jobs` (each with its lab), all of them queued: per job,
/// how many of its attempts ran on another lab's node and were stopped (the job is
/// queued again, so they did not end it), and when the last of them ended. Jobs without
/// any are missing.
///
/// Each statement reads one table and the join is done here. As one join of attempts,
/// jobs and nodes, PostgreSQL planning on column statistics from before a burst (which
/// knew of almost no queued jobs or stopped attempts, so it expected one of each) nested
/// a scan of every queued job inside each stopped attempt: a full read after 50,000
/// submissions took 352 s
/// (`world::tests::bursts_on_stale_statistics_are_read_by_key_and_in_full_once`).
pub fn take_backs(
    c: &mut DbConn,
    jobs: &BTreeMap<i64, i64>,
) -> Result<BTreeMap<i64, (u32, NaiveDateTime)>, DbError> {
    let ids: Vec<i64> = jobs.keys().copied().collect();
    let mut stopped: Vec<(i64, i64, Option<NaiveDateTime>)> = Vec::new();
    for ids in ids.chunks(crate::IDS_PER_QUERY) {
        // The state is tested here, not in the statement: with it there, stale
        // statistics chose the index on states and read every stopped attempt of the
        // campus's history for a few jobs.
        let found: Vec<(i64, i64, Option<NaiveDateTime>, AttemptStatus)> = job_attempts::table
            .filter(job_attempts::job_id.eq_any(ids))
            .select((
                job_attempts::job_id,
                job_attempts::node_id,
                job_attempts::ended_at,
                job_attempts::state,
            ))
            .load(c)?;
        stopped.extend(
            found
                .into_iter()
                .filter(|a| a.3 == AttemptStatus::Stopped)
                .map(|(job, node, ended, _)| (job, node, ended)),
        );
    }
    let on: BTreeSet<i64> = stopped.iter().map(|s| s.1).collect();
    let on: Vec<i64> = on.into_iter().collect();
    let mut lab_of: BTreeMap<i64, i64> = BTreeMap::new();
    for ids in on.chunks(crate::IDS_PER_QUERY) {
        lab_of.extend(
            nodes::table
                .filter(nodes::id.eq_any(ids))
                .select((nodes::id, nodes::lab_id))
                .load::<(i64, i64)>(c)?,
        );
    }
    let mut out: BTreeMap<i64, (u32, NaiveDateTime)> = BTreeMap::new();
    for (job, node, ended) in stopped {
        let guest = match (jobs.get(&job), lab_of.get(&node)) {
            (Some(job_lab), Some(node_lab)) => job_lab != node_lab,
            _ => false,
        };
        if guest {
            let (n, last) = out.entry(job).or_default();
            *n = n.saturating_add(1);
            *last = (*last).max(ended.unwrap_or_default());
        }
    }
    Ok(out)
}
