//! Checkpoints: what an agent may upload and download, and what the portal keeps.
//!
//! An agent uploads a job's `/checkpoint` as one archive (tar + zstd) in parts, each with
//! its SHA-256, then commits them with the whole archive's size and SHA-256. Uploads are
//! resumable (the parts already there can be listed) and idempotent (a part sent twice is
//! stored once; a commit sent twice is recorded once). The next attempt, on any server,
//! downloads the latest checkpoint of its job.
//!
//! Invariants:
//! - Only the node an attempt is placed on now (starting, running or stopping there)
//!   lists, uploads or commits for it, and only while the job has not ended ([`caps`]);
//!   only a node with a starting or running attempt of a job downloads the job's
//!   checkpoint. Anything else is "not found".
//! - Each part counts as it arrives against the attempt's cap and the lab's cap
//!   (committed checkpoints plus staged parts, [`caps`]); a part over either is refused
//!   (409 `checkpoint_attempt_cap`, `checkpoint_cap`), nothing of it is stored, and the
//!   upload it belonged to is discarded. A local store also refuses (507) a part that
//!   would leave its filesystem under the free-space floor.
//! - A row in `checkpoints` exists only for an archive whose every part is in the store
//!   and whose concatenation was read back and matched the committed size and checksum;
//!   the row is written after the manifest, so a row always names a whole archive.
//! - A job keeps at most `keep_per_job` checkpoints; a later attempt's supersede an
//!   earlier attempt's (rank by attempt, then commit number), and a commit that would rank
//!   below the kept ones is refused as superseded.
//! - A lab's checkpoints stay within its cap (its own, or the campus default), counted
//!   again at commit after its pruning (the cap may have been lowered meanwhile); a commit
//!   over it is refused (409 `checkpoint_cap`).
//! - Rows go before their objects: a failure in between leaves unreferenced objects,
//!   which [`prune_finished`] removes once the job has ended. Uploads of attempts no
//!   longer placed go at the next [`prune_abandoned`].

mod caps;
mod prune;
pub mod store;

use crate::db::checkpoint_parts as staging;
use crate::db::checkpoints::{self as rows, Checkpoint, NewCheckpoint};
use crate::db::{self, DbConn};
use crate::domain::AttemptStatus;
use crate::error::AppError;
use crate::service::Ctx;
use bytes::Bytes;
pub use caps::attempt_cap_bytes;
use caps::{uploader, Part, Reserved};
use chrono::NaiveDateTime;
use commons_proto::{
    CheckpointCommit, CheckpointCommitted, CheckpointManifest, CheckpointPart, MAX_CHECKPOINT_PARTS,
};
use futures_util::stream::BoxStream;
use futures_util::TryStreamExt;
pub use prune::{prune_abandoned, prune_finished};
use sha2::{Digest, Sha256};
use store::{part_path, StoredPart, MANIFEST};
pub use store::{Limits, Store};

/// How long an ended job's checkpoints are kept.
pub const KEEP_ENDED_S: i64 = 24 * 3600;

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A checksum as given: 64 hex digits, any case.
fn checksum(field: &str, given: &str) -> Result<String, AppError> {
    let s = given.trim().to_ascii_lowercase();
    if store::is_sha256(&s) {
        Ok(s)
    } else {
        Err(AppError::invalid(
            field,
            format!("{field} must be a SHA-256 in hex (64 digits), got {given:?}"),
        ))
    }
}

/// Decimal GB, as the cap messages show them: "51.2", "50", "0.0012", "0.00024" (two
/// significant digits at least, so two figures in one message do not look alike).
pub fn gb(bytes: f64) -> String {
    let v = bytes / 1e9;
    let s = if v >= 1.0 {
        format!("{v:.1}")
    } else if v > 0.0 {
        let decimals = (1 - v.log10().floor() as i32).clamp(4, 12) as usize;
        format!("{v:.decimals$}")
    } else {
        "0".into()
    };
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

fn rfc3339(t: NaiveDateTime) -> String {
    t.and_utc()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Stores part `n` of the attempt's next checkpoint. `sha256` is the checksum the agent
/// claims (the `x-commons-sha256` header); a different one is refused, naming it. The part
/// counts against the caps before it is stored ([`caps`]).
pub async fn put_part(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    n: u32,
    sha256: Option<&str>,
    data: Bytes,
) -> Result<CheckpointPart, AppError> {
    // Another node's (or a past) attempt is "not found" before anything else is said.
    ctx.db.run(move |c| uploader(c, node, job, attempt)).await?;
    let limits = ctx.checkpoints.limits();
    let claimed = checksum(
        commons_proto::SHA256_HEADER,
        sha256.ok_or_else(|| {
            AppError::invalid(
                commons_proto::SHA256_HEADER,
                format!(
                    "the {} header (the part's SHA-256) is required",
                    commons_proto::SHA256_HEADER
                ),
            )
        })?,
    )?;
    if n >= MAX_CHECKPOINT_PARTS {
        return Err(AppError::invalid(
            "n",
            format!("part numbers run from 0 to {}", MAX_CHECKPOINT_PARTS - 1),
        ));
    }
    if data.len() as u64 > limits.part_bytes {
        return Err(AppError::TooLarge(format!(
            "a part holds at most {} bytes",
            limits.part_bytes
        )));
    }
    let actual = sha256_hex(&data);
    if actual != claimed {
        return Err(AppError::invalid(
            commons_proto::SHA256_HEADER,
            format!(
                "part {n} has SHA-256 {actual}, but {} says {claimed}: it was damaged on the way; send it again",
                commons_proto::SHA256_HEADER
            ),
        ));
    }
    ctx.checkpoints.check_room(data.len() as u64).await?;
    let part = CheckpointPart {
        n,
        bytes: data.len() as u64,
        sha256: actual,
    };
    let sha = part.sha256.clone();
    let reserved = ctx
        .db
        .run(move |c| {
            let counted = Part {
                node,
                job,
                attempt,
                n,
                bytes: part.bytes as i64,
                sha256: &sha,
            };
            caps::reserve(c, &limits, &counted)
        })
        .await?;
    let up = match reserved {
        Reserved::Staged(up) => up,
        Reserved::OverCap(refusal, key) => {
            if let Err(e) = prune::drop_upload(ctx, key, prune::When::OverCap).await {
                tracing::warn!(job, attempt, "a refused upload's parts stay for now: {e}");
            }
            return Err(refusal);
        }
    };
    let prefix = up.prefix();
    let before = ctx.checkpoints.parts(&prefix).await?.remove(&n);
    let already = before
        .as_deref()
        .is_some_and(|v| v.len() == 1 && v[0].sha256 == part.sha256);
    let path = part_path(&prefix, n, &part.sha256);
    if !already {
        ctx.checkpoints.put(&path, data).await?;
        // Other contents sent for the same part before: this one replaces them.
        for old in before.unwrap_or_default() {
            if old.sha256 != part.sha256 {
                ctx.checkpoints
                    .delete(&part_path(&prefix, n, &old.sha256))
                    .await?;
            }
        }
    }
    // Its row may have gone while it was stored (the attempt ended and its upload was
    // pruned, or another part went over a cap): then it goes too.
    let (key, sha) = (up.key(), part.sha256.clone());
    if !ctx
        .db
        .run(move |c| staging::is_staged(c, key, n, &sha))
        .await?
    {
        ctx.checkpoints.delete(&path).await?;
        return Err(AppError::conflict(
            "checkpoint_upload_discarded",
            format!(
                "the upload of job {job} attempt {attempt} was discarded while part {n} was \
                 stored"
            ),
        ));
    }
    Ok(part)
}

/// The parts of the attempt's next checkpoint uploaded so far, by number. A part number
/// with two objects (a replacement cut short) is left out: upload it again.
pub async fn list_parts(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
) -> Result<Vec<CheckpointPart>, AppError> {
    let up = ctx.db.run(move |c| uploader(c, node, job, attempt)).await?;
    Ok(ctx
        .checkpoints
        .parts(&up.prefix())
        .await?
        .into_values()
        .filter(|v| v.len() == 1)
        .flatten()
        .map(|p| CheckpointPart {
            n: p.n,
            bytes: p.bytes,
            sha256: p.sha256,
        })
        .collect())
}

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
        // A commit sent again after its answer was lost: the same archive, recorded.
        let prev = ctx
            .db
            .run(move |c| rows::for_job(c, job))
            .await?
            .into_iter()
            .find(|k| k.attempt == attempt && k.seq == up.seq - 1);
        if let Some(k) = prev.filter(|k| {
            k.sha256 == want && k.bytes as u64 == req.bytes && k.parts as u32 == req.parts
        }) {
            return Ok(CheckpointCommitted {
                id: k.id,
                at: rfc3339(k.created_at),
            });
        }
    }
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
    verify(ctx, &prefix, &parts, &want).await?;
    let at = db::now();
    let manifest = CheckpointManifest {
        job,
        attempt,
        seq: up.seq,
        node,
        bytes,
        sha256: want.clone(),
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
        .put(&prefix.clone().join(MANIFEST), json.into())
        .await?;
    let limits = ctx.checkpoints.limits();
    let key = prefix.to_string();
    let (lab, seq, parts_n) = (up.lab, up.seq, req.parts as i32);
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
            };
            record(c, limits, &new)
        })
        .await?;
    for old in &done.pruned {
        if let Err(e) = ctx
            .checkpoints
            .delete_prefix(&object_store::path::Path::from(old.prefix.as_str()))
            .await
        {
            tracing::warn!(
                job,
                checkpoint = old.id,
                "pruned checkpoint's objects stay: {e}"
            );
        }
    }
    // Parts past the committed ones are not part of it.
    for extra in staged.into_values().flatten() {
        ctx.checkpoints
            .delete(&part_path(&prefix, extra.n, &extra.sha256))
            .await?;
    }
    tracing::info!(
        job,
        attempt,
        seq,
        bytes,
        pruned = done.pruned.len(),
        "checkpoint stored"
    );
    Ok(CheckpointCommitted {
        id: done.row.id,
        at: rfc3339(done.row.created_at),
    })
}

/// A checkpoint being downloaded: its row and its bytes, in order.
pub struct Download {
    pub checkpoint: Checkpoint,
    pub body: BoxStream<'static, Result<Bytes, object_store::Error>>,
}

/// The latest checkpoint of `job`, for the node running its current attempt; `None` when
/// the job has none.
pub async fn latest(ctx: &Ctx, node: i64, job: i64) -> Result<Option<Download>, AppError> {
    let found = ctx
        .db
        .run(move |c| {
            let running = [AttemptStatus::Starting, AttemptStatus::Running];
            let held = db::attempts::on_node(c, node, &running)?
                .iter()
                .any(|a| a.job_id == job);
            if !held {
                return Err(AppError::NotFound("attempt"));
            }
            Ok(rows::latest(c, job)?)
        })
        .await?;
    let Some(checkpoint) = found else {
        return Ok(None);
    };
    let prefix = object_store::path::Path::from(checkpoint.prefix.as_str());
    let damaged = || {
        tracing::error!(
            job,
            checkpoint = checkpoint.id,
            "checkpoint manifest missing or damaged"
        );
        AppError::Unavailable("the job's checkpoint cannot be read from the store".into())
    };
    let raw = ctx
        .checkpoints
        .read(&prefix.clone().join(MANIFEST))
        .await?
        .ok_or_else(damaged)?;
    let manifest: CheckpointManifest = serde_json::from_slice(&raw).map_err(|_| damaged())?;
    if manifest.sha256 != checkpoint.sha256 || manifest.parts.len() != checkpoint.parts as usize {
        return Err(damaged());
    }
    let paths = manifest
        .parts
        .iter()
        .map(|p| part_path(&prefix, p.n, &p.sha256))
        .collect();
    let body = ctx.checkpoints.concat(paths).await?;
    Ok(Some(Download { checkpoint, body }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gigabytes_read_well() {
        assert_eq!(gb(51.2e9), "51.2");
        assert_eq!(gb(50e9), "50");
        assert_eq!(gb(1_200_000.0), "0.0012");
        assert_eq!(gb(240_000.0), "0.00024");
        assert_eq!(gb(200_000.0), "0.0002");
        assert_eq!(gb(120.0), "0.00000012");
        assert_eq!(gb(0.0), "0");
    }

    #[test]
    fn checksums_are_hex_of_64_digits() {
        let s = sha256_hex(b"");
        assert_eq!(checksum("sha256", &s.to_uppercase()).unwrap(), s);
        let e = checksum("sha256", "abc").unwrap_err();
        assert_eq!(e.field(), Some("sha256"));
    }
}
