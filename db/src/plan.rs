//! The scheduler's plan written in a fixed number of statements, whatever its size. (A
//! round used to cost a few statements per start and one per waiting job: 256 starts
//! and 5,000 waiting jobs took 1.8 s to commit on PostgreSQL.)
//!
//! PostgreSQL takes each batch as arrays (`unnest`), so one statement carries any number
//! of rows. SQLite takes `VALUES` lists of at most [`SQLITE_ROWS`] rows (its limit on
//! bound parameters); an embedded database pays no round trip per statement anyway.
//!
//! Invariants:
//! - [`claim_queued`] is what keeps a job from starting twice: one statement moves each
//!   job from `queued` to `starting` and counts its attempt up. A job that is no longer
//!   queued when the statement runs (cancelled, or claimed by another writer whose
//!   transaction committed first: PostgreSQL re-checks the row after the lock) is left
//!   alone and not returned, and gets no attempt.
//! - [`preempt`] moves only jobs that still start or run, and only their attempts that
//!   still start or run.
//! - [`set_waiting`] writes reasons of queued jobs only, and places of jobs queued when
//!   its statement reads them (a cancel that commits meanwhile may leave a place behind:
//!   readers show the places of queued jobs only, and [`sweep_places`] removes it).

use super::models::{AttemptStatus, JobState};
use super::schema::*;
use super::types::to_json;
use super::DbConn;
use super::DbError;
use chrono::NaiveDateTime;
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamp};

/// Most rows in one SQLite statement (4 parameters each, under SQLite's 32,766).
const SQLITE_ROWS: usize = 2000;

/// `(?, ?), (?, ?), ...`: `rows` tuples of `cols` parameters, for SQLite.
fn sqlite_values(rows: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(", "));
    vec![row; rows].join(", ")
}

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Integer)]
    attempts: i32,
}

/// Moves the jobs of `starts` (job, node) that are still queued to `starting` on their
/// node, as their next attempt, in one statement; returns (job, attempt) of those moved.
/// Their reason is cleared; their places leave `job_places` with them (its trigger).
pub fn claim_queued(c: &mut DbConn, starts: &[(i64, i64)]) -> Result<Vec<(i64, i32)>, DbError> {
    if starts.is_empty() {
        return Ok(Vec::new());
    }
    let set = format!(
        "state = '{}', attempts = jobs.attempts + 1, node_id = v.node, reason = NULL",
        JobState::Starting.as_str()
    );
    let queued = JobState::Queued.as_str();
    let rows: Vec<Claimed> = match c {
        DbConn::Pg(c) => {
            let (ids, nodes): (Vec<i64>, Vec<i64>) = starts.iter().copied().unzip();
            diesel::sql_query(format!(
                "UPDATE jobs SET {set} FROM unnest($1::bigint[], $2::bigint[]) AS v(id, node) \
                 WHERE jobs.id = v.id AND jobs.state = '{queued}' \
                 RETURNING jobs.id, jobs.attempts"
            ))
            .bind::<Array<BigInt>, _>(ids)
            .bind::<Array<BigInt>, _>(nodes)
            .load(c)?
        }
        DbConn::Sqlite(c) => {
            let mut out = Vec::new();
            for chunk in starts.chunks(SQLITE_ROWS) {
                let mut q = diesel::sql_query(format!(
                    "WITH v(id, node) AS (VALUES {}) UPDATE jobs SET {set} FROM v \
                     WHERE jobs.id = v.id AND jobs.state = '{queued}' \
                     RETURNING jobs.id, jobs.attempts",
                    sqlite_values(chunk.len(), 2)
                ))
                .into_boxed::<diesel::sqlite::Sqlite>();
                for &(job, node) in chunk {
                    q = q.bind::<BigInt, _>(job).bind::<BigInt, _>(node);
                }
                out.extend(q.load::<Claimed>(c)?);
            }
            out
        }
    };
    Ok(rows.into_iter().map(|r| (r.id, r.attempts)).collect())
}

/// A new attempt's row.
pub struct NewAttempt {
    pub job: i64,
    pub attempt: i32,
    pub node: i64,
    pub gpus: Vec<i64>,
    pub lease_until: NaiveDateTime,
    /// The share of its one GPU it gets; none: its GPUs are its own.
    pub share: Option<commons_sched::GpuShare>,
}

/// Inserts `attempts` (state `starting`, created `at`) in one statement per backend batch.
pub fn insert_attempts(
    c: &mut DbConn,
    attempts: &[NewAttempt],
    at: NaiveDateTime,
) -> Result<(), DbError> {
    let json = |g: &[i64]| to_json(g).map_err(DbError::Json);
    let gpu_ids: Vec<String> = attempts
        .iter()
        .map(|a| json(&a.gpus))
        .collect::<Result<_, _>>()?;
    let rows: Vec<_> = attempts
        .iter()
        .zip(&gpu_ids)
        .map(|(a, g)| {
            (
                job_attempts::job_id.eq(a.job),
                job_attempts::attempt.eq(a.attempt),
                job_attempts::node_id.eq(a.node),
                job_attempts::gpu_ids.eq(g),
                job_attempts::state.eq(AttemptStatus::Starting),
                job_attempts::lease_until.eq(a.lease_until),
                job_attempts::created_at.eq(at),
                job_attempts::share_milli.eq(a.share.map(|s| s.milli as i32)),
                job_attempts::share_memory_mb.eq(a.share.map(|s| s.memory_mb as i64)),
            )
        })
        .collect();
    for chunk in rows.chunks(SQLITE_ROWS / 2) {
        let insert = diesel::insert_into(job_attempts::table).values(chunk);
        match c {
            DbConn::Pg(c) => insert.execute(c)?,
            DbConn::Sqlite(c) => insert.execute(c)?,
        };
    }
    Ok(())
}

/// Adds one history row per (job, state, message), all at `at`.
pub fn add_events(
    c: &mut DbConn,
    events: &[(i64, JobState, String)],
    at: NaiveDateTime,
) -> Result<(), DbError> {
    let rows: Vec<_> = events
        .iter()
        .map(|(job, state, message)| {
            (
                job_events::job_id.eq(*job),
                job_events::at.eq(at),
                job_events::state.eq(*state),
                job_events::message.eq(message),
            )
        })
        .collect();
    for chunk in rows.chunks(SQLITE_ROWS) {
        let insert = diesel::insert_into(job_events::table).values(chunk);
        match c {
            DbConn::Pg(c) => insert.execute(c)?,
            DbConn::Sqlite(c) => insert.execute(c)?,
        };
    }
    Ok(())
}

/// Moves the jobs `ids` that still start or run to `preempting`, and their attempts that
/// still start or run to `stopping`; returns the ids of the jobs moved. (The jobs first:
/// an attempt that ended meanwhile moved its job out of `starting`/`running` in the same
/// transaction, so neither is touched.)
pub fn preempt(c: &mut DbConn, ids: &[i64]) -> Result<Vec<i64>, DbError> {
    let mut moved = Vec::new();
    for chunk in ids.chunks(SQLITE_ROWS) {
        let update = diesel::update(
            jobs::table
                .filter(jobs::id.eq_any(chunk))
                .filter(jobs::state.eq_any([JobState::Starting, JobState::Running])),
        )
        .set(jobs::state.eq(JobState::Preempting))
        .returning(jobs::id);
        moved.extend(match c {
            DbConn::Pg(c) => update.load::<i64>(c)?,
            DbConn::Sqlite(c) => update.load::<i64>(c)?,
        });
    }
    let live = [AttemptStatus::Starting, AttemptStatus::Running];
    for chunk in moved.chunks(SQLITE_ROWS) {
        diesel::update(
            job_attempts::table
                .filter(job_attempts::job_id.eq_any(chunk))
                .filter(job_attempts::state.eq_any(live)),
        )
        .set(job_attempts::state.eq(AttemptStatus::Stopping))
        .execute(c)?;
    }
    Ok(moved)
}

/// What a waiting job shows: why it waits, its place in the queue, its estimated start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: Option<String>,
    pub position: Option<i32>,
    pub estimated_start: Option<NaiveDateTime>,
}

/// What a waiting job shows now, borrowed from where it is held (the scheduler's world):
/// compared with a round's plan without copying a reason per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown<'a> {
    pub reason: Option<&'a str>,
    pub position: Option<i32>,
    pub estimated_start: Option<NaiveDateTime>,
}

impl Waiting {
    pub fn shown(&self) -> Shown<'_> {
        Shown {
            reason: self.reason.as_deref(),
            position: self.position,
            estimated_start: self.estimated_start,
        }
    }
}

/// Writes what each of `rows` (job, waiting) shows, for those still queued (one
/// transaction; the change log names none of them: see below): the places and estimates
/// of all of them (`job_places`), the reasons of those `reason_changed` marks (one flag
/// per row; a place moves far more often than a reason, and a reason is a column of the
/// job's wide row).
pub fn set_waiting(
    c: &mut DbConn,
    rows: &[(i64, Waiting)],
    reason_changed: &[bool],
) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let reasons: Vec<(i64, Option<String>)> = rows
        .iter()
        .zip(reason_changed.iter().chain(std::iter::repeat(&true)))
        .filter(|(_, changed)| **changed)
        .map(|((job, w), _)| (*job, w.reason.clone()))
        .collect();
    // The scheduler notes what it writes here in its world (`World::noted_waiting`): a
    // reason changed in this transaction leaves no change in the log (the migration
    // `world_noted`); any other writer's does. Places are never logged.
    crate::transaction(c, |c| {
        // For people to read, and written again by the next rounds if lost.
        crate::unflushed_commit(c)?;
        set_places(c, rows)?;
        set_reasons(c, &reasons)
    })
}

fn set_places(c: &mut DbConn, rows: &[(i64, Waiting)]) -> Result<(), DbError> {
    let queued = JobState::Queued.as_str();
    let upsert = "ON CONFLICT (job_id) DO UPDATE SET queue_position = excluded.queue_position, \
                  estimated_start_at = excluded.estimated_start_at";
    match c {
        DbConn::Pg(c) => {
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            let positions: Vec<Option<i32>> = rows.iter().map(|r| r.1.position).collect();
            let estimates: Vec<Option<NaiveDateTime>> =
                rows.iter().map(|r| r.1.estimated_start).collect();
            diesel::sql_query(format!(
                "INSERT INTO job_places (job_id, queue_position, estimated_start_at) \
                 SELECT v.id, v.pos, v.est \
                 FROM unnest($1::bigint[], $2::integer[], $3::timestamp[]) AS v(id, pos, est) \
                 JOIN jobs ON jobs.id = v.id AND jobs.state = '{queued}' {upsert}"
            ))
            .bind::<Array<BigInt>, _>(ids)
            .bind::<Array<Nullable<Integer>>, _>(positions)
            .bind::<Array<Nullable<Timestamp>>, _>(estimates)
            .execute(c)?;
        }
        DbConn::Sqlite(c) => {
            for chunk in rows.chunks(SQLITE_ROWS) {
                // `WHERE true`: SQLite's parser needs it before an upsert's ON CONFLICT.
                let mut q = diesel::sql_query(format!(
                    "WITH v(id, pos, est) AS (VALUES {}) \
                     INSERT INTO job_places (job_id, queue_position, estimated_start_at) \
                     SELECT v.id, v.pos, v.est FROM v JOIN jobs ON jobs.id = v.id \
                     AND jobs.state = '{queued}' WHERE true {upsert}",
                    sqlite_values(chunk.len(), 3)
                ))
                .into_boxed::<diesel::sqlite::Sqlite>();
                for (job, w) in chunk {
                    q = q
                        .bind::<BigInt, _>(*job)
                        .bind::<Nullable<Integer>, _>(w.position)
                        .bind::<Nullable<Timestamp>, _>(w.estimated_start);
                }
                q.execute(c)?;
            }
        }
    }
    Ok(())
}

fn set_reasons(c: &mut DbConn, rows: &[(i64, Option<String>)]) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let queued = JobState::Queued.as_str();
    match c {
        DbConn::Pg(c) => {
            diesel::sql_query("SELECT set_config('commons.world_noted', 'on', true)").execute(c)?;
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            let reasons: Vec<Option<String>> = rows.iter().map(|r| r.1.clone()).collect();
            diesel::sql_query(format!(
                "UPDATE jobs SET reason = v.reason \
                 FROM unnest($1::bigint[], $2::text[]) AS v(id, reason) \
                 WHERE jobs.id = v.id AND jobs.state = '{queued}'"
            ))
            .bind::<Array<BigInt>, _>(ids)
            .bind::<Array<Nullable<Text>>, _>(reasons)
            .execute(c)?;
            diesel::sql_query("SELECT set_config('commons.world_noted', 'off', true)")
                .execute(c)?;
            Ok(())
        }
        DbConn::Sqlite(c) => {
            diesel::sql_query("INSERT INTO world_noted (id) VALUES (1)").execute(c)?;
            for chunk in rows.chunks(SQLITE_ROWS) {
                let mut q = diesel::sql_query(format!(
                    "WITH v(id, reason) AS (VALUES {}) UPDATE jobs SET reason = v.reason FROM v \
                     WHERE jobs.id = v.id AND jobs.state = '{queued}'",
                    sqlite_values(chunk.len(), 2)
                ))
                .into_boxed::<diesel::sqlite::Sqlite>();
                for (job, reason) in chunk {
                    q = q
                        .bind::<BigInt, _>(*job)
                        .bind::<Nullable<Text>, _>(reason.clone());
                }
                q.execute(c)?;
            }
            diesel::sql_query("DELETE FROM world_noted").execute(c)?;
            Ok(())
        }
    }
}

/// A row of `job_places`: a waiting job, its place in the queue and its estimated start.
pub type Place = (i64, Option<i32>, Option<NaiveDateTime>);

/// The places and estimates `job_places` holds for `jobs` (those it has).
pub fn places(c: &mut DbConn, jobs: &[i64]) -> Result<Vec<Place>, DbError> {
    let mut out = Vec::new();
    for ids in jobs.chunks(SQLITE_ROWS) {
        out.extend(
            job_places::table
                .filter(job_places::job_id.eq_any(ids))
                .select(job_places::all_columns)
                .load::<Place>(c)?,
        );
    }
    Ok(out)
}

/// Deletes the places of jobs that no longer wait; returns how many. A job's place leaves
/// with it when it leaves the queue (the table's trigger), but the places' upsert
/// ([`set_waiting`]) reads `jobs` without locking it, so as not to lock every waiting
/// job's row each round: a cancel or a start committed while the upsert ran can leave a
/// place behind. Readers show places of queued jobs only; this sweep, which the scheduler
/// runs with its periodic check of its world, keeps such rows from piling up.
pub fn sweep_places(c: &mut DbConn) -> Result<usize, DbError> {
    let queued = JobState::Queued.as_str();
    Ok(diesel::sql_query(format!(
        "DELETE FROM job_places WHERE NOT EXISTS (SELECT 1 FROM jobs \
         WHERE jobs.id = job_places.job_id AND jobs.state = '{queued}')"
    ))
    .execute(c)?)
}

/// Every row of `job_places`.
pub fn all_places(c: &mut DbConn) -> Result<Vec<Place>, DbError> {
    Ok(job_places::table
        .select(job_places::all_columns)
        .load::<Place>(c)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    /// A place a race left behind (the upsert read the job as queued, a cancel committed
    /// before it wrote) is swept; the places of waiting jobs stay.
    fn a_place_left_behind_is_swept(c: &mut DbConn) {
        let campus = testkit::campus(c, 1);
        let demo = testkit::demo_job(campus.node.lab_id);
        let user = campus.jobs[0].user_id;
        let waiting = crate::jobs::insert(c, user, &demo).unwrap();
        let gone = crate::jobs::insert(c, user, &demo).unwrap();
        let place = |position| Waiting {
            reason: Some("waiting for 1 GPU".into()),
            position: Some(position),
            estimated_start: None,
        };
        set_waiting(
            c,
            &[(waiting.id, place(1)), (gone.id, place(2))],
            &[true, true],
        )
        .unwrap();
        diesel::update(jobs::table.find(gone.id))
            .set(jobs::state.eq(JobState::Cancelled))
            .execute(c)
            .unwrap();
        // What the race leaves: the upsert's row, written after the cancel's trigger ran.
        diesel::insert_into(job_places::table)
            .values((
                job_places::job_id.eq(gone.id),
                job_places::queue_position.eq(Some(2)),
            ))
            .execute(c)
            .unwrap();
        assert_eq!(all_places(c).unwrap().len(), 2);
        assert_eq!(sweep_places(c).unwrap(), 1);
        assert_eq!(
            all_places(c).unwrap(),
            vec![(waiting.id, Some(1), None)],
            "the waiting job keeps its place"
        );
        assert_eq!(sweep_places(c).unwrap(), 0);
    }

    #[test]
    fn a_place_left_behind_is_swept_on_sqlite() {
        let (_dir, mut c) = testkit::sqlite();
        a_place_left_behind_is_swept(&mut c);
    }

    #[test]
    fn a_place_left_behind_is_swept_on_postgres() {
        let (_guard, mut c) = testkit::postgres();
        a_place_left_behind_is_swept(&mut c);
    }
}
