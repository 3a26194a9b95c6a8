//! The two journeys of a checkpoint, with their retries: [`restore`] brings the job's
//! latest checkpoint into a new attempt's directory before its container starts;
//! [`upload`] carries an attempt's directory to the portal (after it stopped, or as a
//! periodic snapshot while it runs).
//!
//! [`restore`]:
//! 1. Download `latest` into `restore.tar.zst`, checking its size and SHA-256 on the way;
//!    a failure worth another try is retried ([`Policy::restore_tries`], with back-off).
//! 2. Unpack it into `checkpoint.restoring/` (every entry checked, see `archive`; one
//!    over the job's disk cap is refused before anything is written), then rename that
//!    to `checkpoint/`.
//! 3. Anything else (no checkpoint, a refusal, a refused archive, retries spent) means
//!    [`Restore::Fresh`] with the reason: the job starts from an empty directory.
//!
//! [`upload`]:
//! 1. Fingerprint the directory: empty, or what the store already has (`stored` in
//!    `checkpoint.json`), means nothing to do.
//! 2. Take the archive left by an earlier try when it was made from this same content
//!    and its checksum still holds (`upload.json`); else archive the directory anew,
//!    refused at once when its files add up to more than the job's disk cap.
//! 3. One round: list the parts the portal has (and its part size), send each missing
//!    or different part, then commit. A round that finds no parts after a commit was
//!    sent commits first: that commit's answer was lost, and the portal recognises it.
//!    The commit says how long the checkpoint took to write (`write_ms`: from the start
//!    of packing to the commit, retries included), when this journey packed the archive.
//! 4. Repeat rounds after failures that may heal, with back-off, until committed, a final
//!    refusal, or the [`Budget`] is spent; progress (a part or a commit accepted) resets
//!    the count. A commit records the fingerprint as `stored` and deletes the archive.
//!
//! Invariants: only one journey per attempt at a time (the executor's reconcile makes
//! sure); an agent that goes away (`alive` turns false) or a cancel leaves the archive
//! and `upload.json` for the next try, which sends only the parts the portal lacks.

use super::archive::{self, ArchiveError, Unpacked};
use super::client::{ApiError, CheckpointClient};
use super::walk::fingerprint;
use super::{
    host_dir, prepare_dir, remove_file, remove_tree, restoring_dir, CheckpointFile, UploadFile,
    ARCHIVE_FILE, DOWNLOAD_FILE, UPLOAD_FILE,
};
use crate::store::{read_json, write_json};
use commons_proto::{Attempt, CheckpointCommit, JobId, MAX_CHECKPOINT_PARTS};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whether the agent that started a journey still runs (false: stop, leave it to the next).
pub type Alive<'a> = &'a (dyn Fn() -> bool + Send + Sync);

/// How a restore ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    Restored {
        bytes: u64,
        entries: u64,
        /// The attempt that stored it.
        from_attempt: Option<Attempt>,
        /// The restored directory's fingerprint (the store has this content).
        fingerprint: Option<String>,
    },
    /// Start from an empty directory, for this reason (in words for the job's owner).
    Fresh(String),
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, std::io::Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)
}

/// Restores job `job`'s latest checkpoint into the attempt's checkpoint directory (see
/// the module's list), refusing one over `cap` bytes. `client` is `None` when this agent
/// has no checkpoint store.
pub async fn restore(
    client: Option<&CheckpointClient>,
    job: JobId,
    attempt_dir: &Path,
    cap: u64,
    alive: Alive<'_>,
) -> Restore {
    let Some(client) = client else {
        return Restore::Fresh("this agent has no checkpoint store configured".into());
    };
    let download = attempt_dir.join(DOWNLOAD_FILE);
    let tries = client.policy().restore_tries.max(1);
    let mut last = None;
    for n in 1..=tries {
        if !alive() {
            return Restore::Fresh("the agent stopped".into());
        }
        let got = client.latest(job, &download).await;
        match got {
            Ok(None) => {
                let _ = remove_file(&download);
                return Restore::Fresh("the portal has no checkpoint of this job".into());
            }
            Ok(Some(d)) => {
                let dir = attempt_dir.to_path_buf();
                let unpacked = blocking(move || unpack_into(&dir, cap)).await;
                let _ = remove_file(&download);
                return match unpacked {
                    Ok(Ok((u, fp))) => Restore::Restored {
                        bytes: d.bytes,
                        entries: u.entries,
                        from_attempt: d.attempt,
                        fingerprint: fp,
                    },
                    Ok(Err(e @ ArchiveError::OverCap(_))) => Restore::Fresh(e.to_string()),
                    Ok(Err(e)) => Restore::Fresh(format!("the checkpoint archive was {e}")),
                    Err(e) => Restore::Fresh(format!("unpacking failed: {e}")),
                };
            }
            Err(e) if e.is_final() => {
                let _ = remove_file(&download);
                return Restore::Fresh(e.to_string());
            }
            Err(e) => {
                tracing::warn!(job, "checkpoint download {n} of {tries} failed: {e}");
                last = Some(e);
                if n < tries {
                    tokio::time::sleep(client.policy().backoff(n)).await;
                }
            }
        }
    }
    let _ = remove_file(&download);
    let why = last.map_or_else(String::new, |e| e.to_string());
    Restore::Fresh(format!("{why} (tried {tries} times)"))
}

/// Unpacks the download into `checkpoint.restoring/`, then renames it to `checkpoint/`.
fn unpack_into(attempt_dir: &Path, cap: u64) -> Result<(Unpacked, Option<String>), ArchiveError> {
    let staging = restoring_dir(attempt_dir);
    remove_tree(&staging)?;
    std::fs::create_dir_all(&staging)?;
    let unpacked = match archive::unpack(&attempt_dir.join(DOWNLOAD_FILE), &staging, cap) {
        Ok(u) => u,
        Err(e) => {
            let _ = remove_tree(&staging);
            return Err(e);
        }
    };
    let target = host_dir(attempt_dir);
    remove_tree(&target)?;
    std::fs::rename(&staging, &target)?;
    prepare_dir(&target)?;
    Ok((unpacked, fingerprint(&target)?))
}

/// How long an upload keeps trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Until this long passed with failures and no progress (the upload after a stop).
    NoProgressFor(Duration),
    /// At most this many failed rounds in a row (a periodic snapshot).
    Rounds(u32),
}

/// How an upload ended.
#[derive(Debug)]
pub enum Outcome {
    /// Committed by the portal.
    Stored {
        bytes: u64,
        /// Entries left out of the archive (see `archive::pack`).
        skipped: Vec<String>,
    },
    /// Nothing to send: the directory is empty, or the store already has its content.
    Nothing(&'static str),
    /// The portal refused it for good (over the lab's cap, the job ended, ...).
    Refused(ApiError),
    /// The archive could not be made.
    Unarchivable(String),
    /// The budget is spent; the last error.
    Failed(ApiError),
    /// Cancelled, or the agent went away: the next try resumes it.
    Abandoned,
}

/// Why one round did not commit.
enum RoundError {
    Api(ApiError),
    Cancelled,
}

impl From<ApiError> for RoundError {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

/// Uploads the attempt's checkpoint directory as attempt `(job, attempt)`'s next
/// checkpoint (see the module's list); one whose files add up to more than `cap` bytes
/// is [`Outcome::Unarchivable`].
pub async fn upload(
    client: &CheckpointClient,
    key: (JobId, Attempt),
    attempt_dir: &Path,
    cap: u64,
    budget: Budget,
    cancel: Arc<AtomicBool>,
    alive: Alive<'_>,
) -> Outcome {
    let out = upload_once(client, key, attempt_dir, cap, budget, cancel, alive).await;
    let result = match &out {
        Outcome::Stored { .. } => "stored",
        Outcome::Nothing(_) => "nothing",
        Outcome::Refused(_) => "refused",
        Outcome::Unarchivable(_) | Outcome::Failed(_) => "failed",
        Outcome::Abandoned => "abandoned",
    };
    crate::metrics::METRICS.checkpoint_upload(result);
    out
}

async fn upload_once(
    client: &CheckpointClient,
    (job, attempt): (JobId, Attempt),
    attempt_dir: &Path,
    cap: u64,
    budget: Budget,
    cancel: Arc<AtomicBool>,
    alive: Alive<'_>,
) -> Outcome {
    let dir = attempt_dir.to_path_buf();
    let c = cancel.clone();
    let prepared = blocking(move || prepare_archive(&dir, cap, &c)).await;
    let (up, skipped) = match prepared {
        Ok(Ok(Prepared::Archive(up, skipped))) => (up, skipped),
        Ok(Ok(Prepared::Empty)) => return Outcome::Nothing(EMPTY),
        Ok(Ok(Prepared::Unchanged)) => return Outcome::Nothing(UNCHANGED),
        Ok(Err(ArchiveError::Cancelled)) => return Outcome::Abandoned,
        Ok(Err(e)) => return Outcome::Unarchivable(e.to_string()),
        Err(e) => return Outcome::Unarchivable(e.to_string()),
    };
    let mut up = up;
    let policy = client.policy();
    let mut failures = 0u32;
    let mut failing_since: Option<tokio::time::Instant> = None;
    loop {
        if cancel.load(Ordering::Relaxed) || !alive() {
            return Outcome::Abandoned;
        }
        let mut progress = false;
        let done = round(
            client,
            (job, attempt),
            attempt_dir,
            &mut up,
            &mut progress,
            &cancel,
            alive,
        )
        .await;
        let e = match done {
            Ok(()) => {
                let fp = up.fingerprint.clone();
                if let Err(e) = CheckpointFile::update(attempt_dir, |f| f.stored = Some(fp)) {
                    tracing::error!(job, attempt, "{e}");
                }
                discard_archive(attempt_dir);
                return Outcome::Stored {
                    bytes: up.bytes,
                    skipped,
                };
            }
            Err(RoundError::Cancelled) => return Outcome::Abandoned,
            Err(RoundError::Api(e)) if e.is_final() => {
                discard_archive(attempt_dir);
                return Outcome::Refused(e);
            }
            Err(RoundError::Api(e)) => e,
        };
        if progress {
            failures = 0;
            failing_since = None;
        }
        failures += 1;
        let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
        let spent = match budget {
            Budget::Rounds(n) => failures >= n.max(1),
            Budget::NoProgressFor(d) => since.elapsed() >= d,
        };
        tracing::warn!(job, attempt, failures, "checkpoint upload failed: {e}");
        if spent {
            return Outcome::Failed(e);
        }
        tokio::time::sleep(policy.backoff(failures)).await;
    }
}

/// Why there is nothing to upload, in words for the job's owner.
pub const EMPTY: &str = "/checkpoint is empty";
pub const UNCHANGED: &str = "/checkpoint has not changed since the checkpoint the portal has";

enum Prepared {
    Empty,
    Unchanged,
    /// The archive to send, with its `upload.json`, and the entries it left out.
    Archive(UploadFile, Vec<String>),
}

fn prepare_archive(
    attempt_dir: &Path,
    cap: u64,
    cancel: &AtomicBool,
) -> Result<Prepared, ArchiveError> {
    let src = host_dir(attempt_dir);
    let Some(fp) = fingerprint(&src)? else {
        return Ok(Prepared::Empty);
    };
    let state = CheckpointFile::read(attempt_dir).ok().flatten();
    if state.and_then(|s| s.stored).as_deref() == Some(fp.as_str()) {
        return Ok(Prepared::Unchanged);
    }
    let archive = attempt_dir.join(ARCHIVE_FILE);
    let upload = attempt_dir.join(UPLOAD_FILE);
    if let Ok(Some(up)) = read_json::<UploadFile>(&upload) {
        if up.fingerprint == fp && file_sha256(&archive).ok() == Some((up.bytes, up.sha256.clone()))
        {
            return Ok(Prepared::Archive(up, Vec::new()));
        }
    }
    // No upload.json may name an archive being rewritten.
    remove_file(&upload)?;
    let packing_started = Some(std::time::Instant::now());
    let packed = archive::pack(&src, &archive, cap, cancel)?;
    let up = UploadFile {
        fingerprint: fp,
        bytes: packed.bytes,
        sha256: packed.sha256,
        commit_sent: false,
        packing_started,
    };
    write_json(&upload, &up).map_err(|e| ArchiveError::Io(std::io::Error::other(e)))?;
    Ok(Prepared::Archive(up, packed.skipped))
}

fn file_sha256(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
    let mut sha = Sha256::new();
    let bytes = std::io::copy(&mut f, &mut sha)?;
    Ok((bytes, hex::encode(sha.finalize())))
}

fn discard_archive(attempt_dir: &Path) {
    for name in [UPLOAD_FILE, ARCHIVE_FILE] {
        if let Err(e) = remove_file(&attempt_dir.join(name)) {
            tracing::warn!("cannot remove {name}: {e}");
        }
    }
}

/// Part `n` of the archive (`part_bytes` each, the last one shorter) and its SHA-256.
async fn read_part(archive: PathBuf, offset: u64, len: u64) -> Result<(Vec<u8>, String), ApiError> {
    let read = blocking(move || -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::File::open(archive)?;
        f.seek(SeekFrom::Start(offset))?;
        let mut data = vec![0; usize::try_from(len).map_err(std::io::Error::other)?];
        f.read_exact(&mut data)?;
        Ok(data)
    })
    .await??;
    let sha = hex::encode(Sha256::digest(&read));
    Ok((read, sha))
}

/// One round of step 3.
async fn round(
    client: &CheckpointClient,
    (job, attempt): (JobId, Attempt),
    attempt_dir: &Path,
    up: &mut UploadFile,
    progress: &mut bool,
    cancel: &AtomicBool,
    alive: Alive<'_>,
) -> Result<(), RoundError> {
    // Measured when each commit is sent: packing, then every round's parts.
    let commit = |up: &UploadFile, parts| CheckpointCommit {
        parts,
        bytes: up.bytes,
        sha256: up.sha256.clone(),
        write_ms: up
            .packing_started
            .map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)),
    };
    let save = |up: &UploadFile| {
        write_json(&attempt_dir.join(UPLOAD_FILE), up)
            .map_err(|e| ApiError::Local(std::io::Error::other(e)))
    };
    let (present, part_bytes) = client.parts(job, attempt).await?;
    let count = up.bytes.div_ceil(part_bytes).max(1);
    // Final (a local error): the archive will not shrink.
    let count = u32::try_from(count)
        .ok()
        .filter(|c| *c <= MAX_CHECKPOINT_PARTS)
        .ok_or_else(|| {
            ApiError::Local(std::io::Error::other(format!(
                "{} bytes need more than {MAX_CHECKPOINT_PARTS} parts of {part_bytes} bytes",
                up.bytes
            )))
        })?;
    if present.is_empty() && up.commit_sent {
        match client.commit(job, attempt, &commit(up, count)).await {
            Ok(_) => return Ok(()),
            // Not that commit's archive after all: send the parts.
            Err(e) if e.status() == Some(422) => {
                up.commit_sent = false;
                save(up)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let archive = attempt_dir.join(ARCHIVE_FILE);
    for n in 0..count {
        if cancel.load(Ordering::Relaxed) || !alive() {
            return Err(RoundError::Cancelled);
        }
        let offset = u64::from(n) * part_bytes;
        let len = part_bytes.min(up.bytes - offset);
        let (data, sha) = read_part(archive.clone(), offset, len).await?;
        if present
            .iter()
            .any(|p| p.n == n && p.bytes == len && p.sha256 == sha)
        {
            continue;
        }
        client.put_part(job, attempt, n, data, &sha).await?;
        *progress = true;
    }
    up.commit_sent = true;
    save(up)?;
    client.commit(job, attempt, &commit(up, count)).await?;
    Ok(())
}
