//! A job's volume as a file system image: a sparse file of the cap's size, formatted
//! ext4 (`mkfs.ext4`) and loop-mounted `nosuid,nodev` (`mount -o loop`) on the attempt's
//! `disk/` directory. A write past the cap fails with `ENOSPC` inside the job, and the
//! host's file system loses at most the cap, since the image can never hold more.
//!
//! Invariants:
//! - The loop device is attached by `mount -o loop`, which sets autoclear: unmounting
//!   detaches it, so an unmounted image holds no loop device. [`unmount`] falls back to
//!   a lazy unmount when the volume is busy (a shell of the owner's, a container not yet
//!   gone): the mount leaves the directory tree at once and the device goes with its
//!   last user, so a volume is never left mounted below a directory being deleted.
//! - The image is made sparse and formatted without zeroing its inode tables or journal
//!   (`lazy_*_init`, and mounted with `noinit_itable`): a fresh volume costs the host a
//!   few MiB, growing only with what the job writes.
//! - Tools are run without a shell, with absolute paths where `PATH` lacks `/sbin`
//!   (services often run with a short `PATH`).

use super::{io_error, DiskError};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Mount options of every volume: no set-id programs, no device files.
pub const MOUNT_OPTIONS: &str = "loop,nosuid,nodev,noinit_itable";

/// A program on `PATH`, or in the system directories a short `PATH` leaves out.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn run(name: &str, args: &[&std::ffi::OsStr]) -> Result<(), DiskError> {
    let program = tool(name).ok_or_else(|| DiskError::NoTool(name.to_string()))?;
    let out = Command::new(&program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(io_error(&program))?;
    if out.status.success() {
        return Ok(());
    }
    Err(DiskError::Tool {
        tool: name.to_string(),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Makes `image`, a sparse file of `bytes`, and formats it ext4 with no blocks reserved
/// for root (the agent unpacks restores as root, and must meet the same cap).
pub fn make(image: &Path, bytes: u64) -> Result<(), DiskError> {
    let io = io_error(image);
    let f = File::create(image).map_err(&io)?;
    f.set_len(bytes).map_err(&io)?;
    f.sync_all().map_err(&io)?;
    drop(f);
    run(
        "mkfs.ext4",
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            "nodiscard,lazy_itable_init=1,lazy_journal_init=1".as_ref(),
            "-L".as_ref(),
            "commons-job".as_ref(),
            image.as_os_str(),
        ],
    )
}

/// Mounts `image` on `dir` (see [`MOUNT_OPTIONS`]).
pub fn mount(image: &Path, dir: &Path) -> Result<(), DiskError> {
    run(
        "mount",
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            MOUNT_OPTIONS.as_ref(),
            image.as_os_str(),
            dir.as_os_str(),
        ],
    )
}

/// Unmounts `dir`; lazily when it is busy (see the module's invariants).
pub fn unmount(dir: &Path) -> Result<(), DiskError> {
    match run("umount", &[dir.as_os_str()]) {
        Ok(()) => Ok(()),
        Err(e) => {
            tracing::warn!("unmounting {}: {e}; detaching it lazily", dir.display());
            run("umount", &["-l".as_ref(), dir.as_os_str()])
        }
    }
}

/// Whether `dir` is a mount point: it sits on another device than its parent.
pub fn is_mountpoint(dir: &Path) -> bool {
    let (Ok(d), Some(Ok(p))) = (
        std::fs::symlink_metadata(dir),
        dir.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    d.is_dir() && d.dev() != p.dev()
}

/// Where the Docker Engine writes its pid.
const DOCKER_PID_FILES: [&str; 2] = ["/run/docker.pid", "/var/run/docker.pid"];

/// Whether the containers' engine sees the mounts this process makes: both are in the
/// same mount namespace. An agent started with `ip netns exec`, a systemd unit with
/// `PrivateMounts=`, or an agent in a container of its own would mount its volumes where
/// the engine never looks (it would bind the empty directory beneath). An engine whose
/// pid cannot be read is assumed to be the host's, as the agent is.
pub fn engine_sees_our_mounts() -> Result<(), String> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
    let mine =
        ns("self").map_err(|e| format!("cannot read this process's mount namespace: {e}"))?;
    for file in DOCKER_PID_FILES {
        let Ok(pid) = std::fs::read_to_string(file) else {
            continue;
        };
        if let Ok(theirs) = ns(pid.trim()) {
            return if theirs == mine {
                Ok(())
            } else {
                Err(format!(
                    "the agent's mount namespace ({}) is not the Docker Engine's ({}): \
                     volumes it mounts would not reach the containers",
                    mine.display(),
                    theirs.display()
                ))
            };
        }
    }
    Ok(())
}

/// Whether volumes can be made here: the engine must see this process's mounts, and a
/// small image is made, mounted, written, unmounted and removed in `state_dir`. An agent
/// that may not mount (not root, no loop devices, no `mkfs.ext4`) learns it at start,
/// not at a job's.
pub fn self_test(state_dir: &Path) -> Result<(), DiskError> {
    engine_sees_our_mounts().map_err(DiskError::Unseen)?;
    let dir = state_dir.join("disk-self-test");
    let image = state_dir.join("disk-self-test.img");
    if is_mountpoint(&dir) {
        unmount(&dir)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    let tried = make(&image, 16 << 20).and_then(|()| {
        mount(&image, &dir)?;
        let wrote = std::fs::write(dir.join("probe"), b"ok").map_err(io_error(&dir));
        unmount(&dir)?;
        wrote
    });
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_dir(&dir);
    tried
}
