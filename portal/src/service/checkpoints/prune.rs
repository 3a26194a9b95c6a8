//! Removing what the store no longer needs: uploads that will never be committed (their
//! attempt is no longer placed, or a part went over a cap), and everything of jobs that
//! ended a while ago. The scheduler's leader runs [`prune_abandoned`] and
//! [`prune_finished`] every few minutes.
//!
//! Invariants:
//! - An upload's rows go before its objects, in a transaction that holds the lab's row
//!   (as staging and committing do) and checks again that the upload may go; a part
//!   stored meanwhile finds its row gone and deletes itself (`put_part`).
//! - Objects of a committed checkpoint are never removed here while its row stays.

use super::store::{commit_prefix, job_prefix};
use super::KEEP_ENDED_S;
use crate::db::checkpoint_parts::{self as staged, UploadKey};
use crate::db::checkpoints as rows;
use crate::db::{self, DbConn};
use crate::error::AppError;
use crate::service::Ctx;

/// Whether an upload may go: any time after a cap refused it, and once its attempt is
/// no longer placed otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum When {
    OverCap,
    Abandoned,
}

fn unstage(c: &mut DbConn, (job, attempt, seq): UploadKey, when: When) -> Result<bool, AppError> {
    db::transaction(c, |c| {
        let Some(j) = db::jobs::by_ids(c, &[job])?.into_iter().next() else {
            // The job is gone, and its rows with it (ON DELETE CASCADE).
            return Ok(true);
        };
        staged::lock_lab(c, j.lab_id)?;
        if when == When::Abandoned
            && db::attempts::find(c, job, attempt)?.is_some_and(|a| a.state.is_active())
        {
            return Ok(false);
        }
        staged::unstage_upload(c, (job, attempt, seq))?;
        let committed = rows::for_job(c, job)?
            .iter()
            .any(|k| k.attempt == attempt && k.seq == seq);
        Ok(!committed)
    })
}

/// Removes an upload that will never be committed: its rows, then its objects. Returns
/// whether it went.
pub(super) async fn drop_upload(ctx: &Ctx, key: UploadKey, when: When) -> Result<bool, AppError> {
    let gone = ctx.db.run(move |c| unstage(c, key, when)).await?;
    if gone {
        let (job, attempt, seq) = key;
        ctx.checkpoints
            .delete_prefix(&commit_prefix(job, attempt, seq))
            .await?;
    }
    Ok(gone)
}

/// Removes the uploads whose attempt is no longer placed (replaced, ended, lost): rows and
/// objects. Returns how many went.
pub async fn prune_abandoned(ctx: &Ctx) -> Result<usize, AppError> {
    let keys = ctx.db.run(staged::abandoned).await?;
    let mut gone = 0;
    for key in keys {
        if drop_upload(ctx, key, When::Abandoned).await? {
            gone += 1;
        }
    }
    if gone > 0 {
        tracing::info!(uploads = gone, "uncommitted checkpoint uploads removed");
    }
    Ok(gone)
}

/// Deletes the checkpoints of jobs that ended (succeeded, failed, cancelled) more than
/// [`KEEP_ENDED_S`] ago: their rows and every object under their prefix, and also objects
/// of such jobs that no row names (uploads never committed, deletions cut short). Lists
/// the store's job prefixes once: call it every few minutes, not every tick. Returns the
/// number of jobs cleared.
pub async fn prune_finished(ctx: &Ctx) -> Result<usize, AppError> {
    let before = db::now() - chrono::Duration::seconds(KEEP_ENDED_S);
    let listed = ctx.checkpoints.jobs().await?;
    let jobs = ctx
        .db
        .run(move |c| {
            let mut jobs = rows::ended_jobs_with_checkpoints(c, before)?;
            jobs.extend(rows::gone_or_ended_before(c, &listed, before)?);
            jobs.sort_unstable();
            jobs.dedup();
            Ok::<_, AppError>(jobs)
        })
        .await?;
    let mut cleared = 0;
    for job in jobs {
        // Objects first: should this fail, the rows stay and the next run tries again.
        ctx.checkpoints.delete_prefix(&job_prefix(job)).await?;
        ctx.db
            .run(move |c| {
                staged::unstage_job(c, job)?;
                rows::delete_for_job(c, job)
            })
            .await?;
        cleared += 1;
    }
    if cleared > 0 {
        tracing::info!(jobs = cleared, "checkpoints of ended jobs pruned");
    }
    Ok(cleared)
}
