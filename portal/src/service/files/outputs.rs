//! A job's outputs: what it writes to `/outputs`, kept in its owner's own space under
//! `jobs/{job}/` (so they are files like any other: listed, downloaded, deleted, and
//! counted against the owner's quota).
//!
//! Who may do what:
//! - The node an attempt is placed on (starting, running or stopping there) uploads that
//!   attempt's outputs, through the portal: the agent holds no credential of the store,
//!   and the owner's quota counts each file as its bytes arrive, which an upload straight
//!   to the store (a signed URL) would not allow.
//! - The node with a starting or running attempt of the job downloads what earlier
//!   attempts kept (a resumed job gets its `/outputs` back).
//! - The job's owner lists them (`GET /api/v1/jobs/{id}/outputs`) and reads them as their
//!   files; others who may see the job are told whose they are (403), and anyone else
//!   gets "not found".

use super::download::{download_from, Download};
use super::upload::{upload_into, Uploaded};
use super::{check_path, entry, FileEntry, Space};
use crate::db::{self, files as rows};
use crate::domain::AttemptStatus;
use crate::error::AppError;
use crate::service::{Actor, Ctx};
use bytes::Bytes;
use commons_proto::OutputFile;
use futures_util::Stream;

/// Where a job's outputs are in its owner's space: `jobs/{job}/`.
pub fn prefix(job: i64) -> String {
    format!("jobs/{job}/")
}

/// The job's outputs, for its owner: their paths in the owner's space.
pub async fn list(ctx: &Ctx, actor: &Actor, job: i64) -> Result<Vec<FileEntry>, AppError> {
    let actor = actor.clone();
    let found = ctx
        .db
        .run(move |c| {
            let j = db::jobs::get(c, job).map_err(|_| AppError::NotFound("job"))?;
            if !actor.may_see(&j) {
                return Err(AppError::NotFound("job"));
            }
            if j.user_id != actor.user.id {
                return Err(AppError::Forbidden(format!(
                    "job {job}'s outputs are its owner's files: only they read them"
                )));
            }
            Ok(rows::list(c, &Space::of_user(j.user_id).key, &prefix(job))?)
        })
        .await?;
    Ok(found.into_iter().map(entry).collect())
}

/// The owner's space of `job`, if `node` holds attempt `attempt` of it in one of `states`.
pub(super) fn held(
    c: &mut crate::db::DbConn,
    node: i64,
    job: i64,
    attempt: i32,
    states: &[AttemptStatus],
) -> Result<Space, AppError> {
    let a = db::attempts::find(c, job, attempt)?;
    if !a.is_some_and(|a| a.node_id == node && states.contains(&a.state)) {
        return Err(AppError::NotFound("attempt"));
    }
    let j = db::jobs::get(c, job)?;
    Ok(Space::of_user(j.user_id))
}

/// `path` (relative to `/outputs`) checked, and as a path of the owner's space.
fn in_space(job: i64, path: &str) -> Result<String, AppError> {
    check_path(path)?;
    let full = format!("{}{path}", prefix(job));
    check_path(&full)?;
    Ok(full)
}

/// Stores one output file of attempt `attempt` of `job`, sent by `node`.
#[allow(clippy::too_many_arguments)]
pub async fn put_from_node<S, E>(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    path: &str,
    declared: Option<u64>,
    sha256: Option<&str>,
    body: &mut S,
) -> Result<Uploaded, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let full = in_space(job, path)?;
    let space = ctx
        .db
        .run(move |c| held(c, node, job, attempt, &AttemptStatus::ACTIVE))
        .await?;
    upload_into(ctx, space, full, declared, sha256, body).await
}

/// What the job has kept, for `node`'s starting or running `attempt` of it.
pub async fn list_for_node(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
) -> Result<Vec<OutputFile>, AppError> {
    let running = [AttemptStatus::Starting, AttemptStatus::Running];
    let found = ctx
        .db
        .run(move |c| {
            let space = held(c, node, job, attempt, &running)?;
            Ok::<_, AppError>(rows::list(c, &space.key, &prefix(job))?)
        })
        .await?;
    let p = prefix(job);
    Ok(found
        .into_iter()
        .map(|f| OutputFile {
            path: f.path.strip_prefix(&p).unwrap_or(&f.path).to_string(),
            size: f.bytes.max(0) as u64,
            sha256: f.sha256,
        })
        .collect())
}

/// One kept file, for `node`'s starting or running `attempt` of the job.
pub async fn get_for_node(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    path: &str,
) -> Result<Download, AppError> {
    let full = in_space(job, path)?;
    let running = [AttemptStatus::Starting, AttemptStatus::Running];
    let space = ctx
        .db
        .run(move |c| held(c, node, job, attempt, &running))
        .await?;
    download_from(ctx, space, full, None).await
}
