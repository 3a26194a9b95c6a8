//! Staged checkpoint parts: the rows of parts uploaded and not yet committed, so that a
//! lab's use of the store (committed checkpoints plus these) and an upload's size are
//! known as each part arrives, without listing the store.
//!
//! Invariants (kept by `service::checkpoints`):
//! - A part's row is written before its object, in the transaction that checked the caps
//!   with the lab's row locked ([`lock_lab`]); at most one row per part number of an
//!   upload (job, attempt, seq): a part sent again replaces it.
//! - Rows go before their objects when an upload is discarded or removed, so an object
//!   stored while its row was being removed is found by the uploader, which deletes it.
//! - A commit deletes its upload's rows in the transaction that records the checkpoint.

use super::schema::*;
use super::DbConn;
use super::DbError;
use crate::domain::AttemptStatus;
use chrono::NaiveDateTime;
use diesel::prelude::*;
use std::collections::BTreeMap;

/// One staged part.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = checkpoint_parts)]
pub struct StagedPart {
    pub id: i64,
    pub job_id: i64,
    pub attempt: i32,
    pub seq: i32,
    pub n: i32,
    /// The job's lab: the bytes count against its cap.
    pub lab_id: i64,
    pub bytes: i64,
    pub sha256: String,
    pub created_at: NaiveDateTime,
}

/// Which upload a part belongs to: (job, attempt, seq).
pub type UploadKey = (i64, i32, i32);

/// Holds the lab's row until the transaction ends, so that two uploads of one lab count
/// and stage their parts one after the other. PostgreSQL: `SELECT ... FOR UPDATE`;
/// SQLite serialises writers already (one connection, see `db`).
pub fn lock_lab(c: &mut DbConn, lab: i64) -> Result<(), DbError> {
    if let DbConn::Pg(pg) = c {
        labs::table
            .find(lab)
            .select(labs::id)
            .for_update()
            .first::<i64>(pg)?;
    }
    Ok(())
}

/// Records part `n` of the upload `key` (replacing an earlier row for the same part).
pub fn stage(
    c: &mut DbConn,
    (job, attempt, seq): UploadKey,
    n: u32,
    lab: i64,
    bytes: i64,
    sha256: &str,
    at: NaiveDateTime,
) -> Result<(), DbError> {
    diesel::delete(
        checkpoint_parts::table
            .filter(checkpoint_parts::job_id.eq(job))
            .filter(checkpoint_parts::attempt.eq(attempt))
            .filter(checkpoint_parts::seq.eq(seq))
            .filter(checkpoint_parts::n.eq(n as i32)),
    )
    .execute(c)?;
    diesel::insert_into(checkpoint_parts::table)
        .values((
            checkpoint_parts::job_id.eq(job),
            checkpoint_parts::attempt.eq(attempt),
            checkpoint_parts::seq.eq(seq),
            checkpoint_parts::n.eq(n as i32),
            checkpoint_parts::lab_id.eq(lab),
            checkpoint_parts::bytes.eq(bytes),
            checkpoint_parts::sha256.eq(sha256),
            checkpoint_parts::created_at.eq(at),
        ))
        .execute(c)?;
    Ok(())
}

/// The staged parts of one upload, by number.
pub fn of_upload(
    c: &mut DbConn,
    (job, attempt, seq): UploadKey,
) -> Result<Vec<StagedPart>, DbError> {
    Ok(checkpoint_parts::table
        .filter(checkpoint_parts::job_id.eq(job))
        .filter(checkpoint_parts::attempt.eq(attempt))
        .filter(checkpoint_parts::seq.eq(seq))
        .order(checkpoint_parts::n)
        .select(StagedPart::as_select())
        .load(c)?)
}

/// Whether part `n` of the upload is staged with this checksum.
pub fn is_staged(c: &mut DbConn, key: UploadKey, n: u32, sha256: &str) -> Result<bool, DbError> {
    Ok(of_upload(c, key)?
        .iter()
        .any(|p| p.n == n as i32 && p.sha256 == sha256))
}

/// Every staged part of a job (tests and the job's pruning).
pub fn staged_of_job(c: &mut DbConn, job: i64) -> Result<Vec<StagedPart>, DbError> {
    Ok(checkpoint_parts::table
        .filter(checkpoint_parts::job_id.eq(job))
        .order((
            checkpoint_parts::attempt,
            checkpoint_parts::seq,
            checkpoint_parts::n,
        ))
        .select(StagedPart::as_select())
        .load(c)?)
}

/// Bytes staged for `lab`.
pub fn staged_bytes_of_lab(c: &mut DbConn, lab: i64) -> Result<i64, DbError> {
    // Summed here: SUM over BIGINT is NUMERIC on PostgreSQL and BIGINT on SQLite.
    let sizes: Vec<i64> = checkpoint_parts::table
        .filter(checkpoint_parts::lab_id.eq(lab))
        .select(checkpoint_parts::bytes)
        .load(c)?;
    Ok(sizes.iter().sum())
}

/// Deletes the rows of one upload; returns how many went.
pub fn unstage_upload(c: &mut DbConn, (job, attempt, seq): UploadKey) -> Result<usize, DbError> {
    Ok(diesel::delete(
        checkpoint_parts::table
            .filter(checkpoint_parts::job_id.eq(job))
            .filter(checkpoint_parts::attempt.eq(attempt))
            .filter(checkpoint_parts::seq.eq(seq)),
    )
    .execute(c)?)
}

/// Uploads whose attempt is no longer placed (ended, replaced, or unknown): nothing may
/// add to them any more, and nothing will commit them.
pub fn abandoned(c: &mut DbConn) -> Result<Vec<UploadKey>, DbError> {
    let keys: Vec<UploadKey> = checkpoint_parts::table
        .select((
            checkpoint_parts::job_id,
            checkpoint_parts::attempt,
            checkpoint_parts::seq,
        ))
        .distinct()
        .load(c)?;
    if keys.is_empty() {
        return Ok(keys);
    }
    let jobs: Vec<i64> = keys.iter().map(|k| k.0).collect();
    let states: BTreeMap<(i64, i32), AttemptStatus> = job_attempts::table
        .filter(job_attempts::job_id.eq_any(&jobs))
        .select((
            job_attempts::job_id,
            job_attempts::attempt,
            job_attempts::state,
        ))
        .load::<(i64, i32, AttemptStatus)>(c)?
        .into_iter()
        .map(|(j, a, s)| ((j, a), s))
        .collect();
    Ok(keys
        .into_iter()
        .filter(|(j, a, _)| !states.get(&(*j, *a)).is_some_and(|s| s.is_active()))
        .collect())
}

/// Deletes every staged row of `job`.
pub fn unstage_job(c: &mut DbConn, job: i64) -> Result<usize, DbError> {
    Ok(
        diesel::delete(checkpoint_parts::table.filter(checkpoint_parts::job_id.eq(job)))
            .execute(c)?,
    )
}
