//! Committed checkpoints' rows and the labs' checkpoint caps. The archives themselves are
//! in the object store (`service::checkpoints`); a row is written only once its parts and
//! manifest are there, so every row names a whole archive.
//!
//! Order: a job's checkpoints rank by (attempt, seq), newest first: a later attempt's
//! checkpoint supersedes an earlier attempt's, whatever the clocks say.

use super::models::JobState;
use super::schema::*;
use super::DbConn;
use super::DbError;
use crate::insert_returning_id;
use chrono::NaiveDateTime;
use diesel::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// A committed checkpoint: the parts `0..parts` under `prefix`, `bytes` long in all, whose
/// concatenation has the SHA-256 `sha256`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = checkpoints)]
pub struct Checkpoint {
    pub id: i64,
    pub job_id: i64,
    pub attempt: i32,
    /// Which commit of the attempt, from 1.
    pub seq: i32,
    /// The node that uploaded it.
    pub node_id: i64,
    /// The job's lab: the bytes count against its cap.
    pub lab_id: i64,
    /// Key prefix of its objects in the store.
    pub prefix: String,
    pub bytes: i64,
    pub sha256: String,
    pub parts: i32,
    pub created_at: NaiveDateTime,
    /// How long it took to write (pack and upload), in milliseconds, as its agent
    /// measured it; `None` when the agent did not say.
    pub write_ms: Option<i64>,
}

/// The states of a job that ended for good.
const ENDED: [JobState; 3] = [JobState::Succeeded, JobState::Failed, JobState::Cancelled];

/// A checkpoint to record.
#[derive(Debug, Clone)]
pub struct NewCheckpoint<'a> {
    pub job_id: i64,
    pub attempt: i32,
    pub seq: i32,
    pub node_id: i64,
    pub lab_id: i64,
    pub prefix: &'a str,
    pub bytes: i64,
    pub sha256: &'a str,
    pub parts: i32,
    pub created_at: NaiveDateTime,
    /// See [`Checkpoint::write_ms`].
    pub write_ms: Option<i64>,
}

pub fn insert(c: &mut DbConn, new: &NewCheckpoint<'_>) -> Result<Checkpoint, DbError> {
    let id = insert_returning_id!(
        c,
        diesel::insert_into(checkpoints::table).values((
            checkpoints::job_id.eq(new.job_id),
            checkpoints::attempt.eq(new.attempt),
            checkpoints::seq.eq(new.seq),
            checkpoints::node_id.eq(new.node_id),
            checkpoints::lab_id.eq(new.lab_id),
            checkpoints::prefix.eq(new.prefix),
            checkpoints::bytes.eq(new.bytes),
            checkpoints::sha256.eq(new.sha256),
            checkpoints::parts.eq(new.parts),
            checkpoints::created_at.eq(new.created_at),
            checkpoints::write_ms.eq(new.write_ms),
        )),
        checkpoints::id
    )?;
    Ok(checkpoints::table
        .find(id)
        .select(Checkpoint::as_select())
        .first(c)?)
}

/// The seq the next commit of `attempt` of `job` gets (its parts are uploaded under it).
pub fn next_seq(c: &mut DbConn, job: i64, attempt: i32) -> Result<i32, DbError> {
    let max: Option<i32> = checkpoints::table
        .filter(checkpoints::job_id.eq(job))
        .filter(checkpoints::attempt.eq(attempt))
        .select(diesel::dsl::max(checkpoints::seq))
        .first(c)?;
    Ok(max.unwrap_or(0) + 1)
}

/// A job's checkpoints, newest first.
pub fn for_job(c: &mut DbConn, job: i64) -> Result<Vec<Checkpoint>, DbError> {
    Ok(checkpoints::table
        .filter(checkpoints::job_id.eq(job))
        .order((checkpoints::attempt.desc(), checkpoints::seq.desc()))
        .select(Checkpoint::as_select())
        .load(c)?)
}

/// The checkpoint a job resumes from, if it has one.
pub fn latest(c: &mut DbConn, job: i64) -> Result<Option<Checkpoint>, DbError> {
    Ok(checkpoints::table
        .filter(checkpoints::job_id.eq(job))
        .order((checkpoints::attempt.desc(), checkpoints::seq.desc()))
        .select(Checkpoint::as_select())
        .first(c)
        .optional()?)
}

/// Which of `jobs` have any committed checkpoint (one query).
pub fn jobs_with_any(c: &mut DbConn, jobs: &[i64]) -> Result<BTreeSet<i64>, DbError> {
    Ok(checkpoints::table
        .filter(checkpoints::job_id.eq_any(jobs))
        .select(checkpoints::job_id)
        .distinct()
        .load::<i64>(c)?
        .into_iter()
        .collect())
}

pub fn delete(c: &mut DbConn, ids: &[i64]) -> Result<usize, DbError> {
    Ok(diesel::delete(checkpoints::table.filter(checkpoints::id.eq_any(ids))).execute(c)?)
}

/// When each of `jobs` last stored the checkpoint it would resume from (one query).
pub fn latest_at_for_jobs(
    c: &mut DbConn,
    jobs: &[i64],
) -> Result<BTreeMap<i64, NaiveDateTime>, DbError> {
    let rows: Vec<(i64, i32, i32, NaiveDateTime)> = checkpoints::table
        .filter(checkpoints::job_id.eq_any(jobs))
        .select((
            checkpoints::job_id,
            checkpoints::attempt,
            checkpoints::seq,
            checkpoints::created_at,
        ))
        .load(c)?;
    let mut best: BTreeMap<i64, (i32, i32, NaiveDateTime)> = BTreeMap::new();
    for (job, attempt, seq, at) in rows {
        let e = best.entry(job).or_insert((attempt, seq, at));
        if (attempt, seq) > (e.0, e.1) {
            *e = (attempt, seq, at);
        }
    }
    Ok(best
        .into_iter()
        .map(|(job, (_, _, at))| (job, at))
        .collect())
}

/// What the scheduler knows of a running attempt's checkpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptCheckpoints {
    /// When this attempt last stored a checkpoint (`None`: it has not).
    pub latest_at: Option<NaiveDateTime>,
    /// How long the job's latest checkpoint with a known write time took to write, in
    /// milliseconds: of this attempt or an earlier one (`None`: none is known).
    pub write_ms: Option<i64>,
}

/// A checkpoint of a job as [`for_attempts`] reads it: attempt, seq, when, write time.
type OfJob = (i32, i32, NaiveDateTime, Option<i64>);

/// For each of the given attempts (job, attempt): when it last stored a checkpoint and
/// the job's latest known write time (one query).
pub fn for_attempts(
    c: &mut DbConn,
    attempts: &[(i64, i32)],
) -> Result<BTreeMap<(i64, i32), AttemptCheckpoints>, DbError> {
    let jobs: BTreeSet<i64> = attempts.iter().map(|(j, _)| *j).collect();
    let rows: Vec<(i64, i32, i32, NaiveDateTime, Option<i64>)> = checkpoints::table
        .filter(checkpoints::job_id.eq_any(jobs))
        .select((
            checkpoints::job_id,
            checkpoints::attempt,
            checkpoints::seq,
            checkpoints::created_at,
            checkpoints::write_ms,
        ))
        .load(c)?;
    // Per job, its checkpoints (attempt, seq, created_at, write_ms) newest first.
    let mut by_job: BTreeMap<i64, Vec<OfJob>> = BTreeMap::new();
    for (job, attempt, seq, at, ms) in rows {
        by_job.entry(job).or_default().push((attempt, seq, at, ms));
    }
    for ks in by_job.values_mut() {
        ks.sort_unstable_by_key(|k| std::cmp::Reverse((k.0, k.1)));
    }
    let mut out = BTreeMap::new();
    for &(job, attempt) in attempts {
        let ks = by_job.get(&job).map(Vec::as_slice).unwrap_or_default();
        let latest_at = ks.iter().filter(|k| k.0 == attempt).map(|k| k.2).max();
        let write_ms = ks.iter().filter(|k| k.0 <= attempt).find_map(|k| k.3);
        if latest_at.is_some() || write_ms.is_some() {
            out.insert(
                (job, attempt),
                AttemptCheckpoints {
                    latest_at,
                    write_ms,
                },
            );
        }
    }
    Ok(out)
}

/// Bytes the checkpoints of `lab` take.
pub fn lab_bytes(c: &mut DbConn, lab: i64) -> Result<i64, DbError> {
    // Summed here: SUM over BIGINT is NUMERIC on PostgreSQL and BIGINT on SQLite.
    let sizes: Vec<i64> = checkpoints::table
        .filter(checkpoints::lab_id.eq(lab))
        .select(checkpoints::bytes)
        .load(c)?;
    Ok(sizes.iter().sum())
}

/// A lab's slug and its own checkpoint cap in GB (`None`: the campus default).
pub fn lab_cap(c: &mut DbConn, lab: i64) -> Result<(String, Option<f64>), DbError> {
    Ok(labs::table
        .find(lab)
        .select((labs::slug, labs::checkpoint_cap_gb))
        .first(c)?)
}

/// Sets (or, with `None`, clears) a lab's own checkpoint cap in GB.
pub fn set_lab_cap(c: &mut DbConn, lab: i64, cap_gb: Option<f64>) -> Result<(), DbError> {
    diesel::update(labs::table.find(lab))
        .set(labs::checkpoint_cap_gb.eq(cap_gb))
        .execute(c)?;
    Ok(())
}

/// Jobs that ended (succeeded, failed, cancelled) before `before` and still have
/// checkpoints.
pub fn ended_jobs_with_checkpoints(
    c: &mut DbConn,
    before: NaiveDateTime,
) -> Result<Vec<i64>, DbError> {
    Ok(checkpoints::table
        .inner_join(jobs::table)
        .filter(jobs::state.eq_any(ENDED))
        .filter(jobs::finished_at.lt(before))
        .select(checkpoints::job_id)
        .distinct()
        .order(checkpoints::job_id)
        .load(c)?)
}

/// Of `ids`, the jobs whose stored objects may go: those that ended before `before`, and
/// ids of no job at all.
pub fn gone_or_ended_before(
    c: &mut DbConn,
    ids: &[i64],
    before: NaiveDateTime,
) -> Result<Vec<i64>, DbError> {
    let rows: Vec<(i64, JobState, Option<NaiveDateTime>)> = jobs::table
        .filter(jobs::id.eq_any(ids))
        .select((jobs::id, jobs::state, jobs::finished_at))
        .load(c)?;
    let known: BTreeMap<i64, (JobState, Option<NaiveDateTime>)> = rows
        .into_iter()
        .map(|(id, state, at)| (id, (state, at)))
        .collect();
    Ok(ids
        .iter()
        .copied()
        .filter(|id| match known.get(id) {
            None => true,
            Some((state, at)) => state.is_final() && at.is_some_and(|t| t < before),
        })
        .collect())
}

/// Deletes every checkpoint row of `job`.
pub fn delete_for_job(c: &mut DbConn, job: i64) -> Result<usize, DbError> {
    Ok(diesel::delete(checkpoints::table.filter(checkpoints::job_id.eq(job))).execute(c)?)
}
