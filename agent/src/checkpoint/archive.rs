//! The checkpoint archive: a tar stream compressed with zstd, made from a checkpoint
//! directory ([`pack`]) and unpacked into an empty one ([`unpack`]), both streamed
//! through files, never held in memory, and both held to the job's disk cap.
//!
//! [`pack`] walks the directory without following links (`walk`), so what the job put in
//! `/checkpoint` is all that leaves the host: directories, regular files (each exactly as
//! long as its header says, even if the job changes it meanwhile) and symbolic links
//! that stay inside the directory. Links that leave it, FIFOs, sockets and devices are
//! left out, so that every archive the agent makes can be restored. A file with holes is
//! archived sparse (GNU sparse entries, see `sparse`): its holes are never read.
//!
//! The cap: files count at their apparent size (a sparse file whole, as it would be
//! restored). [`pack`] adds the sizes up from `lstat` before it writes anything and
//! refuses a directory over the cap at once ([`ArchiveError::OverCap`]): a
//! `truncate -s 2T` costs a walk, not 2 TB of reading. [`unpack`] reads the archive's
//! headers through first and refuses one over the cap before it creates anything, then
//! counts again as it writes, so it never writes past the cap whatever the headers said.
//!
//! [`unpack`] trusts nothing in the archive (it came from a job, through the portal):
//! - every path is relative, without `..`; a symbolic link's target stays inside the
//!   directory (lexically) and is never followed here; a hard link points at a regular
//!   file already unpacked; devices, FIFOs and anything else refuse the whole archive;
//! - entries are created only below directories it made itself (no path passes through
//!   a link or a file), files with `O_CREAT | O_EXCL | O_NOFOLLOW`;
//! - file content is written with holes where it is zeros (a sparse file comes back
//!   sparse);
//! - permission bits are kept (set-id bits dropped), modification times too, and
//!   everything is given to the job's user (65534:65534).

use super::walk::{self, Kind};
use super::{sparse, JOB_GID, JOB_UID};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// zstd's default level: fast, and checkpoints are mostly numbers that compress little.
const LEVEL: i32 = 3;

#[derive(Debug, Error)]
pub enum ArchiveError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The archive holds something that is never restored.
    #[error("refused: {0}")]
    Refused(String),
    #[error("cancelled")]
    Cancelled,
    /// More than the cap (in words: how much, and the cap).
    #[error("{0}")]
    OverCap(String),
}

/// Bytes in binary units, as caps are given: "812 B", "3.4 MiB", "2.0 TiB".
pub fn binary(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn over_cap(what: &str, held: u64, cap: u64) -> ArchiveError {
    ArchiveError::OverCap(format!(
        "{what} {} (files count at their apparent size, sparse ones whole), over the \
         job's disk cap of {}",
        binary(held),
        binary(cap)
    ))
}

/// A finished archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    pub bytes: u64,
    /// SHA-256 of the archive, lowercase hex.
    pub sha256: String,
    /// Entries left out (links leaving the directory, FIFOs, sockets, devices).
    pub skipped: Vec<String>,
}

/// Archives `src` into `out` (written beside it as `<out>.tmp`, synced, then renamed).
/// Refuses a directory whose files add up to more than `cap` bytes (see the module's
/// docs) before writing anything, and stops if they grow past it meanwhile. `cancel`
/// stops it between entries. A refused or failed archive leaves no file behind.
pub fn pack(src: &Path, out: &Path, cap: u64, cancel: &AtomicBool) -> Result<Packed, ArchiveError> {
    let held = walk::usage(src)?.apparent;
    if held > cap {
        return Err(over_cap("/checkpoint holds", held, cap));
    }
    let mut tmp_name = out.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = out.with_file_name(tmp_name);
    let packed = pack_into(src, &tmp, cap, cancel);
    if packed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let packed = packed?;
    std::fs::rename(&tmp, out)?;
    if let Some(dir) = out.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(packed)
}

fn pack_into(
    src: &Path,
    tmp: &Path,
    cap: u64,
    cancel: &AtomicBool,
) -> Result<Packed, ArchiveError> {
    let file = File::create(tmp)?;
    let hashing = HashingWriter::new(BufWriter::new(file));
    let mut tar = tar::Builder::new(zstd::Encoder::new(hashing, LEVEL)?);
    let mut skipped = Vec::new();
    // Bytes archived so far; the job may grow its files while the walk runs.
    let mut taken = 0u64;
    let mut grew = false;
    walk::walk(src, &mut |item| {
        if cancel.load(Ordering::Relaxed) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        let mut h = tar::Header::new_gnu();
        h.set_uid(JOB_UID.into());
        h.set_gid(JOB_GID.into());
        match item.kind() {
            Kind::Dir => {
                header_from(&mut h, &item.meta, tar::EntryType::Directory, 0);
                tar.append_data(&mut h, item.rel, io::empty())
            }
            Kind::File => match item.open_file()? {
                Some((f, meta)) => {
                    let len = meta.size();
                    taken = taken.saturating_add(len);
                    if taken > cap {
                        grew = true;
                        return Err(io::Error::other("over the cap"));
                    }
                    header_from(&mut h, &meta, tar::EntryType::Regular, len);
                    append_file(&mut tar, &mut h, item.rel, f, len)
                }
                None => Ok(()),
            },
            Kind::Symlink => match item.link_target()? {
                Some(t) if link_stays_inside(item.rel, &t) => {
                    header_from(&mut h, &item.meta, tar::EntryType::Symlink, 0);
                    tar.append_link(&mut h, item.rel, t)
                }
                Some(t) => {
                    skipped.push(format!(
                        "{} (a link to {}, outside the directory)",
                        item.rel.display(),
                        t.display()
                    ));
                    Ok(())
                }
                None => Ok(()),
            },
            Kind::Other => {
                skipped.push(format!(
                    "{} (not a file, directory or link)",
                    item.rel.display()
                ));
                Ok(())
            }
        }
    })
    .map_err(|e| match e.kind() {
        _ if grew => over_cap(
            "/checkpoint grew while it was archived, to at least",
            taken,
            cap,
        ),
        io::ErrorKind::Interrupted => ArchiveError::Cancelled,
        _ => ArchiveError::Io(e),
    })?;
    let hashing = tar.into_inner()?.finish()?;
    let (file, bytes, sha256) = hashing.finish()?;
    file.sync_all()?;
    Ok(Packed {
        bytes,
        sha256,
        skipped,
    })
}

/// Appends a file's `len` bytes: whole when it is dense, else as a GNU sparse entry that
/// holds its data regions only.
fn append_file<W: io::Write>(
    tar: &mut tar::Builder<W>,
    h: &mut tar::Header,
    rel: &Path,
    f: File,
    len: u64,
) -> io::Result<()> {
    let regions = sparse::data_regions(&f, len)?;
    if len == 0 || sparse::is_dense(&regions, len) {
        tar.append_data(h, rel, Exact::new(f, len))
    } else {
        let ext = sparse::header(h, len, &regions)?;
        let data = io::Cursor::new(ext).chain(sparse::Regions::new(f, regions));
        tar.append_data(h, rel, data)
    }
}

fn header_from(h: &mut tar::Header, m: &std::fs::Metadata, t: tar::EntryType, size: u64) {
    h.set_entry_type(t);
    h.set_mode(m.mode() & 0o7777);
    h.set_mtime(u64::try_from(m.mtime()).unwrap_or(0));
    h.set_size(size);
}

/// Whether a symbolic link at `link` (relative to the directory) with `target` stays
/// inside the directory, read lexically: relative, and never above the top.
pub fn link_stays_inside(link: &Path, target: &Path) -> bool {
    let mut depth = link.parent().map_or(0, |p| p.components().count());
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir if depth > 0 => depth -= 1,
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// A path from an archive as a relative path with only normal components.
fn clean(p: &Path) -> Result<PathBuf, ArchiveError> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(ArchiveError::Refused(format!(
                    "{} climbs out with ..",
                    p.display()
                )))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ArchiveError::Refused(format!(
                    "{} is an absolute path",
                    p.display()
                )))
            }
        }
    }
    Ok(out)
}

/// What [`unpack`] made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

/// The bytes of file content an archive claims (files at their apparent size), from its
/// headers alone; the content is decompressed and skipped, never written.
pub fn claimed(archive: &Path) -> Result<u64, ArchiveError> {
    let mut ar = tar::Archive::new(zstd::Decoder::new(File::open(archive)?)?);
    let mut total = 0u64;
    for entry in ar.entries()? {
        let e = entry?;
        if is_file(e.header().entry_type()) {
            total = total.saturating_add(e.size());
        }
    }
    Ok(total)
}

fn is_file(t: tar::EntryType) -> bool {
    matches!(
        t,
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
    )
}

/// Unpacks the archive at `archive` into `dest`, an empty directory (see the module's
/// rules), refusing one whose files add up to more than `cap` bytes before it creates
/// anything, and never writing more than `cap` bytes of content. On an error `dest` holds
/// part of the archive: the caller discards it.
pub fn unpack(archive: &Path, dest: &Path, cap: u64) -> Result<Unpacked, ArchiveError> {
    let claimed = claimed(archive)?;
    if claimed > cap {
        return Err(over_cap("the checkpoint holds", claimed, cap));
    }
    let mut ar = tar::Archive::new(zstd::Decoder::new(File::open(archive)?)?);
    let mut done = Unpacked::default();
    // Directories get their mode and time last: their content changes them.
    let mut dirs: Vec<(PathBuf, u32, u64)> = Vec::new();
    for entry in ar.entries()? {
        let mut e = entry?;
        let rel = clean(&e.path()?)?;
        let kind = e.header().entry_type();
        let mode = e.header().mode()?;
        let mtime = e.header().mtime()?;
        if rel.as_os_str().is_empty() {
            if kind.is_dir() {
                continue;
            }
            return Err(ArchiveError::Refused("an entry without a name".into()));
        }
        parents(dest, &rel)?;
        let at = dest.join(&rel);
        let exists = std::fs::symlink_metadata(&at).ok();
        let taken = || ArchiveError::Refused(format!("{} is in the archive twice", rel.display()));
        match kind {
            t if is_file(t) => {
                if exists.is_some() {
                    return Err(taken());
                }
                // Counted again as written: the first pass is no promise about this one.
                let len = e.size();
                if done.bytes.saturating_add(len) > cap {
                    return Err(over_cap(
                        "the checkpoint holds at least",
                        done.bytes.saturating_add(len),
                        cap,
                    ));
                }
                done.bytes += unpack_file(&mut e, &at, len, mode, mtime)?;
            }
            tar::EntryType::Directory => match exists {
                Some(m) if m.is_dir() => dirs.push((at, mode, mtime)),
                Some(_) => return Err(taken()),
                None => {
                    std::fs::create_dir(&at)?;
                    dirs.push((at, mode, mtime));
                }
            },
            tar::EntryType::Symlink | tar::EntryType::Link => {
                unpack_link(&e, dest, &rel, &at, exists.is_some())?
            }
            tar::EntryType::XHeader
            | tar::EntryType::XGlobalHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => continue,
            other => {
                return Err(ArchiveError::Refused(format!(
                    "{} is a {other:?} entry (only files, directories and links are restored)",
                    rel.display()
                )))
            }
        }
        done.entries += 1;
    }
    settle_dirs(dirs)?;
    Ok(done)
}

/// Gives the unpacked directories their modes, times and the job's owner, deepest first.
fn settle_dirs(dirs: Vec<(PathBuf, u32, u64)>) -> Result<(), ArchiveError> {
    for (dir, mode, mtime) in dirs.into_iter().rev() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode & 0o1777))?;
        File::open(&dir)?.set_modified(time(mtime))?;
        give(&dir)?;
    }
    Ok(())
}

/// Makes a link entry at `at`: a symbolic link that stays inside the checkpoint, or a
/// hard link to a file unpacked before it; refused when its target is not one of those,
/// then when something is at `at` already (`taken`).
fn unpack_link<R: Read>(
    e: &tar::Entry<'_, R>,
    dest: &Path,
    rel: &Path,
    at: &Path,
    taken: bool,
) -> Result<(), ArchiveError> {
    let twice = || ArchiveError::Refused(format!("{} is in the archive twice", rel.display()));
    let target = link_target(e, rel)?;
    if e.header().entry_type() == tar::EntryType::Symlink {
        if !link_stays_inside(rel, &target) {
            return Err(ArchiveError::Refused(format!(
                "{} links to {}, outside the checkpoint",
                rel.display(),
                target.display()
            )));
        }
        if taken {
            return Err(twice());
        }
        std::os::unix::fs::symlink(&target, at)?;
        give(at)?;
        return Ok(());
    }
    let target = clean(&target)?;
    parents(dest, &target)?;
    let from = dest.join(&target);
    if !std::fs::symlink_metadata(&from).is_ok_and(|m| m.is_file()) {
        return Err(ArchiveError::Refused(format!(
            "{} is a hard link to {}, which is not a file unpacked before it",
            rel.display(),
            target.display()
        )));
    }
    if taken {
        return Err(twice());
    }
    std::fs::hard_link(&from, at)?;
    Ok(())
}

/// Writes a file entry's `len` bytes to a new file at `at` (never through a link), sparse
/// where the content is zeros, then gives it the entry's mode and time and the job's
/// owner; returns the bytes of content written.
fn unpack_file<R: Read>(
    e: &mut tar::Entry<'_, R>,
    at: &Path,
    len: u64,
    mode: u32,
    mtime: u64,
) -> Result<u64, ArchiveError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(at)?;
    let written = sparse::write_sparse(&mut e.take(len), &f)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
    f.set_modified(time(mtime))?;
    give(at)?;
    Ok(written)
}

/// The target a link entry names.
fn link_target<R: Read>(e: &tar::Entry<'_, R>, rel: &Path) -> Result<PathBuf, ArchiveError> {
    let target = e.link_name()?.ok_or_else(|| {
        ArchiveError::Refused(format!("{}: a link without a target", rel.display()))
    })?;
    Ok(target.into_owned())
}

fn time(mtime: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(mtime)
}

/// Makes `rel`'s parent directories below `dest`, refusing a path through anything that
/// is not a real directory.
fn parents(dest: &Path, rel: &Path) -> Result<(), ArchiveError> {
    let mut at = dest.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for c in parent.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ArchiveError::Refused(format!(
                    "{} passes through {}, which is not a directory",
                    rel.display(),
                    at.strip_prefix(dest).unwrap_or(&at).display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&at)?;
                give(&at)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Gives a path (never a link's target) to the job's user; an agent that may not
/// (not root) leaves it as it is.
fn give(path: &Path) -> io::Result<()> {
    match std::os::unix::fs::lchown(path, Some(JOB_UID), Some(JOB_GID)) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
        other => other,
    }
}

/// Reads exactly `len` bytes: a file that shrank meanwhile is padded with zeros, one that
/// grew is cut, so the archive always matches its headers.
struct Exact<R> {
    inner: io::Take<R>,
    left: u64,
}

impl<R: Read> Exact<R> {
    fn new(inner: R, len: u64) -> Self {
        Self {
            inner: inner.take(len),
            left: len,
        }
    }
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let mut n = self.inner.read(buf)?;
        if n == 0 {
            n = buf
                .len()
                .min(usize::try_from(self.left).unwrap_or(usize::MAX));
            buf[..n].fill(0);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Counts and hashes what passes through.
pub(crate) struct HashingWriter<W> {
    inner: W,
    sha: Sha256,
    bytes: u64,
}

impl<W> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            sha: Sha256::new(),
            bytes: 0,
        }
    }
}

impl HashingWriter<BufWriter<File>> {
    /// Flushes; returns the file, the byte count and the SHA-256 in hex.
    fn finish(self) -> io::Result<(File, u64, String)> {
        let file = self.inner.into_inner().map_err(|e| e.into_error())?;
        Ok((file, self.bytes, hex::encode(self.sha.finalize())))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
