//! Who may upload a checkpoint, and what each part counts against as it arrives: the
//! attempt's cap (one checkpoint's size) and the lab's cap (its committed checkpoints and
//! staged parts).
//!
//! Invariants:
//! - Only the node an attempt is placed on now (starting, running or stopping there: the
//!   agent uploads its final checkpoint while the attempt stops, before it reports the
//!   stop) lists, uploads or commits for it, and only while the job has not ended.
//! - A part is staged (its row written) only in the transaction that checked both caps
//!   with the lab's row locked ([`rows::lock_lab`]): concurrent uploads of one lab are
//!   counted one after the other, on every replica.
//! - A lab's use, as seen by an upload of job J: its committed checkpoints, less those J's
//!   commit would prune (`keep_per_job`), plus every staged part of the lab, the part
//!   sent again excepted. Other jobs' pruning to come is not discounted: at the worst the
//!   store holds one checkpoint more per uploading job than the cap, which the
//!   free-space floor covers.

use super::{gb, Limits};
use crate::db::checkpoint_parts::{self as rows, UploadKey};
use crate::db::checkpoints as kept;
use crate::db::models::Job;
use crate::db::{self, DbConn};
use crate::error::AppError;

/// An upload's place: the attempt's job and lab, and the commit number its parts go to.
pub(super) struct Upload {
    pub job: i64,
    pub attempt: i32,
    pub lab: i64,
    pub seq: i32,
}

impl Upload {
    pub fn key(&self) -> UploadKey {
        (self.job, self.attempt, self.seq)
    }

    pub fn prefix(&self) -> object_store::path::Path {
        super::store::commit_prefix(self.job, self.attempt, self.seq)
    }
}

/// The node `node` holds attempt `attempt` of `job` now, and the job has not ended.
pub(super) fn uploader(
    c: &mut DbConn,
    node: i64,
    job: i64,
    attempt: i32,
) -> Result<Upload, AppError> {
    let held =
        db::attempts::find(c, job, attempt)?.filter(|a| a.node_id == node && a.state.is_active());
    if held.is_none() {
        return Err(AppError::NotFound("attempt"));
    }
    let j = db::jobs::get(c, job)?;
    if j.state.is_final() {
        return Err(AppError::conflict(
            "job_ended",
            format!(
                "job {job} has ended ({}): its checkpoints are no longer kept",
                j.state
            ),
        ));
    }
    Ok(Upload {
        job,
        attempt,
        lab: j.lab_id,
        seq: kept::next_seq(c, job, attempt)?,
    })
}

/// GB (10^9 bytes) in whole bytes, as the caps are compared.
pub(super) fn bytes_of(gb: f64) -> i64 {
    (gb * 1e9).round() as i64
}

/// The most one checkpoint of an attempt of `job` may take in the store, in bytes. Today
/// the campus's `checkpoints.attempt_cap_gb` for every job; this is the one place that
/// reads it, so a job's own disk cap can take its place.
pub fn attempt_cap_bytes(limits: &Limits, _job: &Job) -> i64 {
    bytes_of(limits.attempt_cap_gb)
}

/// What [`reserve`] decided.
pub(super) enum Reserved {
    /// The part is staged: store it.
    Staged(Upload),
    /// Over a cap: refuse it with this error, and discard the upload it belonged to.
    OverCap(AppError, UploadKey),
}

/// A part to count: part `n` of the attempt's next checkpoint.
pub(super) struct Part<'a> {
    pub node: i64,
    pub job: i64,
    pub attempt: i32,
    pub n: u32,
    pub bytes: i64,
    pub sha256: &'a str,
}

/// Checks `part` against the attempt's and the lab's caps and, within both, stages it.
pub(super) fn reserve(
    c: &mut DbConn,
    limits: &Limits,
    part: &Part<'_>,
) -> Result<Reserved, AppError> {
    db::transaction(c, |c| {
        let job = db::jobs::get(c, part.job)?;
        rows::lock_lab(c, job.lab_id)?;
        let up = uploader(c, part.node, part.job, part.attempt)?;
        let staged = rows::of_upload(c, up.key())?;
        let again: i64 = staged
            .iter()
            .filter(|p| p.n == part.n as i32)
            .map(|p| p.bytes)
            .sum();
        let upload = staged.iter().map(|p| p.bytes).sum::<i64>() - again + part.bytes;
        let cap = attempt_cap_bytes(limits, &job);
        if upload > cap {
            let e = AppError::conflict(
                "checkpoint_attempt_cap",
                format!(
                    "job {} attempt {}'s checkpoint would take {} GB, over the attempt's cap \
                     of {} GB: its upload is discarded",
                    up.job,
                    up.attempt,
                    gb(upload as f64),
                    gb(cap as f64)
                ),
            );
            return Ok(Reserved::OverCap(e, up.key()));
        }
        let (slug, own_cap) = kept::lab_cap(c, up.lab)?;
        let lab_cap = bytes_of(own_cap.unwrap_or(limits.lab_cap_gb));
        let keep = limits.keep_per_job.max(1) as usize;
        let replaced: i64 = kept::for_job(c, up.job)?
            .iter()
            .skip(keep - 1)
            .map(|k| k.bytes)
            .sum();
        let used = kept::lab_bytes(c, up.lab)? - replaced + rows::staged_bytes_of_lab(c, up.lab)?
            - again
            + part.bytes;
        if used > lab_cap {
            let e = AppError::conflict(
                "checkpoint_cap",
                format!(
                    "lab {slug}'s checkpoints would use {} of {} GB",
                    gb(used as f64),
                    gb(lab_cap as f64)
                ),
            );
            return Ok(Reserved::OverCap(e, up.key()));
        }
        rows::stage(
            c,
            up.key(),
            part.n,
            up.lab,
            part.bytes,
            part.sha256,
            db::now(),
        )?;
        Ok(Reserved::Staged(up))
    })
}
