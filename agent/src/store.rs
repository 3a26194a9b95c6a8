//! The attempts' state on disk, which outlives the agent process.
//!
//! ```text
//! <state-dir>/attempts/<job>-<attempt>/
//!     lease.json     LeaseFile: container id, lease and time-limit deadlines (CLOCK_BOOTTIME
//!                    ms, with the boot they belong to), the enforcement grace, and the stop
//!                    under way, if any. Written by the agent at start, at every renewal and
//!                    when it stops the container; read by the guard every 500 ms.
//!     guard.pid      the guard's pid; the guard holds an exclusive flock on it while it runs
//!     guard.log      the guard's stderr
//!     stopped.json   StoppedFile: written by the guard *before* it stops the container, so
//!                    whoever sees the container end knows why
//!     result.json    ResultFile: how the attempt ended, written before its container is removed
//!     gpus.json      HoldFile: its GPUs and its share of one, written at start, so that a
//!                    restarted agent keeps counting what its attempts hold (`share`)
//!     disk.json, disk.img, disk/  the attempt's volume, capped (see `disk`)
//!     checkpoint.json ...  its /checkpoint's upload state, the directory in disk/ (see
//!                    `checkpoint`)
//! ```
//!
//! Invariants: every file is written whole and synced, with its directory (`atomic`), so a
//! reader sees the old or the new content, never a mix, and `result.json` is on disk before
//! the container may go; the directory is deleted only once the portal acknowledged the
//! result.

use crate::atomic;
use crate::checkpoint::{self, CheckpointFile};
use crate::reconcile::Key;
use crate::state::StateError;
use commons_proto::{Attempt, AttemptState, JobId, StopReason};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const ATTEMPTS_DIR: &str = "attempts";
pub const LEASE_FILE: &str = "lease.json";
pub const RESULT_FILE: &str = "result.json";
pub const STOPPED_FILE: &str = "stopped.json";
pub const HOLD_FILE: &str = "gpus.json";
pub const GUARD_PID_FILE: &str = "guard.pid";
pub const GUARD_LOG_FILE: &str = "guard.log";
/// The most output `result.json` keeps: the end of it.
pub const LOG_TAIL_MAX: usize = 64 * 1024;

/// What the guard enforces, and what a restarted agent restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFile {
    /// `None` until the container is created.
    pub container: Option<String>,
    /// The boot the deadlines count in; in any other boot they are void (expired).
    pub boot_id: String,
    /// The lease runs out after this (CLOCK_BOOTTIME ms).
    pub lease_deadline_ms: u64,
    /// The time limit is reached at this (CLOCK_BOOTTIME ms); `None` when unknown.
    pub time_limit_deadline_ms: Option<u64>,
    /// The time limit that deadline counts, in seconds from the container's start, so a
    /// restarted agent can still extend it; `None` in files written before extensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_s: Option<u64>,
    /// SIGTERM, then this long, then SIGKILL, when the lease or the time limit runs out.
    pub grace_s: u64,
    /// A stop the agent has begun; the guard then only makes sure it finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopMark>,
}

/// A stop under way: why, since when (CLOCK_BOOTTIME ms), and with what grace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopMark {
    pub reason: StopReason,
    pub text: String,
    /// The stop ends the attempt as failed (`reconcile::Why::fails`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fails: bool,
    pub grace_ms: u64,
    pub since_ms: u64,
}

/// The guard's stop: its reason, when it began (CLOCK_BOOTTIME ms), with what grace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoppedFile {
    pub reason: StopReason,
    pub at_ms: u64,
    pub grace_s: u64,
}

/// What an attempt holds of the server's GPUs (`share::Hold`), kept for a restarted agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldFile {
    /// UUIDs of its GPUs.
    pub gpus: Vec<String>,
    /// Its share of its one GPU; `None`: whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<commons_proto::GpuShare>,
}

/// How an attempt ended, kept until the portal acknowledges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultFile {
    pub state: AttemptState,
    pub exit_code: Option<i64>,
    pub stop: Option<StopReason>,
    pub reason: Option<String>,
    /// Wall-clock end time, Unix milliseconds (for people; nothing is decided from it).
    pub ended_unix_ms: u64,
    /// The end of the attempt's output, at most [`LOG_TAIL_MAX`] bytes.
    pub log_tail: String,
}

/// What is on disk of one attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnDisk {
    pub lease: Option<LeaseFile>,
    pub stopped: Option<StoppedFile>,
    pub result: Option<ResultFile>,
    /// `checkpoint.json`: snapshot interval, whether the final upload is over.
    pub checkpoint: Option<CheckpointFile>,
    /// `gpus.json`: its GPUs and share.
    pub hold: Option<HoldFile>,
}

impl OnDisk {
    /// Nothing here says what became of the attempt: a leftover directory.
    pub fn is_stray(&self) -> bool {
        self.lease.is_none() && self.stopped.is_none() && self.result.is_none()
    }
}

/// The attempts directory of a state dir, and the guard program to run for each attempt.
#[derive(Debug, Clone)]
pub struct Store {
    state_dir: PathBuf,
    guard: Option<PathBuf>,
}

/// `<state-dir>/attempts/<job>-<attempt>`.
pub fn attempt_dir(state_dir: &Path, job: JobId, attempt: Attempt) -> PathBuf {
    state_dir
        .join(ATTEMPTS_DIR)
        .join(format!("{job}-{attempt}"))
}

fn parse_dir_name(name: &str) -> Option<Key> {
    let (job, attempt) = name.rsplit_once('-')?;
    Some((job.parse().ok()?, attempt.parse().ok()?))
}

impl Store {
    /// Attempts kept under `state_dir`, without guards (see [`Store::with_guard`]).
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            guard: None,
        }
    }

    /// Runs `program guard ...` for every running attempt (`program` is this agent's
    /// executable).
    pub fn with_guard(mut self, program: Option<PathBuf>) -> Self {
        self.guard = program;
        self
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn guard_program(&self) -> Option<&Path> {
        self.guard.as_deref()
    }

    pub fn dir(&self, (job, attempt): Key) -> PathBuf {
        attempt_dir(&self.state_dir, job, attempt)
    }

    pub fn write_lease(&self, key: Key, lease: &LeaseFile) -> Result<(), StateError> {
        write_json(&self.dir(key).join(LEASE_FILE), lease)
    }

    /// Writes `gpus.json`, beside `lease.json`.
    pub fn write_hold(&self, key: Key, hold: &HoldFile) -> Result<(), StateError> {
        write_json(&self.dir(key).join(HOLD_FILE), hold)
    }

    /// Writes `result.json`, durably: after this returns, the container may go.
    pub fn write_result(&self, key: Key, result: &ResultFile) -> Result<(), StateError> {
        write_json(&self.dir(key).join(RESULT_FILE), result)
    }

    pub fn read_stopped(&self, key: Key) -> Result<Option<StoppedFile>, StateError> {
        read_json(&self.dir(key).join(STOPPED_FILE))
    }

    /// Deletes an acknowledged attempt's directory, its volume released first; a volume
    /// that cannot be released keeps the directory (see `disk`). Its container, and so its
    /// guard, are gone by then: a guard that finds the directory gone stops what it guards.
    pub fn remove(&self, key: Key) -> std::io::Result<()> {
        let dir = self.dir(key);
        crate::disk::release(&dir).map_err(std::io::Error::other)?;
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Every attempt directory with what it holds. A damaged file counts as absent (and is
    /// logged): a missing `lease.json` means an expired lease, a missing result means the
    /// attempt is reported lost, both of which the portal requeues.
    pub fn load_all(&self) -> BTreeMap<Key, OnDisk> {
        let mut out = BTreeMap::new();
        let root = self.state_dir.join(ATTEMPTS_DIR);
        let entries = match std::fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
            Err(e) => {
                tracing::error!("cannot read {}: {e}", root.display());
                return out;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(parse_dir_name) else {
                continue;
            };
            let dir = entry.path();
            out.insert(
                key,
                OnDisk {
                    lease: read_logged(&dir.join(LEASE_FILE)),
                    stopped: read_logged(&dir.join(STOPPED_FILE)),
                    result: read_logged(&dir.join(RESULT_FILE)),
                    checkpoint: read_logged(&dir.join(checkpoint::STATE_FILE)),
                    hold: read_logged(&dir.join(HOLD_FILE)),
                },
            );
        }
        out
    }
}

fn read_logged<T: DeserializeOwned>(path: &Path) -> Option<T> {
    read_json(path).unwrap_or_else(|e| {
        tracing::error!("{e}");
        None
    })
}

/// Reads a JSON file; `None` when it does not exist.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StateError::Unreadable {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes a JSON file whole and durably (see `atomic`), creating its directory when needed.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    write_json_mode(path, value, atomic::PLAIN)
}

/// [`write_json`] with the file's mode: [`atomic::PRIVATE`] for secrets.
pub fn write_json_mode<T: Serialize>(path: &Path, value: &T, mode: u32) -> Result<(), StateError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|source| StateError::Encode {
        path: path.to_path_buf(),
        source,
    })?;
    atomic::write(path, &bytes, mode).map_err(|source| StateError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The last `max` bytes of `s`, cut at a character boundary.
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_and_damage_counts_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let lease = LeaseFile {
            container: Some("c1".into()),
            boot_id: "b".into(),
            lease_deadline_ms: 5000,
            time_limit_deadline_ms: Some(9000),
            time_limit_s: Some(60),
            grace_s: 10,
            stop: None,
        };
        store.write_lease((3, 2), &lease).unwrap();
        let result = ResultFile {
            state: AttemptState::Exited,
            exit_code: Some(4),
            stop: None,
            reason: None,
            ended_unix_ms: 1,
            log_tail: "bye".into(),
        };
        store.write_result((3, 2), &result).unwrap();
        assert!(dir.path().join("attempts/3-2/lease.json").is_file());
        std::fs::create_dir_all(dir.path().join("attempts/4-1")).unwrap();
        std::fs::write(dir.path().join("attempts/4-1/lease.json"), "{oops").unwrap();
        std::fs::create_dir_all(dir.path().join("attempts/not-an-attempt")).unwrap();
        let all = store.load_all();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[&(3, 2)].lease.as_ref(), Some(&lease));
        assert_eq!(all[&(3, 2)].result.as_ref(), Some(&result));
        assert_eq!(all[&(4, 1)], OnDisk::default());
        store.remove((3, 2)).unwrap();
        store.remove((3, 2)).unwrap();
        assert!(!store.dir((3, 2)).exists());
    }

    #[test]
    fn the_tail_keeps_the_end_at_a_character_boundary() {
        assert_eq!(tail("abc", 10), "abc");
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aéb", 2), "b");
    }
}
