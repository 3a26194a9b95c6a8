//! Committing an upload: the staged parts are checked, read back, described by a manifest
//! and recorded as the attempt's next checkpoint, and the job's older ones pruned.

use super::caps::{uploader, Upload};
use super::store::{self, part_path, StoredPart, MANIFEST};
use super::{checksum, gb, rfc3339, rows, staging, Limits};
use crate::db::checkpoints::{Checkpoint, NewCheckpoint};
use crate::db::{self, DbConn};
use crate::error::AppError;
use crate::service::Ctx;
use commons_proto::{
    CheckpointCommit, CheckpointCommitted, CheckpointManifest, CheckpointPart, MAX_CHECKPOINT_PARTS,
};
use futures_util::TryStreamExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Reads the parts back, checking each against its name and the whole against `want`.
async fn verify(
    ctx: &Ctx,
    prefix: &object_store::path::Path,
    parts: &[StoredPart],
    want: &str,
) -> Result<(), AppError> {
    let mut whole = Sha256::new();
    for p in parts {
        let path = part_path(prefix, p.n, &p.sha256);
        let mut stream = ctx.checkpoints.concat(vec![path.clone()]).await?;
        let mut one = Sha256::new();
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| store::unavailable("read a part back", e))?
        {
            one.update(&chunk);
            whole.update(&chunk);
        }
        if hex::encode(one.finalize()) != p.sha256 {
            ctx.checkpoints.delete(&path).await?;
            return Err(AppError::invalid(
                "parts",
                format!(
                    "part {} was damaged in the store and is deleted: upload it again",
                    p.n
                ),
            ));
        }
    }
    let got = hex::encode(whole.finalize());
    if got != want {
        return Err(AppError::invalid(
            "sha256",
            format!("the parts together have SHA-256 {got}, but the commit says {want}"),
        ));
    }
    Ok(())
}

/// What a commit did in the database.
struct Recorded {
    row: Checkpoint,
    pruned: Vec<Checkpoint>,
}

/// Records the checkpoint if the node still holds the attempt and the lab's cap allows,
/// pruning the job's older ones; its staged parts become the checkpoint. The lab's row is
/// held, as when parts are staged or uploads pruned.
fn record(c: &mut DbConn, limits: Limits, new: &NewCheckpoint<'_>) -> Result<Recorded, AppError> {
    db::transaction(c, |c| {
        staging::lock_lab(c, new.lab_id)?;
        uploader(c, new.node_id, new.job_id, new.attempt)?;
        let existing = rows::for_job(c, new.job_id)?;
        let keep = limits.keep_per_job.max(1) as usize;
        let newer = existing
            .iter()
            .filter(|k| (k.attempt, k.seq) > (new.attempt, new.seq))
            .count();
        if newer >= keep {
            return Err(AppError::conflict(
                "checkpoint_superseded",
                format!(
                    "job {} has {newer} newer checkpoints (attempt {}): this one would not be kept",
                    new.job_id,
                    existing.first().map(|k| k.attempt).unwrap_or(new.attempt)
                ),
            ));
        }
        // Newest first: the new one takes one of the `keep` places.
        let pruned: Vec<Checkpoint> = existing.into_iter().skip(keep - 1).collect();
        let (slug, own_cap) = rows::lab_cap(c, new.lab_id)?;
        let cap_gb = own_cap.unwrap_or(limits.lab_cap_gb);
        let freed: i64 = pruned.iter().map(|k| k.bytes).sum();
        let used = rows::lab_bytes(c, new.lab_id)? - freed + new.bytes;
        if used as f64 > cap_gb * 1e9 {
            return Err(AppError::conflict(
                "checkpoint_cap",
                format!(
                    "lab {slug}'s checkpoints would use {} of {} GB",
                    gb(used as f64),
                    gb(cap_gb * 1e9)
                ),
            ));
        }
        let row = rows::insert(c, new)?;
        staging::unstage_upload(c, (new.job_id, new.attempt, new.seq))?;
        let ids: Vec<i64> = pruned.iter().map(|k| k.id).collect();
        rows::delete(c, &ids)?;
        Ok(Recorded { row, pruned })
    })
}

/// Commits the uploaded parts `0..parts` as the attempt's next checkpoint.
pub async fn commit(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    req: CheckpointCommit,
) -> Result<CheckpointCommitted, AppError> {
    let want = checksum("sha256", &req.sha256)?;
    if req.parts == 0 || req.parts > MAX_CHECKPOINT_PARTS {
        return Err(AppError::invalid(
            "parts",
            format!("a checkpoint has 1 to {MAX_CHECKPOINT_PARTS} parts"),
        ));
    }
    let up = ctx.db.run(move |c| uploader(c, node, job, attempt)).await?;
    let prefix = up.prefix();
    let mut staged = ctx.checkpoints.parts(&prefix).await?;
    if staged.is_empty() && up.seq > 1 {
        if let Some(done) = committed_before(ctx, &up, &want, &req).await? {
            return Ok(done);
        }
    }
    let parts = take_parts(&mut staged, &req)?;
    verify(ctx, &prefix, &parts, &want).await?;
    let at = db::now();
    let bytes = req.bytes;
    write_manifest(ctx, &up, node, &want, &parts, at).await?;
    let limits = ctx.checkpoints.limits();
    let key = prefix.to_string();
    let (lab, seq, parts_n) = (up.lab, up.seq, req.parts as i32);
    // Beyond i64 is no write time anyone measured: dropped rather than stored wrapped.
    let write_ms = req.write_ms.and_then(|ms| i64::try_from(ms).ok());
    let done = ctx
        .db
        .run(move |c| {
            let new = NewCheckpoint {
                job_id: job,
                attempt,
                seq,
                node_id: node,
                lab_id: lab,
                prefix: &key,
                bytes: bytes as i64,
                sha256: &want,
                parts: parts_n,
                created_at: at,
                write_ms,
            };
            record(c, limits, &new)
        })
        .await?;
    clean_up(ctx, job, &done.pruned, &prefix, staged).await?;
    tracing::info!(
        job,
        attempt,
        seq,
        bytes,
        write_ms,
        pruned = done.pruned.len(),
        "checkpoint stored"
    );
    Ok(CheckpointCommitted {
        id: done.row.id,
        at: rfc3339(done.row.created_at),
    })
}

/// A commit sent again after its answer was lost: the same archive, recorded before.
async fn committed_before(
    ctx: &Ctx,
    up: &Upload,
    want: &str,
    req: &CheckpointCommit,
) -> Result<Option<CheckpointCommitted>, AppError> {
    let (job, attempt, seq) = (up.job, up.attempt, up.seq);
    let prev = ctx
        .db
        .run(move |c| rows::for_job(c, job))
        .await?
        .into_iter()
        .find(|k| k.attempt == attempt && k.seq == seq - 1);
    Ok(prev
        .filter(|k| k.sha256 == want && k.bytes as u64 == req.bytes && k.parts as u32 == req.parts)
        .map(|k| CheckpointCommitted {
            id: k.id,
            at: rfc3339(k.created_at),
        }))
}

/// Parts `0..req.parts`, each stored once, holding `req.bytes` together; taken out of
/// `staged`, which keeps the parts past them.
fn take_parts(
    staged: &mut BTreeMap<u32, Vec<StoredPart>>,
    req: &CheckpointCommit,
) -> Result<Vec<StoredPart>, AppError> {
    let mut parts = Vec::with_capacity(req.parts as usize);
    for n in 0..req.parts {
        match staged.remove(&n) {
            Some(mut v) if v.len() == 1 => parts.extend(v.pop()),
            Some(_) => {
                return Err(AppError::invalid(
                    "parts",
                    format!("part {n} was sent twice with different contents: upload it again"),
                ))
            }
            None => {
                return Err(AppError::invalid(
                    "parts",
                    format!("part {n} is missing: upload it, then commit again"),
                ))
            }
        }
    }
    let bytes: u64 = parts.iter().map(|p| p.bytes).sum();
    if bytes != req.bytes {
        return Err(AppError::invalid(
            "bytes",
            format!(
                "parts 0 to {} hold {bytes} bytes, but the commit says {}",
                req.parts - 1,
                req.bytes
            ),
        ));
    }
    Ok(parts)
}

/// Writes the checkpoint's manifest beside its parts (before its row: a row always names
/// a whole archive).
async fn write_manifest(
    ctx: &Ctx,
    up: &Upload,
    node: i64,
    want: &str,
    parts: &[StoredPart],
    at: chrono::NaiveDateTime,
) -> Result<(), AppError> {
    let manifest = CheckpointManifest {
        job: up.job,
        attempt: up.attempt,
        seq: up.seq,
        node,
        bytes: parts.iter().map(|p| p.bytes).sum(),
        sha256: want.to_string(),
        at: rfc3339(at),
        parts: parts
            .iter()
            .map(|p| CheckpointPart {
                n: p.n,
                bytes: p.bytes,
                sha256: p.sha256.clone(),
            })
            .collect(),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| AppError::Internal(e.into()))?;
    ctx.checkpoints
        .put(&up.prefix().join(MANIFEST), json.into())
        .await
}

/// Removes the objects of the pruned checkpoints (a failure leaves them for the pruner)
/// and the staged parts past the committed ones.
async fn clean_up(
    ctx: &Ctx,
    job: i64,
    pruned: &[Checkpoint],
    prefix: &object_store::path::Path,
    staged: BTreeMap<u32, Vec<StoredPart>>,
) -> Result<(), AppError> {
    for old in pruned {
        let at = object_store::path::Path::from(old.prefix.as_str());
        if let Err(e) = ctx.checkpoints.delete_prefix(&at).await {
            tracing::warn!(
                job,
                checkpoint = old.id,
                "pruned checkpoint's objects stay: {e}"
            );
        }
    }
    for extra in staged.into_values().flatten() {
        ctx.checkpoints
            .delete(&part_path(prefix, extra.n, &extra.sha256))
            .await?;
    }
    Ok(())
}
