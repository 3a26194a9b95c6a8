//! Walking a checkpoint directory that the job controls, without ever following a link.
//!
//! The agent runs as root and the job may change its directory at any moment, so a path
//! checked and then opened could lead anywhere on the host (a directory swapped for a
//! symbolic link in between). So every directory is opened once (`O_DIRECTORY |
//! O_NOFOLLOW`) and its entries are named relative to that open directory, through
//! `/proc/self/fd/<fd>/<name>`: the kernel resolves the directory from the descriptor,
//! not from a path, and only the last component is looked up, never followed.
//!
//! Invariants: a symbolic link is reported as one, never entered or opened; a file is
//! opened with `O_NOFOLLOW | O_NONBLOCK` and used only when the open descriptor is a
//! regular file; entries are visited in name order, a directory before its content; an
//! entry removed while the walk runs is skipped, not an error.

use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Directories nested deeper than this are refused (each level holds a descriptor).
pub const MAX_DEPTH: usize = 128;

/// What an entry is (from `lstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// FIFOs, sockets, devices: never archived.
    Other,
}

/// One entry met on the walk.
pub struct Item<'a> {
    /// The path below the walked directory.
    pub rel: &'a Path,
    /// Its `lstat`.
    pub meta: Metadata,
    /// `/proc/self/fd/<dir fd>/<name>`: valid while the visitor runs.
    at: PathBuf,
}

impl Item<'_> {
    pub fn kind(&self) -> Kind {
        let t = self.meta.file_type();
        if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else if t.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        }
    }

    /// Opens the file without following a link; `None` when it is gone or no longer a
    /// regular file (the job replaced it meanwhile). The metadata is the open file's.
    pub fn open_file(&self) -> io::Result<Option<(File, Metadata)>> {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&self.at);
        let f = match opened {
            Ok(f) => f,
            Err(e) if vanished(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = f.metadata()?;
        Ok(meta.is_file().then_some((f, meta)))
    }

    /// A symbolic link's target, as written (never resolved).
    pub fn link_target(&self) -> io::Result<Option<PathBuf>> {
        match std::fs::read_link(&self.at) {
            Ok(t) => Ok(Some(t)),
            Err(e) if vanished(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The entry went away or changed kind between listing and use.
fn vanished(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR | libc::EINVAL)
    )
}

fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

/// Visits every entry below `root` (not `root` itself). A missing `root` has none.
pub fn walk(root: &Path, visit: &mut dyn FnMut(&Item<'_>) -> io::Result<()>) -> io::Result<()> {
    let dir = match open_dir(root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    walk_dir(&dir, Path::new(""), 0, visit)
}

fn walk_dir(
    dir: &File,
    rel: &Path,
    depth: usize,
    visit: &mut dyn FnMut(&Item<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let base = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let mut names: Vec<OsString> = std::fs::read_dir(&base)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let at = base.join(&name);
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if vanished(&e) => continue,
            Err(e) => return Err(e),
        };
        let child_rel = rel.join(&name);
        let item = Item {
            rel: &child_rel,
            meta,
            at,
        };
        visit(&item)?;
        if item.kind() == Kind::Dir {
            if depth + 1 >= MAX_DEPTH {
                return Err(io::Error::other(format!(
                    "{} is nested deeper than {MAX_DEPTH} directories",
                    child_rel.display()
                )));
            }
            let child = match open_dir(&item.at) {
                Ok(c) => c,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(e),
            };
            walk_dir(&child, &child_rel, depth + 1, visit)?;
        }
    }
    Ok(())
}

/// What a directory holds, as a cap counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The regular files' apparent sizes (a sparse file counts whole, as it would be
    /// archived and restored): what a checkpoint archive carries.
    pub apparent: u64,
    /// Every entry's space on disk, or a file's apparent size when that is larger: what
    /// a watcher holds against the cap (directories and many small files cost blocks).
    pub charged: u64,
}

/// The [`Usage`] of everything below `root`, from `lstat` alone (nothing is read).
pub fn usage(root: &Path) -> io::Result<Usage> {
    let mut u = Usage::default();
    walk(root, &mut |item| {
        let m = &item.meta;
        let size = if item.kind() == Kind::File {
            m.size()
        } else {
            0
        };
        u.apparent = u.apparent.saturating_add(size);
        u.charged = u
            .charged
            .saturating_add(size.max(m.blocks().saturating_mul(512)));
        Ok(())
    })?;
    Ok(u)
}

/// A digest of what `root` holds: every entry's path, kind, mode, size, link target, and
/// modification and change times. Equal fingerprints mean nothing was written in between
/// (as far as the file system tells). `None` when `root` is missing or empty.
pub fn fingerprint(root: &Path) -> io::Result<Option<String>> {
    use std::os::unix::ffi::OsStrExt;
    let mut h = Sha256::new();
    let mut entries = 0u64;
    walk(root, &mut |item| {
        entries += 1;
        let m = &item.meta;
        h.update(item.rel.as_os_str().as_bytes());
        h.update([0, kind_byte(item.kind())]);
        for n in [m.mode() as i64, m.size() as i64, m.mtime(), m.mtime_nsec()] {
            h.update(n.to_le_bytes());
        }
        for n in [m.ctime(), m.ctime_nsec()] {
            h.update(n.to_le_bytes());
        }
        if item.kind() == Kind::Symlink {
            if let Some(t) = item.link_target()? {
                h.update(t.as_os_str().as_bytes());
            }
        }
        h.update([0]);
        Ok(())
    })?;
    Ok((entries > 0).then(|| hex::encode(h.finalize())))
}

fn kind_byte(k: Kind) -> u8 {
    match k {
        Kind::Dir => b'd',
        Kind::File => b'f',
        Kind::Symlink => b'l',
        Kind::Other => b'o',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_reported_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "host file").unwrap();
        std::fs::write(root.join("sub/a"), "a").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), root.join("s")).unwrap();
        let mut seen = Vec::new();
        walk(&root, &mut |item| {
            let opened = item.open_file()?.is_some();
            seen.push((item.rel.display().to_string(), item.kind(), opened));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                ("escape".into(), Kind::Symlink, false),
                ("s".into(), Kind::Symlink, false),
                ("sub".into(), Kind::Dir, false),
                ("sub/a".into(), Kind::File, true),
            ]
        );
    }

    #[test]
    fn usage_counts_sparse_files_whole_without_reading_them() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/a"), "12345").unwrap();
        File::create(root.join("huge"))
            .unwrap()
            .set_len(2 << 40)
            .unwrap();
        let t = std::time::Instant::now();
        let u = usage(&root).unwrap();
        assert_eq!(u.apparent, (2 << 40) + 5);
        assert!(u.charged >= u.apparent, "{u:?}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            usage(&tmp.path().join("missing")).unwrap(),
            Usage::default()
        );
    }

    #[test]
    fn the_fingerprint_changes_with_content_and_is_none_when_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        assert_eq!(fingerprint(&root).unwrap(), None, "missing");
        std::fs::create_dir(&root).unwrap();
        assert_eq!(fingerprint(&root).unwrap(), None, "empty");
        std::fs::write(root.join("a"), "1").unwrap();
        let one = fingerprint(&root).unwrap().unwrap();
        assert_eq!(fingerprint(&root).unwrap().unwrap(), one, "stable");
        std::fs::write(root.join("a.tmp"), "22").unwrap();
        std::fs::rename(root.join("a.tmp"), root.join("a")).unwrap();
        assert_ne!(fingerprint(&root).unwrap().unwrap(), one, "replaced");
    }
}
