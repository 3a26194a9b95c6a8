//! The one way the agent writes a state file (its credential, the attempts' files, the
//! fake GPUs' settings): whole, and durably.
//!
//! 1. Write the bytes to `<name>.tmp` in the file's own directory (a rename is atomic only
//!    within one file system), made afresh with the mode asked for.
//! 2. Sync that file, so its bytes are on disk before any name points at them.
//! 3. Rename it over the file.
//! 4. Sync the directory, so the rename itself survives a crash of the machine.
//!
//! Invariants: a reader sees the old content or the new, never a mix or an empty file;
//! the file has the mode asked for (less the umask), never one an earlier file or a
//! leftover temporary file had; a failed write leaves no temporary file behind.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Readable by the agent's user only: secrets (the node credential).
pub const PRIVATE: u32 = 0o600;
/// What `File::create` gives, less the umask: the attempts' files and settings.
pub const PLAIN: u32 = 0o666;

/// Writes `bytes` to `path` as the module says, creating its directory when needed.
pub fn write(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)?;
    let tmp = temp_path(path);
    if let Err(e) = write_synced(&tmp, bytes, mode).and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::File::open(dir)?.sync_all()
}

/// `<path>.tmp`: one name per file, so a write interrupted by a crash leaves at most one
/// leftover, which the next write replaces.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".tmp");
    PathBuf::from(name)
}

fn write_synced(tmp: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    // A leftover keeps its own mode when opened again: made anew, the file gets `mode`.
    match fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub").join("state.json");
        write(&p, b"old", PLAIN).unwrap();
        let before = fs::metadata(&p).unwrap();
        write(&p, b"new", PLAIN).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(names(&d.path().join("sub")), ["state.json"]);
        use std::os::unix::fs::MetadataExt;
        assert_ne!(
            fs::metadata(&p).unwrap().ino(),
            before.ino(),
            "a new file renamed over the old one, never the old one rewritten in place"
        );
    }

    #[test]
    fn a_private_file_stays_private_whatever_was_there_before() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node.json");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        // A leftover of a crashed write, readable by others.
        fs::write(temp_path(&p), b"leftover").unwrap();
        fs::set_permissions(temp_path(&p), fs::Permissions::from_mode(0o644)).unwrap();
        write(&p, b"secret", PRIVATE).unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(fs::read(&p).unwrap(), b"secret");
        assert_eq!(names(d.path()), ["node.json"]);
        write(&p, b"secret2", PRIVATE).unwrap();
        assert_eq!(mode(&p), 0o600, "kept over a rewrite");
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("result.json");
        write(&p, b"kept", PLAIN).unwrap();
        // Renaming a file over a non-empty directory fails.
        let blocked = d.path().join("dir");
        fs::create_dir_all(blocked.join("inside")).unwrap();
        assert!(write(&blocked, b"x", PLAIN).is_err());
        assert_eq!(fs::read(&p).unwrap(), b"kept");
        assert_eq!(names(d.path()), ["dir", "result.json"]);
    }
}
