//! Uploads in parts (`commons_api::uploads` documents the protocol): a large file sent as
//! numbered parts, each stored as its own object as it arrives, joined into the file's
//! object when the client says it is complete.
//!
//! Invariants:
//! - The whole size is reserved against the space's quota at the start
//!   ([`quota::start`]), so no part is ever refused for the quota, and nothing is visible
//!   as a file before [`complete`] commits it.
//! - Only the user who started an upload sees or changes it (anyone else: 404, so its id
//!   tells nothing), and only while they may still write its space.
//! - A part is exactly as long as its number says ([`part_len`]); a part sent again
//!   replaces the earlier one. A failed join keeps the parts: the client may complete again.
//! - The parts' objects go when the upload completes, is given up, or is swept after
//!   [`RESUMABLE_FOR_S`] without a part.

use super::quota;
use super::store::{fresh_key, part_key};
use super::upload::{commit, Uploaded};
use super::{check_path, open, Access, Space, Which};
use crate::db::files::UploadRow;
use crate::db::upload_parts::{self as rows, NewParted};
use crate::db::{self, DbConn};
use crate::error::AppError;
use crate::service::{Actor, Ctx};
use bytes::{Bytes, BytesMut};
use commons_api::files::Space as Named;
use commons_api::uploads::{part_count, part_len, UploadStart, UploadView, PART_BYTES};
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};

pub use commons_api::uploads::RESUMABLE_FOR_S;

/// The space an upload's row names, opened for writing by `actor`, with the path users
/// write for it (`lab:SLUG/PATH` in a lab's).
fn reopen(c: &mut DbConn, actor: &Actor, row: &UploadRow) -> Result<(Space, String), AppError> {
    let which = match row.space.strip_prefix("lab:") {
        Some(id) => {
            let id = id.parse().map_err(|_| {
                AppError::Internal(anyhow::anyhow!("an upload of space {:?}", row.space))
            })?;
            Which::Lab(db::users::lab_by_id(c, id)?.slug)
        }
        None => Which::Mine,
    };
    let space = open(c, actor, &which, Access::Write)?;
    let shown = match &which {
        Which::Mine => row.path.clone(),
        Which::Lab(slug) => format!("lab:{slug}/{}", row.path),
    };
    Ok((space, shown))
}

/// The caller's upload `id` with its space: 404 when it is not theirs or not an upload
/// in parts, 403 when they may no longer write its space.
fn mine(c: &mut DbConn, actor: &Actor, id: i64) -> Result<(UploadRow, Space, String), AppError> {
    let row = rows::get(c, id)?
        .filter(|r| r.resumable_by == Some(actor.user.id))
        .ok_or(AppError::NotFound("upload"))?;
    let (space, shown) = reopen(c, actor, &row)?;
    Ok((row, space, shown))
}

fn view(c: &mut DbConn, row: &UploadRow, shown: String) -> Result<UploadView, AppError> {
    let parts = rows::parts(c, row.id)?;
    let size = row.size.unwrap_or(0).max(0) as u64;
    Ok(UploadView {
        id: row.id,
        path: shown,
        size,
        part_bytes: PART_BYTES,
        parts: part_count(size),
        received: parts.iter().map(|&(n, _)| n.max(0) as u32).collect(),
        received_bytes: parts.iter().map(|&(_, b)| b.max(0) as u64).sum(),
    })
}

/// Starts an upload in parts: checks the path and the right to write its space, and
/// reserves the whole size (413 `file_quota` when it does not fit).
pub async fn start(ctx: &Ctx, actor: &Actor, req: UploadStart) -> Result<UploadView, AppError> {
    let (named, path) = req.target()?;
    let path = path.to_string();
    check_path(&path)?;
    let size = i64::try_from(req.size)
        .map_err(|_| AppError::invalid("size", "size is larger than any file can be"))?;
    let sha = req.sha256.map(|s| s.to_ascii_lowercase());
    let (actor, quotas) = (actor.clone(), ctx.files.quotas);
    ctx.db
        .run(move |c| {
            let which = match named {
                Named::Mine => Which::Mine,
                Named::Lab(slug) => Which::Lab(slug),
            };
            let space = open(c, &actor, &which, Access::Write)?;
            let object = fresh_key(&space.prefix);
            let id = db::transaction(c, |c| {
                quota::fits(c, &quotas, &space, &path, size)?;
                let new = NewParted {
                    space: &space.key,
                    path: &path,
                    object: &object,
                    user: actor.user.id,
                    size,
                    sha256: sha.as_deref(),
                    at: db::now(),
                };
                Ok::<_, AppError>(rows::start(c, &new)?)
            })?;
            let row = rows::get(c, id)?.ok_or(AppError::NotFound("upload"))?;
            let (_, shown) = reopen(c, &actor, &row)?;
            view(c, &row, shown)
        })
        .await
}

/// The caller's unfinished uploads in parts, oldest first (those of spaces they may no
/// longer write are left out).
pub async fn list_mine(ctx: &Ctx, actor: &Actor) -> Result<Vec<UploadView>, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let mut out = Vec::new();
            for row in rows::of_user(c, actor.user.id)? {
                if let Ok((_, shown)) = reopen(c, &actor, &row) {
                    out.push(view(c, &row, shown)?);
                }
            }
            Ok(out)
        })
        .await
}

/// The caller's upload `id`.
pub async fn show(ctx: &Ctx, actor: &Actor, id: i64) -> Result<UploadView, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let (row, _, shown) = mine(c, &actor, id)?;
            view(c, &row, shown)
        })
        .await
}

/// Stores part `n` of upload `id` from `body`, which must hold exactly the part's bytes.
pub async fn put_part<S, E>(
    ctx: &Ctx,
    actor: &Actor,
    id: i64,
    n: u32,
    body: &mut S,
) -> Result<UploadView, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let a = actor.clone();
    let (row, _, shown) = ctx.db.run(move |c| mine(c, &a, id)).await?;
    let size = row.size.unwrap_or(0).max(0) as u64;
    let want = part_len(size, n).ok_or_else(|| {
        AppError::invalid(
            "n",
            format!(
                "the file has parts 0 to {}: there is no part {n}",
                part_count(size) - 1
            ),
        )
    })?;
    let mut got = BytesMut::with_capacity(want as usize);
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| AppError::BadRequest(format!("the part was cut off: {e}")))?;
        if (got.len() + chunk.len()) as u64 > want {
            return Err(AppError::BadRequest(format!(
                "part {n} must be {want} bytes; more arrived"
            )));
        }
        got.extend_from_slice(&chunk);
    }
    if (got.len() as u64) < want {
        return Err(AppError::BadRequest(format!(
            "part {n} must be {want} bytes; {} arrived",
            got.len()
        )));
    }
    let key = part_key(&row.object, n);
    ctx.files.store.put(&key, got.freeze()).await?;
    let bytes = want as i64;
    let stored = ctx
        .db
        .run(move |c| {
            if !rows::put_part(c, id, n as i32, bytes, db::now())? {
                return Ok(None);
            }
            view(c, &row, shown).map(Some)
        })
        .await?;
    match stored {
        Some(v) => Ok(v),
        None => {
            ctx.files.store.delete(&key).await?;
            Err(AppError::NotFound("upload"))
        }
    }
}

/// Joins the parts of upload `id` into its file, replacing any file at its path: 409
/// `upload_incomplete` naming the missing parts; 422 when the joined bytes do not hash
/// to the SHA-256 the start named (the parts stay: send the wrong ones again).
pub async fn complete(ctx: &Ctx, actor: &Actor, id: i64) -> Result<Uploaded, AppError> {
    let a = actor.clone();
    let (row, space, parts) = ctx
        .db
        .run(move |c| {
            let (row, space, _) = mine(c, &a, id)?;
            let parts = rows::parts(c, id)?;
            Ok::<_, AppError>((row, space, parts))
        })
        .await?;
    let size = row.size.unwrap_or(0).max(0) as u64;
    let count = part_count(size);
    let have: Vec<u32> = parts.iter().map(|&(n, _)| n.max(0) as u32).collect();
    let missing: Vec<String> = (0..count)
        .filter(|n| !have.contains(n))
        .map(|n| n.to_string())
        .collect();
    if !missing.is_empty() {
        let shown: Vec<String> = missing.iter().take(10).cloned().collect();
        return Err(AppError::conflict(
            "upload_incomplete",
            format!(
                "{} of its {count} parts are missing (parts {}{}): send them, then complete",
                missing.len(),
                shown.join(", "),
                if missing.len() > 10 { ", ..." } else { "" }
            ),
        ));
    }
    let object = fresh_key(&space.prefix);
    let joined = join(ctx, &row.object, count, &object).await;
    let (bytes, sha) = match joined {
        Ok(j) => j,
        Err(e) => {
            let _ = ctx.files.store.delete(&object).await;
            return Err(e);
        }
    };
    if let Some(want) = row.sha256.as_deref().filter(|w| **w != sha) {
        let _ = ctx.files.store.delete(&object).await;
        return Err(AppError::invalid(
            "sha256",
            format!(
                "the parts join into bytes with SHA-256 {sha}, but the upload's start said \
                 {want}: a part was damaged on the way; send the parts again and complete"
            ),
        ));
    }
    let done = commit(ctx, &space, &row.path, &object, id, (bytes as i64, sha)).await;
    if done.is_err() {
        let _ = ctx.files.store.delete(&object).await;
    }
    let done = done?;
    remove_parts(ctx, &row.object, count).await;
    Ok(done)
}

/// Streams the parts of the upload whose object is `parts_of` into the object `into`,
/// hashing them: (bytes, SHA-256).
async fn join(
    ctx: &Ctx,
    parts_of: &str,
    count: u32,
    into: &str,
) -> Result<(u64, String), AppError> {
    let mut writer = ctx.files.store.writer(into).await?;
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    for n in 0..count {
        let mut part = match ctx.files.store.read(&part_key(parts_of, n), None).await {
            Ok(p) => p,
            Err(e) => {
                writer.abort().await;
                return Err(e);
            }
        };
        while let Some(chunk) = part.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    writer.abort().await;
                    return Err(super::store::unavailable("read a part", e));
                }
            };
            hash.update(&chunk);
            bytes += chunk.len() as u64;
            if let Err(e) = writer.write(chunk).await {
                writer.abort().await;
                return Err(e);
            }
        }
    }
    writer.finish().await?;
    Ok((bytes, hex::encode(hash.finalize())))
}

/// Deletes the objects of an upload's parts (what fails to go stays for the sweep).
pub(super) async fn remove_parts(ctx: &Ctx, object: &str, count: u32) {
    for n in 0..count {
        if let Err(e) = ctx.files.store.delete(&part_key(object, n)).await {
            tracing::warn!(object, part = n, "a part's object stays for the sweep: {e}");
        }
    }
}

/// Gives up upload `id`: its reservation, its row and its parts go.
pub async fn abort(ctx: &Ctx, actor: &Actor, id: i64) -> Result<(), AppError> {
    let a = actor.clone();
    let row = ctx
        .db
        .run(move |c| {
            let (row, _, _) = mine(c, &a, id)?;
            quota::forget(c, id)?;
            Ok::<_, AppError>(row)
        })
        .await?;
    let size = row.size.unwrap_or(0).max(0) as u64;
    remove_parts(ctx, &row.object, part_count(size)).await;
    Ok(())
}
