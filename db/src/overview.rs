//! Reads for the campus overview: who holds which GPU now, what waits, and how long
//! recently started jobs waited. Plain queries; the service layer classifies.

use super::models::{Attempt, JobKind, JobState};
use super::schema::*;
use super::DbConn;
use super::DbError;
use crate::domain::AttemptStatus;
use chrono::NaiveDateTime;
use diesel::prelude::*;

/// An active attempt with its job's lab and owner.
#[derive(Debug, Clone)]
pub struct Holder {
    pub attempt: Attempt,
    pub job_lab: i64,
    pub username: String,
}

/// Active attempts (starting, running, stopping) with their job's lab and user.
pub fn holders(c: &mut DbConn) -> Result<Vec<Holder>, DbError> {
    let rows: Vec<(Attempt, i64, String)> = job_attempts::table
        .inner_join(jobs::table.inner_join(users::table))
        .filter(job_attempts::state.eq_any(AttemptStatus::ACTIVE))
        .order(job_attempts::id)
        .select((Attempt::as_select(), jobs::lab_id, users::username))
        .load(c)?;
    Ok(rows
        .into_iter()
        .map(|(attempt, job_lab, username)| Holder {
            attempt,
            job_lab,
            username,
        })
        .collect())
}

/// A waiting job, as the queue summary counts it.
#[derive(Debug, Clone, Queryable)]
pub struct Waiting {
    pub lab_id: i64,
    pub gpus: i32,
    pub kind: JobKind,
    pub created_at: NaiveDateTime,
}

/// Every queued job, oldest first.
pub fn waiting(c: &mut DbConn) -> Result<Vec<Waiting>, DbError> {
    Ok(jobs::table
        .filter(jobs::state.eq(JobState::Queued))
        .order(jobs::id)
        .select((jobs::lab_id, jobs::gpus, jobs::kind, jobs::created_at))
        .load(c)?)
}

/// (submitted, first started) of jobs that first started after `since`.
pub fn recent_starts(
    c: &mut DbConn,
    since: NaiveDateTime,
) -> Result<Vec<(NaiveDateTime, NaiveDateTime)>, DbError> {
    let rows: Vec<(NaiveDateTime, Option<NaiveDateTime>)> = jobs::table
        .filter(jobs::started_at.gt(since))
        .select((jobs::created_at, jobs::started_at))
        .load(c)?;
    Ok(rows
        .into_iter()
        .filter_map(|(a, b)| b.map(|b| (a, b)))
        .collect())
}
