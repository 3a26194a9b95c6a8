//! `commons cp` of a file larger than one part (8 MiB) into the store: an upload in parts
//! (`/api/v1/uploads`, documented in `commons_api::uploads`), so that a dropped
//! connection costs one part and an interrupted copy picks up where it stopped.
//!
//! 1. The file's SHA-256 is read first: the portal checks the joined parts against it.
//! 2. An unfinished upload of the caller's to the same path with the same size (one that
//!    an earlier `commons cp` left) is resumed: only the parts the portal has not
//!    received are sent. Otherwise a new upload starts.
//! 3. Each part is its own request, tried up to [`TRIES`] times, waiting
//!    [`FIRST_WAIT`] and then twice as long before each next try; a refusal that trying
//!    again cannot change (4xx) stops at once. When a part still fails, the upload is
//!    left for the next run (the portal keeps it a day).
//! 4. The join is checked as a streamed upload is: the stored size and SHA-256 must be
//!    the local file's. A resumed upload whose parts turn out not to be this file's (it
//!    changed since) is given up and sent again from the start.
//!
//! Invariant: at most one part (8 MiB) is held in memory at a time.

use crate::client::Client;
use crate::error::{CliError, Result};
use commons_api::files::FileEntry;
use commons_api::uploads::{UploadStart, UploadView, PART_BYTES};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

/// How many times one part is tried before the copy stops.
pub const TRIES: u32 = 5;
/// The wait before a part's second try; each later wait is twice the one before.
pub const FIRST_WAIT: Duration = Duration::from_secs(1);

/// Whether a file of `len` bytes goes in parts.
pub fn in_parts(len: u64) -> bool {
    len > PART_BYTES
}

/// Uploads `local` (`len` bytes) to `target` (`PATH` in one's own space, `lab:SLUG/PATH`
/// in a lab's) in parts; `shown` is the destination as the user wrote it. The stored file.
pub fn upload(
    client: &Client,
    local: &Path,
    len: u64,
    target: &str,
    shown: &str,
) -> Result<FileEntry> {
    let name = local.display().to_string();
    let sha256 = file_sha256(local, &name)?;
    let mut resumed = find(client, target, len)?;
    loop {
        let up = match resumed.take() {
            Some(up) => {
                eprintln!(
                    "{name} -> {shown}: resuming upload {}, {} of {} parts already sent",
                    up.id,
                    up.received.len(),
                    up.parts
                );
                (up, true)
            }
            None => {
                let start = UploadStart {
                    path: target.to_string(),
                    size: len,
                    sha256: Some(sha256.clone()),
                };
                (client.post("/api/v1/uploads", &start)?, false)
            }
        };
        let (up, was_resumed) = up;
        send_missing(client, local, &name, shown, &up)?;
        match client.post_long::<FileEntry>(
            &format!("/api/v1/uploads/{}/complete", up.id),
            &serde_json::Value::Null,
        ) {
            Ok(stored) => match check(&stored, len, &sha256, &name, shown) {
                // Parts of another file, joined without a checksum (an upload started
                // elsewhere): send this file whole, replacing what was joined.
                Err(_) if was_resumed => eprintln!(
                    "upload {} held parts of another file: sending {name} again from the start",
                    up.id
                ),
                checked => return checked.map(|()| stored),
            },
            // The parts an earlier run sent are of another file (this one changed since):
            // give that upload up and send this file whole.
            Err(CliError::Invalid { field, .. }) if field == "sha256" && was_resumed => {
                eprintln!(
                    "{name} changed since upload {} began: sending it again from the start",
                    up.id
                );
                client.delete(&format!("/api/v1/uploads/{}", up.id))?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The caller's unfinished upload to `target` of `len` bytes with the most parts sent.
fn find(client: &Client, target: &str, len: u64) -> Result<Option<UploadView>> {
    let mine: Vec<UploadView> = client.get("/api/v1/uploads")?;
    Ok(mine
        .into_iter()
        .filter(|u| u.path == target && u.size == len && u.part_bytes > 0)
        .max_by_key(|u| (u.received.len(), u.id)))
}

/// Sends the parts of `up` that the portal has not received, in order.
fn send_missing(
    client: &Client,
    local: &Path,
    name: &str,
    shown: &str,
    up: &UploadView,
) -> Result<()> {
    let read = |e: std::io::Error| CliError::Usage(format!("cannot read {name}: {e}"));
    let mut file = std::fs::File::open(local).map_err(read)?;
    for n in (0..up.parts).filter(|n| !up.received.contains(n)) {
        let start = u64::from(n) * up.part_bytes;
        let want = up.part_bytes.min(up.size.saturating_sub(start));
        let mut part = vec![0u8; usize::try_from(want).unwrap_or(usize::MAX)];
        file.seek(SeekFrom::Start(start)).map_err(read)?;
        file.read_exact(&mut part).map_err(read)?;
        send_part(client, up, n, part).map_err(|e| {
            CliError::Other(anyhow::anyhow!(
                "the upload of {name} to {shown} stopped at part {} of {}: {e}; run the same \
                 commons cp again to send only the parts the portal lacks",
                n + 1,
                up.parts
            ))
        })?;
    }
    Ok(())
}

/// PUTs part `n`, trying again after failures that another try may mend.
fn send_part(client: &Client, up: &UploadView, n: u32, part: Vec<u8>) -> Result<()> {
    let path = format!("/api/v1/uploads/{}/parts/{n}", up.id);
    let mut tried = 0;
    loop {
        tried += 1;
        let body = reqwest::blocking::Body::from(part.clone());
        match client.put_body(&path, body) {
            Ok(_) => return Ok(()),
            Err(e) if tried < TRIES && worth_retrying(&e) => {
                let wait = FIRST_WAIT * 2u32.pow(tried - 1);
                eprintln!(
                    "part {} of {} failed ({e}); trying again in {} s",
                    n + 1,
                    up.parts,
                    wait.as_secs()
                );
                std::thread::sleep(wait);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A lost connection, no answer in time, a server error or "later, please".
fn worth_retrying(e: &CliError) -> bool {
    match e {
        CliError::Unreachable { .. } => true,
        CliError::Api { status, .. } => *status >= 500 || matches!(status, 408 | 429),
        _ => false,
    }
}

fn file_sha256(local: &Path, name: &str) -> Result<String> {
    let read = |e: std::io::Error| CliError::Usage(format!("cannot read {name}: {e}"));
    let mut file = std::fs::File::open(local).map_err(read)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(read)?;
        if n == 0 {
            return Ok(hex::encode(hash.finalize()));
        }
        hash.update(&buf[..n]);
    }
}

fn check(stored: &FileEntry, len: u64, sha256: &str, name: &str, shown: &str) -> Result<()> {
    if stored.sha256 != sha256 || stored.size != len {
        return Err(CliError::Other(anyhow::anyhow!(
            "{shown} was damaged on the way: the portal stored {} bytes with SHA-256 {}, but \
             {name} has {len} with {sha256}; copy it again",
            stored.size,
            stored.sha256
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_another_try_may_mend_are_retried() {
        let api = |status| CliError::Api {
            status,
            code: String::new(),
            message: String::new(),
        };
        assert!(worth_retrying(&CliError::Unreachable {
            url: "u".into(),
            why: "reset".into()
        }));
        assert!(worth_retrying(&api(502)) && worth_retrying(&api(429)));
        assert!(!worth_retrying(&api(400)) && !worth_retrying(&api(404)));
        assert!(!worth_retrying(&CliError::Forbidden("no".into())));
        assert!(!in_parts(PART_BYTES) && in_parts(PART_BYTES + 1));
    }

    #[test]
    fn a_files_sha256_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, vec![7u8; 3 << 20]).unwrap();
        let want = hex::encode(Sha256::digest(vec![7u8; 3 << 20]));
        assert_eq!(file_sha256(&f, "x").unwrap(), want);
    }
}
