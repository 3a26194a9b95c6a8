//! Checkpoints: every attempt's writable `/checkpoint`, kept on the host and carried to the
//! portal's checkpoint store (`commons_proto::CHECKPOINTS_PATH`), so that a job stopped
//! here resumes on any server.
//!
//! The contract with the job: `/checkpoint` is an empty directory, writable by the job's
//! user (uid/gid 65534), and `COMMONS_CHECKPOINT_DIR=/checkpoint` says where it is. When
//! the attempt resumes a checkpoint, the directory holds what the job last left there and
//! `COMMONS_RESUME=1` is set. The job writes files atomically (a temporary file, then a
//! rename), because a snapshot may be taken at any moment while it runs.
//!
//! On the host, beside the attempt's other files (see `store`), the directory itself in
//! the attempt's volume, which holds it to the job's disk cap (see `disk`):
//!
//! ```text
//! <state-dir>/attempts/<job>-<attempt>/
//!     disk/checkpoint/      bind-mounted read-write at /checkpoint; 65534:65534, mode 0700
//!     disk/checkpoint.restoring/
//!                           the archive being unpacked, renamed to checkpoint/ when whole
//!     checkpoint.json       CheckpointFile: snapshot interval, what the store already
//!                           has (a fingerprint), whether the final upload is over
//!     checkpoint.tar.zst    the archive being uploaded (tar + zstd), while it is
//!     upload.json           UploadFile: that archive's size, checksum and fingerprint
//!     restore.tar.zst       a download being restored, while it is
//! ```
//!
//! An attempt started by an agent that predates volumes has `checkpoint/` beside these
//! files instead ([`host_dir`] finds it).
//!
//! Invariants:
//! - The agent never follows a symbolic link inside a checkpoint directory: the job
//!   controls its content, and the agent runs as root ([`walk`] opens everything relative
//!   to directories it already holds, with `O_NOFOLLOW`).
//! - A restored directory is whole or absent: an archive is unpacked into
//!   `checkpoint.restoring/` and renamed into place only when every entry passed
//!   ([`archive::unpack`] refuses absolute paths, `..`, links that leave the directory,
//!   devices and FIFOs, and archives over the job's disk cap).
//! - Archives are held to the job's disk cap both ways, files counted at their apparent
//!   size (see [`archive`]): what could not be restored is never uploaded.
//! - An archive is uploaded only with its `upload.json`, written after the archive was
//!   synced; a restarted agent resumes that upload only when the directory still has the
//!   fingerprint the archive was made from, and re-reads the archive's checksum first.

pub mod archive;
pub mod client;
pub mod sparse;
pub mod upload;
pub mod walk;

use crate::state::StateError;
use crate::store::{read_json, write_json};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use client::{ApiError, CheckpointClient, Policy};

/// Where the job sees its checkpoint directory.
pub const CONTAINER_DIR: &str = "/checkpoint";
/// The environment variable that names [`CONTAINER_DIR`], always set.
pub const ENV_DIR: &str = "COMMONS_CHECKPOINT_DIR";
/// Set to `1` when the attempt starts from a restored checkpoint.
pub const ENV_RESUME: &str = "COMMONS_RESUME";
/// The job's user and group (`runtime::JOB_USER`), who owns the checkpoint directory.
pub const JOB_UID: u32 = 65534;
pub const JOB_GID: u32 = 65534;

pub const DIR_NAME: &str = "checkpoint";
pub const STATE_FILE: &str = "checkpoint.json";
pub const ARCHIVE_FILE: &str = "checkpoint.tar.zst";
pub const UPLOAD_FILE: &str = "upload.json";
pub const DOWNLOAD_FILE: &str = "restore.tar.zst";
pub const RESTORING_DIR: &str = "checkpoint.restoring";

/// The attempt's checkpoint directory on the host: in its volume, or where an agent
/// that predates volumes made it.
pub fn host_dir(attempt_dir: &Path) -> PathBuf {
    let legacy = attempt_dir.join(DIR_NAME);
    let volume = crate::disk::volume_dir(attempt_dir);
    if !volume.exists() && std::fs::symlink_metadata(&legacy).is_ok_and(|m| m.is_dir()) {
        return legacy;
    }
    volume.join(DIR_NAME)
}

/// Where a restore is unpacked: beside [`host_dir`], on the same file system (it is
/// renamed into place) and inside the same cap.
pub fn restoring_dir(attempt_dir: &Path) -> PathBuf {
    crate::disk::volume_dir(attempt_dir).join(RESTORING_DIR)
}

/// How the upload after the attempt stopped ended; once set, it is not tried again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalUpload {
    /// The portal committed it.
    Stored,
    /// Nothing to upload: the directory is empty, or the store already has its content.
    Nothing,
    /// It could not be stored; the reason went to the job's log.
    GivenUp,
}

/// What the agent keeps about an attempt's checkpoints (`checkpoint.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointFile {
    /// Snapshot every this many seconds while the attempt runs (from the job's spec, for a
    /// restarted agent, which has no spec).
    #[serde(default)]
    pub interval_s: Option<u64>,
    /// The attempt started from a restored checkpoint.
    #[serde(default)]
    pub resumed: bool,
    /// The fingerprint ([`walk::fingerprint`]) of the content the store already has from
    /// this attempt (restored or committed): the same content is not uploaded again.
    #[serde(default)]
    pub stored: Option<String>,
    /// The upload after the attempt stopped is over.
    #[serde(default)]
    pub final_upload: Option<FinalUpload>,
}

impl CheckpointFile {
    pub fn read(attempt_dir: &Path) -> Result<Option<Self>, StateError> {
        read_json(&attempt_dir.join(STATE_FILE))
    }

    /// Writes it whole and synced: it decides what a restarted agent uploads.
    pub fn write(&self, attempt_dir: &Path) -> Result<(), StateError> {
        write_json(&attempt_dir.join(STATE_FILE), self)
    }

    /// Reads, changes and writes back (a missing or damaged file counts as empty).
    pub fn update(attempt_dir: &Path, f: impl FnOnce(&mut Self)) -> Result<Self, StateError> {
        let mut file = Self::read(attempt_dir).ok().flatten().unwrap_or_default();
        f(&mut file);
        file.write(attempt_dir)?;
        Ok(file)
    }
}

/// The archive under upload (`upload.json`), beside `checkpoint.tar.zst`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadFile {
    /// The directory's fingerprint when the archive was made.
    pub fingerprint: String,
    pub bytes: u64,
    /// SHA-256 of the archive, lowercase hex.
    pub sha256: String,
    /// A commit of this archive was sent: its answer may have been lost, so a resumed
    /// upload that finds no parts commits again before sending any.
    #[serde(default)]
    pub commit_sent: bool,
    /// When this agent began packing the archive, to tell the portal how long the
    /// checkpoint took to write. Not kept in the file: an archive left by an earlier try
    /// (another journey, perhaps another run of the agent) has no known start.
    #[serde(skip)]
    pub packing_started: Option<std::time::Instant>,
}

/// Creates the attempt's checkpoint directory if it is missing and hands it to the job's
/// user: owner 65534:65534, mode 0700. An agent that may not change owners (not root)
/// makes it mode 0777 instead, inside its own state dir that nobody else may enter, and
/// says so in its log.
pub fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    match std::os::unix::fs::chown(dir, Some(JOB_UID), Some(JOB_GID)) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            tracing::warn!(
                "cannot give {} to uid {JOB_UID} ({e}): the agent does not run as root, so \
                 the directory is made mode 0777 instead",
                dir.display()
            );
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
        }
        Err(e) => Err(e),
    }
}

/// Removes a file, a missing one included.
pub(crate) fn remove_file(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Removes a directory tree, a missing one included.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn the_directory_belongs_to_the_job_user_with_mode_0700() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = host_dir(tmp.path());
        prepare_dir(&dir).unwrap();
        prepare_dir(&dir).unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!((m.uid(), m.gid()), (JOB_UID, JOB_GID));
            assert_eq!(m.permissions().mode() & 0o7777, 0o700);
        } else {
            assert_eq!(m.permissions().mode() & 0o7777, 0o777, "the fallback");
        }
    }

    #[test]
    fn the_state_file_round_trips_and_updates() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(CheckpointFile::read(tmp.path()).unwrap(), None);
        CheckpointFile::update(tmp.path(), |f| f.interval_s = Some(60)).unwrap();
        let f = CheckpointFile::update(tmp.path(), |f| f.final_upload = Some(FinalUpload::Stored))
            .unwrap();
        assert_eq!(f.interval_s, Some(60));
        assert_eq!(CheckpointFile::read(tmp.path()).unwrap(), Some(f));
    }
}
