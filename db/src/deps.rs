//! Jobs that wait for other jobs (`after`): the held jobs and the states of what they
//! wait for, read for `service::deps`, which decides; and the ways held jobs move on
//! (released into the queue, ended as failed, or saying what they wait for now), each
//! applied to many jobs in a few statements.
//!
//! Invariants:
//! - Every change here touches only jobs that are still queued and held, so a job that
//!   was cancelled (or released by another replica) meanwhile is left alone.
//! - A job ended as failed gets its history row in the same transaction as its state,
//!   and the row says why, as the job's reason does.
//! - Per-job values (reasons) travel as arrays (PostgreSQL's `unnest`) or one JSON text
//!   (SQLite's `json_each`): however many jobs a round settles, a statement binds a
//!   fixed number of parameters.

use super::models::JobState;
use super::now;
use super::schema::*;
use super::types::{to_json, Json};
use super::DbConn;
use super::DbError;
use commons_api::flows::After;
use diesel::prelude::*;
use diesel::sql_types::{Array as SqlArray, BigInt, Text, Timestamp};
use std::collections::BTreeMap;

/// What a job waiting for `a` says (`index`: its index, if it is an array's task): the
/// scheduler's words for a job ("waiting for job 41 to succeed"), the same for an array
/// ("waiting for array 3 to succeed") or, per index, its own task of it ("waiting for
/// task 3 of array 7 to succeed").
pub fn waiting_text(a: &After, index: Option<i64>) -> String {
    match a.array {
        Some(_) => a.waiting_for(index),
        None => commons_sched::Reason::WaitingForJob {
            job: a.job,
            to: a.when.verb().to_string(),
        }
        .to_string(),
    }
}

/// A queued job held for its waits.
#[derive(Debug, Clone, Queryable)]
pub struct Held {
    pub id: i64,
    pub after: Json<Vec<After>>,
    pub reason: Option<String>,
    /// Its index, if it is an array's task (what a per-index wait looks up).
    pub array_index: Option<i64>,
}

/// Every held job that still waits (queued), in id order (through the partial index on
/// `held`).
pub fn held(c: &mut DbConn) -> Result<Vec<Held>, DbError> {
    Ok(jobs::table
        .filter(jobs::held)
        .filter(jobs::state.eq(JobState::Queued))
        .order(jobs::id)
        .select((jobs::id, jobs::after_jobs, jobs::reason, jobs::array_index))
        .load(c)?)
}

/// The states of the jobs `ids` (those that exist), a few thousand ids per query.
pub fn states(c: &mut DbConn, ids: &[i64]) -> Result<BTreeMap<i64, JobState>, DbError> {
    let mut out = BTreeMap::new();
    for chunk in ids.chunks(5000) {
        let rows: Vec<(i64, JobState)> = jobs::table
            .filter(jobs::id.eq_any(chunk))
            .select((jobs::id, jobs::state))
            .load(c)?;
        out.extend(rows);
    }
    Ok(out)
}

/// Arrays' tasks: `(array, index) -> (job id, state)`.
pub type TaskStates = BTreeMap<(i64, i64), (i64, JobState)>;

/// The tasks of the arrays `arrays`, one query.
pub fn task_states(c: &mut DbConn, arrays: &[i64]) -> Result<TaskStates, DbError> {
    if arrays.is_empty() {
        return Ok(BTreeMap::new());
    }
    let rows: Vec<(Option<i64>, Option<i64>, i64, JobState)> = jobs::table
        .filter(jobs::array_id.eq_any(arrays))
        .select((jobs::array_id, jobs::array_index, jobs::id, jobs::state))
        .load(c)?;
    Ok(rows
        .into_iter()
        .filter_map(|(a, i, id, s)| Some(((a?, i?), (id, s))))
        .collect())
}

/// The owners and labs of the jobs `ids` that exist: `id -> (user, lab)`.
pub fn owners(c: &mut DbConn, ids: &[i64]) -> Result<BTreeMap<i64, (i64, i64)>, DbError> {
    let rows: Vec<(i64, i64, i64)> = jobs::table
        .filter(jobs::id.eq_any(ids))
        .select((jobs::id, jobs::user_id, jobs::lab_id))
        .load(c)?;
    Ok(rows.into_iter().map(|(j, u, l)| (j, (u, l))).collect())
}

/// Held jobs whose waits are all met join the queue (those that still wait), saying
/// `reason`; how many did.
pub fn release(c: &mut DbConn, ids: &[i64], reason: &str) -> Result<usize, DbError> {
    let mut n = 0;
    for chunk in ids.chunks(5000) {
        n += diesel::update(
            jobs::table
                .filter(jobs::id.eq_any(chunk))
                .filter(jobs::held)
                .filter(jobs::state.eq(JobState::Queued)),
        )
        .set((jobs::held.eq(false), jobs::reason.eq(Some(reason))))
        .execute(c)?;
    }
    Ok(n)
}

/// The rows `(job, text)` as the source of a statement: `t(i, r)`, from `$2` and `$3`
/// (PostgreSQL) or from the one JSON parameter `?2` (SQLite).
fn rows_source(pg: bool) -> &'static str {
    if pg {
        "unnest($2::bigint[], $3::text[]) AS t(i, r)"
    } else {
        "(SELECT json_extract(value, '$.i') AS i, json_extract(value, '$.r') AS r \
         FROM json_each(?2)) AS t"
    }
}

/// Runs `sql` (with [`rows_source`] in place of `{rows}` and the first parameter, `at`,
/// in place of `{at}`) over `rows`, a few thousand at a time; the rows affected.
fn for_rows(
    c: &mut DbConn,
    sql: &str,
    rows: &[(i64, String)],
    at: chrono::NaiveDateTime,
) -> Result<usize, DbError> {
    let mut n = 0;
    for chunk in rows.chunks(5000) {
        n += match c {
            DbConn::Pg(pg) => {
                let ids: Vec<i64> = chunk.iter().map(|(i, _)| *i).collect();
                let texts: Vec<&str> = chunk.iter().map(|(_, r)| r.as_str()).collect();
                diesel::sql_query(
                    sql.replace("{rows}", rows_source(true))
                        .replace("{at}", "$1"),
                )
                .bind::<Timestamp, _>(at)
                .bind::<SqlArray<BigInt>, _>(ids)
                .bind::<SqlArray<Text>, _>(texts)
                .execute(pg)?
            }
            DbConn::Sqlite(lite) => {
                let json: Vec<serde_json::Value> = chunk
                    .iter()
                    .map(|(i, r)| serde_json::json!({"i": i, "r": r}))
                    .collect();
                diesel::sql_query(
                    sql.replace("{rows}", rows_source(false))
                        .replace("{at}", "?1"),
                )
                .bind::<Timestamp, _>(at)
                .bind::<Text, _>(to_json(&json)?)
                .execute(lite)?
            }
        };
    }
    Ok(n)
}

/// What held jobs say they wait for now: `(job, reason)`.
pub fn set_reasons(c: &mut DbConn, rows: &[(i64, String)]) -> Result<usize, DbError> {
    // Every statement binds the time; here it only confirms the job is not from the future.
    for_rows(
        c,
        "UPDATE jobs SET reason = t.r FROM {rows} \
         WHERE jobs.id = t.i AND jobs.held AND jobs.created_at <= {at}",
        rows,
        now(),
    )
}

/// Held jobs whose waits can no longer be met end as failed, each saying why: `(job,
/// why)`, a history row each; how many did.
pub fn fail(c: &mut DbConn, rows: &[(i64, String)]) -> Result<usize, DbError> {
    let at = now();
    let (queued, failed) = (JobState::Queued.as_str(), JobState::Failed.as_str());
    for_rows(
        c,
        &format!(
            "INSERT INTO job_events (job_id, at, state, message) \
             SELECT jobs.id, {{at}}, '{failed}', t.r FROM {{rows}} \
             JOIN jobs ON jobs.id = t.i WHERE jobs.held AND jobs.state = '{queued}'"
        ),
        rows,
        at,
    )?;
    for_rows(
        c,
        &format!(
            "UPDATE jobs SET state = '{failed}', reason = t.r, exit_code = NULL, \
               finished_at = {{at}} \
             FROM {{rows}} WHERE jobs.id = t.i AND jobs.held AND jobs.state = '{queued}'"
        ),
        rows,
        at,
    )
}
