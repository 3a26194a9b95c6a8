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
mod commit;
mod prune;
pub mod store;

use crate::db;
use crate::db::checkpoint_parts as staging;
use crate::db::checkpoints::{self as rows, Checkpoint};
use crate::domain::AttemptStatus;
use crate::error::AppError;
use crate::service::Ctx;
use bytes::Bytes;
pub use caps::attempt_cap_bytes;
use caps::{uploader, Part, Reserved};
use chrono::NaiveDateTime;
pub use commit::commit;
use commons_proto::{CheckpointManifest, CheckpointPart, MAX_CHECKPOINT_PARTS};
use futures_util::stream::BoxStream;
pub use prune::{prune_abandoned, prune_finished};
use sha2::{Digest, Sha256};
use store::{part_path, MANIFEST};
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
    let part = checked_part(&limits, n, sha256, &data)?;
    ctx.checkpoints.check_room(data.len() as u64).await?;
    let sha = part.sha256.clone();
    let bytes = part.bytes as i64;
    let reserved = ctx
        .db
        .run(move |c| {
            let counted = Part {
                node,
                job,
                attempt,
                n,
                bytes,
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
    let path = store_part(ctx, &prefix, &part, data).await?;
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

/// Part `n` as sent, checked against the part limits and the checksum the agent claims.
fn checked_part(
    limits: &Limits,
    n: u32,
    sha256: Option<&str>,
    data: &[u8],
) -> Result<CheckpointPart, AppError> {
    let header = commons_proto::SHA256_HEADER;
    let claimed = sha256.ok_or_else(|| {
        AppError::invalid(
            header,
            format!("the {header} header (the part's SHA-256) is required"),
        )
    })?;
    let claimed = checksum(header, claimed)?;
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
    let actual = sha256_hex(data);
    if actual != claimed {
        return Err(AppError::invalid(
            header,
            format!(
                "part {n} has SHA-256 {actual}, but {header} says {claimed}: it was damaged \
                 on the way; send it again"
            ),
        ));
    }
    Ok(CheckpointPart {
        n,
        bytes: data.len() as u64,
        sha256: actual,
    })
}

/// Writes a part's object (unless the same contents are there already) and removes other
/// contents sent for the same part number before; returns its path.
async fn store_part(
    ctx: &Ctx,
    prefix: &object_store::path::Path,
    part: &CheckpointPart,
    data: Bytes,
) -> Result<object_store::path::Path, AppError> {
    let n = part.n;
    let before = ctx.checkpoints.parts(prefix).await?.remove(&n);
    let already = before
        .as_deref()
        .is_some_and(|v| v.len() == 1 && v[0].sha256 == part.sha256);
    let path = part_path(prefix, n, &part.sha256);
    if !already {
        ctx.checkpoints.put(&path, data).await?;
        for old in before.unwrap_or_default() {
            if old.sha256 != part.sha256 {
                ctx.checkpoints
                    .delete(&part_path(prefix, n, &old.sha256))
                    .await?;
            }
        }
    }
    Ok(path)
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
