//! A job's `/outputs`: a directory in the attempt's volume, beside `/checkpoint` and under
//! the same disk cap, bind-mounted read-write. When the attempt ends, whatever the way
//! (exit, failure, cancel, time limit, preemption), its files go to the portal
//! (`commons_proto::OUTPUTS_PATH`), which keeps them in the job owner's files under
//! `jobs/{job}/`; this happens before the attempt is reported (`reconcile` holds the
//! report), because the portal takes an attempt's outputs only until it hears how it
//! ended. A resumed attempt gets back, before its container starts, what earlier attempts
//! kept, so a preemption loses nothing written there.
//!
//! Invariants:
//! - Only regular files are sent; links and other special files are left and named in the
//!   job's log (a link could point anywhere on this server: it is never followed).
//! - A file streams from disk as it is sent, never held whole, hashed on the way: the
//!   SHA-256 the portal stored must match, or it is sent again.
//! - What is restored lands only under the attempt's directory (paths with an empty,
//!   `.` or `..` segment are refused) and belongs to the job's user.

use crate::checkpoint::client::{ok, transport};
use crate::checkpoint::{self, ApiError, CheckpointClient};
use crate::reconcile::Key;
use commons_proto::{output_file_path, outputs_path, OutputFile};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where jobs see it.
pub const CONTAINER_DIR: &str = "/outputs";
/// The variable that tells jobs where it is.
pub const ENV_DIR: &str = "COMMONS_OUTPUTS_DIR";

/// The attempt's outputs directory on this server: beside its checkpoint directory.
pub fn host_dir(attempt_dir: &Path) -> PathBuf {
    checkpoint::host_dir(attempt_dir).with_file_name("outputs")
}

/// What a walk of the directory found: regular files (path on disk, path under
/// `/outputs`, size) and what it left out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walked {
    pub files: Vec<(PathBuf, String, u64)>,
    pub skipped: Vec<String>,
}

/// The regular files under `dir` (all depths, links not followed), by path; a missing
/// directory holds none.
pub fn walk(dir: &Path) -> std::io::Result<Walked> {
    fn go(at: &Path, rel: &str, out: &mut Walked) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(at)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            let kind = std::fs::symlink_metadata(&path)?;
            let shown = format!("{rel}{name}");
            if kind.is_dir() {
                go(&path, &format!("{shown}/"), out)?;
            } else if kind.is_file() {
                out.files.push((path, shown, kind.len()));
            } else {
                out.skipped.push(shown);
            }
        }
        Ok(())
    }
    let mut out = Walked::default();
    match go(dir, "", &mut out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => Ok(out),
        other => other.map(|()| out),
    }
}

/// What an upload of the outputs did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub files: usize,
    pub bytes: u64,
    pub skipped: Vec<String>,
}

/// How the upload of the outputs ended.
#[derive(Debug)]
pub enum Kept {
    /// Every regular file is in the portal.
    All(Sent),
    /// The portal refused one (its owner's quota, ...): the rest were not sent.
    Refused {
        sent: Sent,
        file: String,
        error: ApiError,
    },
    /// Failures without progress for the policy's `give_up_after`.
    Failed {
        sent: Sent,
        file: String,
        error: ApiError,
    },
}

/// Sends every file of `dir` as attempt `key`'s outputs, one after the other, trying each
/// again after transient failures (the policy's backoff) until it gives up.
pub async fn upload(client: &CheckpointClient, key: Key, dir: &Path) -> Kept {
    let d = dir.to_path_buf();
    let walked = match tokio::task::spawn_blocking(move || walk(&d)).await {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            let error = ApiError::Local(e);
            return Kept::Failed {
                sent: Sent::default(),
                file: "/outputs".into(),
                error,
            };
        }
        Err(e) => {
            let error = ApiError::Local(std::io::Error::other(e));
            return Kept::Failed {
                sent: Sent::default(),
                file: "/outputs".into(),
                error,
            };
        }
    };
    let mut sent = Sent {
        skipped: walked.skipped,
        ..Default::default()
    };
    for (local, rel, size) in walked.files {
        let mut failures = 0;
        let mut since = Instant::now();
        loop {
            match put_file(client, key, &local, &rel).await {
                Ok(()) => break,
                Err(error) if error.is_final() => {
                    return Kept::Refused {
                        sent,
                        file: rel,
                        error,
                    }
                }
                Err(error) if since.elapsed() >= client.policy().give_up_after => {
                    return Kept::Failed {
                        sent,
                        file: rel,
                        error,
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(
                        job = key.0,
                        attempt = key.1,
                        file = rel,
                        "output not sent yet: {e}"
                    );
                    tokio::time::sleep(client.policy().backoff(failures)).await;
                    if failures == 1 {
                        since = Instant::now();
                    }
                }
            }
        }
        sent.files += 1;
        sent.bytes += size;
    }
    Kept::All(sent)
}

/// Streams one file, hashing it on the way; the portal's SHA-256 must be the same.
async fn put_file(
    client: &CheckpointClient,
    (job, attempt): Key,
    local: &Path,
    rel: &str,
) -> Result<(), ApiError> {
    let file = tokio::fs::File::open(local).await?;
    let hash = Arc::new(Mutex::new(Sha256::new()));
    let h = hash.clone();
    let chunks = futures_util::stream::unfold(file, |mut f| async move {
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
    .map(move |c| {
        if let (Ok(bytes), Ok(mut sha)) = (&c, h.lock()) {
            sha.update(bytes);
        }
        c
    });
    let path = output_file_path(job, attempt, &commons_api::files::percent_encode_path(rel));
    let resp = client
        .request(reqwest::Method::PUT, &path)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .map_err(transport)?;
    let stored: serde_json::Value = ok(resp).await?.json().await.map_err(transport)?;
    let sent = hash
        .lock()
        .map(|h| hex::encode(h.clone().finalize()))
        .unwrap_or_default();
    if stored["sha256"].as_str() != Some(sent.as_str()) {
        return Err(ApiError::Damaged(format!(
            "{rel}: the portal stored other bytes than were sent"
        )));
    }
    Ok(())
}

/// Whether a path from the portal stays under the directory it is joined to.
pub(crate) fn stays_inside(path: &str) -> bool {
    !path.is_empty() && path.split('/').all(|s| !matches!(s, "" | "." | ".."))
}

/// Puts back into `dir` what earlier attempts of the job kept. A portal without outputs
/// (404) has none.
pub async fn restore(
    client: &CheckpointClient,
    (job, attempt): Key,
    dir: &Path,
) -> Result<Sent, ApiError> {
    let resp = client
        .request(reqwest::Method::GET, &outputs_path(job, attempt))
        .send()
        .await
        .map_err(transport)?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(Sent::default());
    }
    let kept: Vec<OutputFile> = ok(resp).await?.json().await.map_err(transport)?;
    let mut got = Sent::default();
    for f in kept {
        if !stays_inside(&f.path) {
            got.skipped.push(f.path);
            continue;
        }
        let to = f.path.split('/').fold(dir.to_path_buf(), |p, s| p.join(s));
        fetch(client, (job, attempt), &f, &to).await?;
        own(dir, &to);
        got.files += 1;
        got.bytes += f.size;
    }
    Ok(got)
}

/// Downloads one kept file to `to`, checking its SHA-256.
async fn fetch(
    client: &CheckpointClient,
    (job, attempt): Key,
    f: &OutputFile,
    to: &Path,
) -> Result<(), ApiError> {
    if let Some(parent) = to.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    let path = output_file_path(
        job,
        attempt,
        &commons_api::files::percent_encode_path(&f.path),
    );
    let resp = client
        .request(reqwest::Method::GET, &path)
        .send()
        .await
        .map_err(transport)?;
    let mut resp = ok(resp).await?;
    let mut out = tokio::fs::File::create(to).await?;
    let mut sha = Sha256::new();
    while let Some(chunk) = resp.chunk().await.map_err(transport)? {
        sha.update(&chunk);
        out.write_all(&chunk).await?;
    }
    out.flush().await?;
    let got = hex::encode(sha.finalize());
    if got != f.sha256 {
        return Err(ApiError::Damaged(format!(
            "{}: SHA-256 {got}, the portal said {}",
            f.path, f.sha256
        )));
    }
    Ok(())
}

/// Gives `to` and the folders between `dir` and it to the job's user (when the agent may).
fn own(dir: &Path, to: &Path) {
    let mut at = Some(to);
    while let Some(p) = at.filter(|p| p.starts_with(dir) && *p != dir) {
        let _ = std::os::unix::fs::chown(p, Some(checkpoint::JOB_UID), Some(checkpoint::JOB_GID));
        at = p.parent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_finds_regular_files_and_names_the_rest() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/x.bin"), "xx").unwrap();
        std::fs::write(d.path().join("top.txt"), "t").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.path().join("link")).unwrap();
        let w = walk(d.path()).unwrap();
        let rels: Vec<_> = w.files.iter().map(|f| (f.1.as_str(), f.2)).collect();
        assert_eq!(rels, [("a/b/x.bin", 2), ("top.txt", 1)]);
        assert_eq!(w.skipped, ["link"]);
        assert_eq!(walk(&d.path().join("none")).unwrap(), Walked::default());
    }

    #[test]
    fn restored_paths_stay_inside() {
        assert!(stays_inside("a/b.txt"));
        for bad in ["", "../x", "a/../../x", "/etc/x", "a//b", "./a"] {
            assert!(!stays_inside(bad), "{bad}");
        }
        assert_eq!(
            commons_api::files::percent_encode_path("a b/é"),
            "a%20b/%C3%A9"
        );
        assert_eq!(
            host_dir(Path::new("/s/attempts/1-1")),
            Path::new("/s/attempts/1-1/disk/outputs")
        );
    }
}
