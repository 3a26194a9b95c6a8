//! Attempts' GPU utilisation over time (`attempt_samples`): the rows the heartbeat
//! sampler (`service::samples`) writes and the job page and API read. No rules here
//! beyond what a single statement guarantees.

use super::schema::*;
use super::DbConn;
use super::DbError;
use chrono::NaiveDateTime;
use diesel::dsl::max;
use diesel::prelude::*;
use std::collections::BTreeMap;

/// One sample of one attempt: its GPUs' mean utilisation over the sample interval and
/// the most memory they used together in it.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, serde::Serialize)]
#[diesel(table_name = attempt_samples)]
pub struct Sample {
    pub job_id: i64,
    pub attempt: i32,
    pub at: NaiveDateTime,
    pub utilization_pct: f64,
    pub memory_used_mb: i64,
}

/// Writes `rows` in one statement (one multi-row INSERT); nothing for none.
pub fn insert(c: &mut DbConn, rows: &[Sample]) -> Result<usize, DbError> {
    if rows.is_empty() {
        return Ok(0);
    }
    use attempt_samples::dsl as s;
    // Plain column values (not a struct's, which SQLite would insert row by row).
    let values: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                s::job_id.eq(r.job_id),
                s::attempt.eq(r.attempt),
                s::at.eq(r.at),
                s::utilization_pct.eq(r.utilization_pct),
                s::memory_used_mb.eq(r.memory_used_mb),
            )
        })
        .collect();
    // The multi-backend has no batch insert of its own; each inner connection does.
    let insert = diesel::insert_into(attempt_samples::table).values(values);
    Ok(match c {
        DbConn::Pg(c) => insert.execute(c),
        DbConn::Sqlite(c) => insert.execute(c),
    }?)
}

/// When each of the attempts of `jobs` was last sampled (one query).
pub fn last_at(
    c: &mut DbConn,
    jobs: &[i64],
) -> Result<BTreeMap<(i64, i32), NaiveDateTime>, DbError> {
    let rows: Vec<(i64, i32, Option<NaiveDateTime>)> = attempt_samples::table
        .filter(attempt_samples::job_id.eq_any(jobs))
        .group_by((attempt_samples::job_id, attempt_samples::attempt))
        .select((
            attempt_samples::job_id,
            attempt_samples::attempt,
            max(attempt_samples::at),
        ))
        .load(c)?;
    Ok(rows
        .into_iter()
        .filter_map(|(j, a, at)| Some(((j, a), at?)))
        .collect())
}

/// A job's samples, by attempt, oldest first.
pub fn for_job(c: &mut DbConn, job: i64) -> Result<Vec<Sample>, DbError> {
    Ok(attempt_samples::table
        .filter(attempt_samples::job_id.eq(job))
        .order((attempt_samples::attempt, attempt_samples::at))
        .select(Sample::as_select())
        .load(c)?)
}

/// Deletes every sample taken before `before`; returns how many.
pub fn expire(c: &mut DbConn, before: NaiveDateTime) -> Result<usize, DbError> {
    Ok(diesel::delete(attempt_samples::table.filter(attempt_samples::at.lt(before))).execute(c)?)
}
