//! Jobs that wait for other jobs (`after`): the held jobs and the states of what they
//! wait for, read for `service::deps`, which decides; and the two ways a held job moves
//! on (released into the queue, or ended as failed through `jobs::set_state`).

use super::models::JobState;
use super::schema::*;
use super::types::Json;
use super::DbConn;
use super::DbError;
use commons_api::flows::After;
use diesel::prelude::*;
use std::collections::BTreeMap;

/// What a job waiting for `a` says: the scheduler's words for a job ("waiting for job 41
/// to succeed"), the same for an array ("waiting for array 3 to succeed").
pub fn waiting_text(a: &After) -> String {
    match a.array {
        Some(id) => format!("waiting for array {id} to {}", a.when.verb()),
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
}

/// Every held job that still waits (queued), in id order (through the partial index on
/// `held`).
pub fn held(c: &mut DbConn) -> Result<Vec<Held>, DbError> {
    Ok(jobs::table
        .filter(jobs::held)
        .filter(jobs::state.eq(JobState::Queued))
        .order(jobs::id)
        .select((jobs::id, jobs::after_jobs, jobs::reason))
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

/// The owners and labs of the jobs `ids` that exist: `id -> (user, lab)`.
pub fn owners(c: &mut DbConn, ids: &[i64]) -> Result<BTreeMap<i64, (i64, i64)>, DbError> {
    let rows: Vec<(i64, i64, i64)> = jobs::table
        .filter(jobs::id.eq_any(ids))
        .select((jobs::id, jobs::user_id, jobs::lab_id))
        .load(c)?;
    Ok(rows.into_iter().map(|(j, u, l)| (j, (u, l))).collect())
}

/// A held job whose waits are all met joins the queue (if it still waits).
pub fn release(c: &mut DbConn, job: i64, reason: &str) -> Result<(), DbError> {
    diesel::update(
        jobs::table
            .find(job)
            .filter(jobs::state.eq(JobState::Queued)),
    )
    .set((jobs::held.eq(false), jobs::reason.eq(Some(reason))))
    .execute(c)?;
    Ok(())
}

/// What a held job says it waits for now.
pub fn set_reason(c: &mut DbConn, job: i64, reason: &str) -> Result<(), DbError> {
    diesel::update(jobs::table.find(job).filter(jobs::held))
        .set(jobs::reason.eq(Some(reason)))
        .execute(c)?;
    Ok(())
}

/// A held job whose wait can no longer be met ends as failed, saying why.
pub fn fail(c: &mut DbConn, job: i64, why: &str) -> Result<(), DbError> {
    super::jobs::set_result(c, job, None, Some(why))?;
    super::jobs::set_state(c, job, JobState::Failed, why)
}
