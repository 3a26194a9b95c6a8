//! A job's `/inputs`: the files and folders its owner named (`JobSpec::inputs`), staged
//! before its container starts into a directory of the attempt's volume (beside
//! `/checkpoint` and `/outputs`, under the same disk cap) and bind-mounted read-only.
//! The portal lists the files (`commons_proto::INPUTS_PATH`), each with a short-lived
//! URL of its one object that the agent reads without its credential ([`crate::signed`]);
//! a file listed without one (an older portal) streams through the portal. The agent
//! holds no credential of the store either way.
//!
//! Invariants:
//! - A file streams to disk as it arrives, never held whole, hashed on the way: the
//!   SHA-256 the portal listed must match, else it is fetched again.
//! - Bytes count against the job's disk cap as they arrive: the listed total must fit,
//!   and a file that grows past what was listed is cut off.
//! - What is staged lands only under the inputs directory (a path with an empty, `.` or
//!   `..` segment is refused), readable by the job's user, written by no one.
//! - A failure names the file and why; transient ones (the portal out of reach, a 5xx, a
//!   damaged copy, any failure of a signed URL: the files are listed again for fresh
//!   ones) are tried again a few times first.

use crate::checkpoint::client::{ok, transport};
use crate::checkpoint::{self, ApiError, CheckpointClient};
use crate::outputs::stays_inside;
use crate::reconcile::Key;
use crate::signed::{Listed, Source};
use commons_proto::{input_file_path, inputs_path, staging_path, InputFile, Staging};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Where jobs see it.
pub const CONTAINER_DIR: &str = "/inputs";
/// The variable that tells jobs where it is.
pub const ENV_DIR: &str = "COMMONS_INPUTS_DIR";
/// How many times a file is tried before staging fails.
pub const TRIES: u32 = 4;
/// The least time between two progress reports.
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The attempt's inputs directory on this server: beside its checkpoint directory.
pub fn host_dir(attempt_dir: &Path) -> PathBuf {
    checkpoint::host_dir(attempt_dir).with_file_name("inputs")
}

/// What staging did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Staged {
    pub files: u64,
    pub bytes: u64,
}

/// Why staging stopped short: the file (or `/inputs`) and why, for the job's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub file: String,
    pub why: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.file == CONTAINER_DIR {
            return write!(f, "{}", self.why);
        }
        write!(f, "input {}: {}", self.file, self.why)
    }
}

fn fail(file: &str, why: impl std::fmt::Display) -> Failure {
    Failure {
        file: file.to_string(),
        why: why.to_string(),
    }
}

/// Whether trying again cannot help: what the portal refused (a 4xx, an input gone or
/// no longer readable) but for a timeout or a rate limit, and local failures.
fn gives_up(e: &ApiError) -> bool {
    match e {
        ApiError::Status { status, .. } => !matches!(status, 408 | 429 | 500..),
        other => other.is_final(),
    }
}

/// Progress as it goes to the portal: at most once a [`REPORT_EVERY`], and always at
/// the start and the end. A report that does not arrive is not tried again.
struct Reporter<'a> {
    client: &'a CheckpointClient,
    key: Key,
    total: u64,
    files: u64,
    last: Option<Instant>,
}

impl Reporter<'_> {
    async fn send(&mut self, done: u64, finished: bool, error: Option<String>) {
        let due = self.last.is_none_or(|t| t.elapsed() >= REPORT_EVERY);
        if !due && !finished {
            return;
        }
        self.last = Some(Instant::now());
        let body = Staging {
            done_bytes: done,
            total_bytes: self.total,
            files: self.files,
            finished,
            error,
        };
        let sent = self
            .client
            .request(reqwest::Method::POST, &staging_path(self.key.0, self.key.1))
            .json(&body)
            .send()
            .await;
        if let Err(e) = sent {
            tracing::debug!(job = self.key.0, "staging progress not sent: {e}");
        }
    }
}

/// Stages attempt `key`'s inputs into `dir`, at most `cap` bytes in all. `keep_going`
/// is asked between chunks: false (the attempt was stopped, the agent is going) ends
/// staging as a failure.
pub async fn stage(
    client: &CheckpointClient,
    key: Key,
    dir: &Path,
    cap: u64,
    keep_going: &(dyn Fn() -> bool + Sync),
) -> Result<Staged, Failure> {
    let files = Listed::new(list(client, key).await?);
    let total: u64 = files.files.iter().map(|f| f.size).sum();
    let mut report = Reporter {
        client,
        key,
        total,
        files: files.files.len() as u64,
        last: None,
    };
    report.send(0, false, None).await;
    let staged = stage_all(client, key, dir, cap, files, &mut report, keep_going).await;
    let error = staged.as_ref().err().map(ToString::to_string);
    let done = staged.as_ref().map_or(0, |s| s.bytes);
    report.send(done, true, error).await;
    staged
}

/// Lists the files to stage, trying again after transient failures.
async fn list(client: &CheckpointClient, (job, attempt): Key) -> Result<Vec<InputFile>, Failure> {
    let mut n = 0;
    loop {
        let got = async {
            let resp = client
                .request(reqwest::Method::GET, &inputs_path(job, attempt))
                .send()
                .await
                .map_err(transport)?;
            ok(resp)
                .await?
                .json::<Vec<InputFile>>()
                .await
                .map_err(transport)
        }
        .await;
        match got {
            Ok(files) => return Ok(files),
            Err(e) if gives_up(&e) || n + 1 >= TRIES => {
                return Err(fail(CONTAINER_DIR, format!("cannot list the inputs ({e})")))
            }
            Err(e) => {
                n += 1;
                tracing::warn!(job, attempt, "inputs not listed yet: {e}");
                tokio::time::sleep(client.policy().backoff(n)).await;
            }
        }
    }
}

async fn stage_all(
    client: &CheckpointClient,
    key: Key,
    dir: &Path,
    cap: u64,
    mut files: Listed,
    report: &mut Reporter<'_>,
    keep_going: &(dyn Fn() -> bool + Sync),
) -> Result<Staged, Failure> {
    if report.total > cap {
        return Err(fail(
            CONTAINER_DIR,
            format!(
                "the inputs are {} bytes, more than the job's disk ({cap} bytes): ask for \
                 a larger disk_gb",
                report.total
            ),
        ));
    }
    let mut staged = Staged::default();
    for i in 0..files.files.len() {
        let f = files.files[i].clone();
        if !stays_inside(&f.path) {
            return Err(fail(&f.path, "the portal sent a path outside /inputs"));
        }
        let to = f.path.split('/').fold(dir.to_path_buf(), |p, s| p.join(s));
        let path = input_file_path(
            key.0,
            key.1,
            &commons_api::files::percent_encode_path(&f.path),
        );
        let (mut n, mut relist) = (0, false);
        loop {
            if relist || files.stale(i) {
                files.refresh(list(client, key).await?);
            }
            let source = files.source(i, &path);
            let mut progress = StagingProgress {
                report: &mut *report,
                base: staged.bytes,
                keep_going,
            };
            let signed = matches!(source, Source::Signed(_));
            match download(client, source, &f, &to, &mut progress).await {
                Ok(()) => break,
                Err(Fetch::Stopped) => return Err(fail(&f.path, "the attempt was stopped")),
                Err(Fetch::Local(e)) => return Err(fail(&f.path, format!("cannot write it: {e}"))),
                // A signed URL refused (expired, the object replaced): list again.
                Err(Fetch::Api(e)) if (gives_up(&e) && !signed) || n + 1 >= TRIES => {
                    let tries = if gives_up(&e) {
                        String::new()
                    } else {
                        format!(" after {TRIES} tries")
                    };
                    return Err(fail(&f.path, format!("{e}{tries}")));
                }
                Err(Fetch::Api(e)) => {
                    n += 1;
                    relist = signed;
                    tracing::warn!(
                        job = key.0,
                        attempt = key.1,
                        file = f.path,
                        "input not staged yet: {e}"
                    );
                    tokio::time::sleep(client.policy().backoff(n)).await;
                }
            }
        }
        staged.files += 1;
        staged.bytes += f.size;
    }
    Ok(staged)
}

/// Told of every chunk a download writes (the bytes of the file so far); false stops it.
pub(crate) trait Progress {
    async fn chunk(&mut self, got: u64) -> bool;
}

/// Nothing to report, never stopped.
pub(crate) struct Quiet;

impl Progress for Quiet {
    async fn chunk(&mut self, _: u64) -> bool {
        true
    }
}

/// A job's staging: reported to the portal, stopped with the attempt.
struct StagingProgress<'r, 'a> {
    report: &'r mut Reporter<'a>,
    /// Bytes of earlier files already staged.
    base: u64,
    keep_going: &'r (dyn Fn() -> bool + Sync),
}

impl Progress for StagingProgress<'_, '_> {
    async fn chunk(&mut self, got: u64) -> bool {
        if !(self.keep_going)() {
            return false;
        }
        self.report.send(self.base + got, false, None).await;
        true
    }
}

/// Why one fetch failed.
pub(crate) enum Fetch {
    Api(ApiError),
    Local(std::io::Error),
    Stopped,
}

/// Downloads one file listed as `f` from `source` (its signed URL, or the portal's
/// route) to `to` (read-only once whole), checking its size and SHA-256 (inputs and
/// `lab:` datasets alike).
pub(crate) async fn download(
    client: &CheckpointClient,
    source: Source<'_>,
    f: &InputFile,
    to: &Path,
    progress: &mut impl Progress,
) -> Result<(), Fetch> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = to.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(Fetch::Local)?;
    }
    // A large file gets the time it needs at 10 MB/s, at least the usual request time.
    let time = client
        .policy()
        .request_timeout
        .max(Duration::from_secs(f.size / 10_000_000));
    let request = match source {
        Source::Portal(path) => client.request(reqwest::Method::GET, path),
        Source::Signed(url) => client.signed_get(url).map_err(Fetch::Api)?,
    };
    let resp = request
        .timeout(time)
        .send()
        .await
        .map_err(|e| Fetch::Api(transport(e)))?;
    let signed = matches!(source, Source::Signed(_));
    let mut resp = ok(resp)
        .await
        .map_err(|e| Fetch::Api(if signed { crate::signed::refusal(e) } else { e }))?;
    let _ = tokio::fs::remove_file(to).await;
    let mut out = tokio::fs::File::create(to).await.map_err(Fetch::Local)?;
    let mut sha = Sha256::new();
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await.map_err(|e| Fetch::Api(transport(e)))? {
        if !progress.chunk(got).await {
            return Err(Fetch::Stopped);
        }
        got += chunk.len() as u64;
        if got > f.size {
            return Err(Fetch::Api(ApiError::Damaged(format!(
                "more bytes than the {} listed",
                f.size
            ))));
        }
        sha.update(&chunk);
        out.write_all(&chunk).await.map_err(Fetch::Local)?;
    }
    progress.chunk(got).await;
    out.flush().await.map_err(Fetch::Local)?;
    drop(out);
    let hex = hex::encode(sha.finalize());
    if got != f.size || hex != f.sha256 {
        return Err(Fetch::Api(ApiError::Damaged(format!(
            "arrived as {got} bytes with SHA-256 {hex}; the portal listed {} bytes, {}",
            f.size, f.sha256
        ))));
    }
    let ro = std::fs::Permissions::from_mode(0o444);
    tokio::fs::set_permissions(to, ro)
        .await
        .map_err(Fetch::Local)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_paths_stay_inside_and_are_encoded() {
        assert!(stays_inside("lab/vision/a.txt"));
        for bad in ["", "../x", "a/../../x", "/etc/x", "a//b", "./a"] {
            assert!(!stays_inside(bad), "{bad}");
        }
        assert_eq!(
            commons_api::files::percent_encode_path("a b/é"),
            "a%20b/%C3%A9"
        );
        assert_eq!(
            host_dir(Path::new("/s/attempts/1-1")),
            Path::new("/s/attempts/1-1/disk/inputs")
        );
        let f = fail("data/x", "gone");
        assert_eq!(f.to_string(), "input data/x: gone");
        assert_eq!(
            fail(CONTAINER_DIR, "cannot list").to_string(),
            "cannot list"
        );
    }
}
