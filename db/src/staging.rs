//! How far each attempt's inputs were staged on its server, as its agent reports it
//! (`job_staging`, one row per attempt).

use super::schema::job_staging;
use super::{DbConn, DbError};
use chrono::NaiveDateTime;
use diesel::prelude::*;

/// One attempt's staging.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = job_staging)]
pub struct StagingRow {
    pub job_id: i64,
    pub attempt: i32,
    pub done_bytes: i64,
    pub total_bytes: i64,
    pub finished: bool,
    pub started_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
}

/// The attempt's staging, if its agent reported any.
pub fn get(c: &mut DbConn, job: i64, attempt: i32) -> Result<Option<StagingRow>, DbError> {
    Ok(job_staging::table
        .find((job, attempt))
        .select(StagingRow::as_select())
        .first(c)
        .optional()?)
}

/// Records a report; the first one of the attempt starts its row (and its clock).
/// Returns the row as it was before (none: this is the first report).
pub fn report(
    c: &mut DbConn,
    job: i64,
    attempt: i32,
    done: i64,
    total: i64,
    finished: bool,
    at: NaiveDateTime,
) -> Result<Option<StagingRow>, DbError> {
    let before = get(c, job, attempt)?;
    match &before {
        Some(_) => {
            diesel::update(job_staging::table.find((job, attempt)))
                .set((
                    job_staging::done_bytes.eq(done),
                    job_staging::total_bytes.eq(total),
                    job_staging::finished.eq(finished),
                    job_staging::updated_at.eq(at),
                ))
                .execute(c)?;
        }
        None => {
            diesel::insert_into(job_staging::table)
                .values((
                    job_staging::job_id.eq(job),
                    job_staging::attempt.eq(attempt),
                    job_staging::done_bytes.eq(done),
                    job_staging::total_bytes.eq(total),
                    job_staging::finished.eq(finished),
                    job_staging::started_at.eq(at),
                    job_staging::updated_at.eq(at),
                ))
                .execute(c)?;
        }
    }
    Ok(before)
}
