//! A guest cannot fill its lender's disks: every host path a job can write lives in the
//! attempt's own volume, capped at the job's `disk_gb` (at most the node's
//! `--max-job-disk-gb`), and the agent keeps a free-space floor on its state dir's file
//! system ([`floor`]) below which it takes no new guests.
//!
//! ```text
//! <state-dir>/attempts/<job>-<attempt>/
//!     disk.json     DiskFile: the cap in bytes and how it is held; written before the
//!                   volume is made, so a restarted agent always knows to release it
//!     disk.img      the volume's ext4 image (image mode only), a sparse file of the cap
//!     disk/         the volume: the image mounted here, or a plain directory (watch)
//!         checkpoint/            bind-mounted at /checkpoint (see `checkpoint`)
//!         checkpoint.restoring/  a restore being unpacked, inside the cap too
//! ```
//!
//! Every host path a job may write is a directory inside `disk/` (today `/checkpoint`;
//! a later one is another directory beside it), so one cap holds for all of them.
//!
//! How the cap is held ([`Enforcement`], chosen at start by `--job-disk`):
//! - `image`: `disk/` is an ext4 image of the cap's size, loop-mounted (see [`image`]);
//!   the job gets `ENOSPC` at its cap. Needs root, loop devices and `mkfs.ext4`; `auto`
//!   (the default of `commons-agent run`) checks that at start with a small image and
//!   falls back to `watch`, saying why.
//! - `watch`: `disk/` is a plain directory; the executor measures it every
//!   [`WATCH_EVERY`] and stops a job over its cap with the reason. What it writes between
//!   two looks passes the cap, so the floor is the backstop.
//!
//! Invariants: a volume is released ([`release`]: unmounted, the loop device with it)
//! before its attempt's directory is deleted, and a directory whose volume cannot be
//! released is not deleted (deleting would empty the job's file system through the
//! mount and leave the device attached); a restarted agent mounts again the images of
//! the attempts it takes back ([`reattach`]) and releases every volume of the
//! directories it drops.

pub mod floor;
pub mod image;

use crate::store::{read_json, write_json};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

pub use floor::Floor;

/// The volume's mount point (or plain directory) in an attempt's directory.
pub const VOLUME_DIR: &str = "disk";
/// The volume's image, in image mode.
pub const IMAGE_FILE: &str = "disk.img";
/// [`DiskFile`].
pub const DISK_FILE: &str = "disk.json";
/// How often a watched volume is measured.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);
/// The node's largest `disk_gb` unless `--max-job-disk-gb` says otherwise.
pub const DEFAULT_MAX_JOB_GB: u64 = 100;
const GIB: u64 = 1 << 30;

#[derive(Debug, Error)]
pub enum DiskError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is not installed (e2fsprogs and mount provide what volumes need)")]
    NoTool(String),
    #[error("{0}")]
    Unseen(String),
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: String,
        status: String,
        stderr: String,
    },
}

/// How an attempt's cap is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// A loop-mounted ext4 image of the cap's size: `ENOSPC` at the cap.
    Image,
    /// A plain directory, measured every [`WATCH_EVERY`]: the job is stopped over its cap.
    Watch,
}

/// `--job-disk`: how caps are held on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapMode {
    /// Images where the agent can make and mount them (checked at start), else watch.
    Auto,
    Image,
    /// What a [`DiskPolicy`] defaults to: no mounts (tests, agents embedded elsewhere).
    #[default]
    Watch,
}

impl std::str::FromStr for CapMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "image" => Ok(Self::Image),
            "watch" => Ok(Self::Watch),
            _ => Err(format!(
                "--job-disk: expected auto, image or watch, got {s:?}"
            )),
        }
    }
}

/// The node's disk settings (`commons-agent run --max-job-disk-gb --min-free-disk
/// --job-disk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskPolicy {
    /// The largest `disk_gb` a job may have here, in GiB; a job that asks for none, or
    /// (from an older portal) for more, gets this.
    pub max_job_gb: u64,
    /// Below this much free space on the state dir's file system, no new guests.
    pub floor: Floor,
    pub mode: CapMode,
}

impl Default for DiskPolicy {
    fn default() -> Self {
        Self {
            max_job_gb: DEFAULT_MAX_JOB_GB,
            floor: Floor::default(),
            mode: CapMode::default(),
        }
    }
}

impl DiskPolicy {
    /// The policy with `auto` settled: `image` when a small volume can be made and
    /// mounted in `state_dir` now, else `watch` (logged with the reason). `image` asked
    /// for explicitly must pass the same test.
    pub fn settled(mut self, state_dir: &Path) -> Result<Self, DiskError> {
        match self.mode {
            CapMode::Watch => {}
            CapMode::Image => {
                image::self_test(state_dir)?;
            }
            CapMode::Auto => match image::self_test(state_dir) {
                Ok(()) => self.mode = CapMode::Image,
                Err(e) => {
                    tracing::warn!(
                        "jobs' disks cannot be file system images here ({e}): each job's \
                         volume is a plain directory that the agent measures every {} s \
                         and stops the job over its cap",
                        WATCH_EVERY.as_secs()
                    );
                    self.mode = CapMode::Watch;
                }
            },
        }
        Ok(self)
    }

    /// How this policy holds caps (`auto` not yet settled counts as `watch`).
    pub fn enforcement(&self) -> Enforcement {
        match self.mode {
            CapMode::Image => Enforcement::Image,
            CapMode::Auto | CapMode::Watch => Enforcement::Watch,
        }
    }

    /// The cap of a job that asks for `disk_gb` (none: the node's largest), in bytes,
    /// and whether it asked for more than this node gives (it then gets the largest).
    pub fn cap_for(&self, disk_gb: Option<u64>) -> (u64, bool) {
        let max = self.max_job_gb.max(1);
        let gb = disk_gb.unwrap_or(max).max(1);
        (gb.min(max).saturating_mul(GIB), gb > max)
    }
}

/// `disk.json`: an attempt's cap, and how it is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFile {
    pub cap_bytes: u64,
    pub enforced_by: Enforcement,
}

impl DiskFile {
    pub fn read(attempt_dir: &Path) -> Option<Self> {
        read_json(&attempt_dir.join(DISK_FILE)).ok().flatten()
    }
}

/// The attempt's volume (see the module's layout).
pub fn volume_dir(attempt_dir: &Path) -> PathBuf {
    attempt_dir.join(VOLUME_DIR)
}

/// Turns an I/O error at `path` into a [`DiskError`] that names it.
fn io_error(path: &Path) -> impl Fn(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Makes the attempt's volume of `cap_bytes`, held as `how`: `disk.json` first, then the
/// image, formatted and mounted (or a plain directory). A volume already there (the
/// same attempt prepared again) is kept.
pub fn prepare(attempt_dir: &Path, cap_bytes: u64, how: Enforcement) -> Result<(), DiskError> {
    let file = DiskFile {
        cap_bytes,
        enforced_by: how,
    };
    let path = attempt_dir.join(DISK_FILE);
    write_json(&path, &file).map_err(|e| io_error(&path)(std::io::Error::other(e)))?;
    let dir = volume_dir(attempt_dir);
    std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    if how == Enforcement::Watch || image::is_mountpoint(&dir) {
        return Ok(());
    }
    let img = attempt_dir.join(IMAGE_FILE);
    // The directory may hold files from before the volume (never, unless a restart cut
    // a preparation short): the job's files must all be inside the cap.
    for entry in std::fs::read_dir(&dir).map_err(io_error(&dir))? {
        let p = entry.map_err(io_error(&dir))?.path();
        let gone = match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            _ => std::fs::remove_file(&p),
        };
        gone.map_err(io_error(&p))?;
    }
    image::make(&img, cap_bytes)?;
    image::mount(&img, &dir)
}

/// After an agent restart: mounts again the image of an attempt taken back whose volume
/// is not mounted (the server rebooted). Returns its `disk.json`, if it has one.
pub fn reattach(attempt_dir: &Path) -> Result<Option<DiskFile>, DiskError> {
    let Some(file) = DiskFile::read(attempt_dir) else {
        return Ok(None);
    };
    let dir = volume_dir(attempt_dir);
    let img = attempt_dir.join(IMAGE_FILE);
    if file.enforced_by == Enforcement::Image && img.exists() && !image::is_mountpoint(&dir) {
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        image::mount(&img, &dir)?;
    }
    Ok(Some(file))
}

/// Unmounts the attempt's volume, if mounted (the image goes with the directory).
pub fn release(attempt_dir: &Path) -> Result<(), DiskError> {
    let dir = volume_dir(attempt_dir);
    if image::is_mountpoint(&dir) {
        image::unmount(&dir)?;
    }
    Ok(())
}

/// Releases every attempt's volume below `state_dir` (a test's state dir before it is
/// deleted; an agent that gives up a server). Errors are logged, not returned.
pub fn release_all(state_dir: &Path) {
    let root = state_dir.join(crate::store::ATTEMPTS_DIR);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for e in entries.flatten() {
        if let Err(err) = release(&e.path()) {
            tracing::error!("releasing the volume of {}: {err}", e.path().display());
        }
    }
}

/// Free and total bytes of the file system holding `path` (for unprivileged users).
pub fn free_space(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((
        (st.f_bavail as u64).saturating_mul(frsize),
        (st.f_blocks as u64).saturating_mul(frsize),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_the_jobs_ask_within_the_nodes_largest() {
        let p = DiskPolicy {
            max_job_gb: 50,
            ..Default::default()
        };
        assert_eq!(p.cap_for(Some(10)), (10 * GIB, false));
        assert_eq!(p.cap_for(None), (50 * GIB, false));
        assert_eq!(p.cap_for(Some(80)), (50 * GIB, true));
        assert_eq!(
            p.enforcement(),
            Enforcement::Watch,
            "no mounts unless asked"
        );
        assert_eq!("auto".parse::<CapMode>(), Ok(CapMode::Auto));
        assert!("xfs"
            .parse::<CapMode>()
            .unwrap_err()
            .contains("auto, image or watch"));
    }

    #[test]
    fn a_watched_volume_is_a_plain_directory_with_its_disk_json() {
        let tmp = tempfile::tempdir().unwrap();
        prepare(tmp.path(), 5 * GIB, Enforcement::Watch).unwrap();
        assert!(volume_dir(tmp.path()).is_dir());
        assert!(!image::is_mountpoint(&volume_dir(tmp.path())));
        let f = reattach(tmp.path()).unwrap().unwrap();
        assert_eq!(f.cap_bytes, 5 * GIB);
        release(tmp.path()).unwrap();
        let (free, total) = free_space(tmp.path()).unwrap();
        assert!(total >= free && total > 0);
        assert!(free_space(&tmp.path().join("missing")).is_err());
    }
}
