//! A dataset's archive: downloaded from its HTTPS address and checked against the
//! SHA-256 its lab published ([`fetch`]), then unpacked into the cache ([`unpack`]).
//!
//! Invariants:
//! - The download streams to a file as it arrives, hashed on the way, bounded by a cap;
//!   it is handed on only when its SHA-256 is the one published. A failed download
//!   leaves no file behind.
//! - Only `https` (plain `http` only where a test asks for it), trusting the usual roots
//!   and the agent's `--dataset-ca`; redirects stay on `https`. Errors show the address
//!   without its query (a signed address's token stays out of job logs).
//! - Unpacking writes only regular files, directories and symlinks that stay inside
//!   the target, never through a symlink, at most `cap` bytes and
//!   [`MAX_ENTRIES`] entries, counted as they arrive; what it writes is read-only.

use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// How many times a transient failure (no connection, a 5xx, a download cut off) is
/// tried again.
pub const RETRIES: u32 = 4;
/// The most entries an archive may hold.
pub const MAX_ENTRIES: u64 = 1_000_000;

#[cfg(not(test))]
const FIRST_WAIT: Duration = Duration::from_secs(1);
#[cfg(test)]
const FIRST_WAIT: Duration = Duration::from_millis(20);

/// Downloads `url` (https only) into a new file in `work`, which it returns; its SHA-256
/// must equal `sha256` (hex). `extra_roots`: PEM CA certificates trusted besides the usual
/// roots. `cap` bounds the download.
pub async fn fetch(
    url: &str,
    sha256: &str,
    extra_roots: Option<&[u8]>,
    work: &Path,
    cap: u64,
) -> Result<PathBuf, String> {
    fetch_with(url, sha256, extra_roots, work, cap, false).await
}

/// [`fetch`], allowing plain `http` when `allow_http` (for tests).
pub async fn fetch_with(
    url: &str,
    sha256: &str,
    extra_roots: Option<&[u8]>,
    work: &Path,
    cap: u64,
    allow_http: bool,
) -> Result<PathBuf, String> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| format!("dataset archive {url:?} is not a web address: {e}"))?;
    let shown = shown(&parsed);
    match parsed.scheme() {
        "https" => {}
        "http" if allow_http => {}
        _ => {
            return Err(format!(
                "dataset archive {shown}: only https addresses are allowed"
            ))
        }
    }
    let want = sha256.to_ascii_lowercase();
    if want.len() != 64 || !want.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "dataset archive {shown}: {sha256:?} is not a SHA-256 in hex"
        ));
    }
    let client =
        client(extra_roots, allow_http).map_err(|e| format!("dataset archive {shown}: {e}"))?;
    let mut tried = 0;
    loop {
        tried += 1;
        match download(&client, &parsed, &want, work, cap).await {
            Ok(path) => return Ok(path),
            Err(Failed::Final(why)) => return Err(format!("dataset archive {shown}: {why}")),
            Err(Failed::Again(why)) if tried <= RETRIES => {
                tracing::warn!(
                    url = shown,
                    tried,
                    "dataset archive download failed, trying again: {why}"
                );
                tokio::time::sleep(FIRST_WAIT * 2u32.pow(tried - 1)).await;
            }
            Err(Failed::Again(why)) => {
                return Err(format!(
                    "dataset archive {shown}: {why} (tried {tried} times)"
                ))
            }
        }
    }
}

enum Failed {
    /// Trying again may help.
    Again(String),
    Final(String),
}

/// The address as errors show it: without user, password, query or fragment.
fn shown(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

fn client(extra_roots: Option<&[u8]>, allow_http: bool) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .https_only(!allow_http);
    if let Some(pem) = extra_roots {
        let roots = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("the dataset CA file is not PEM certificates: {e}"))?;
        if roots.is_empty() {
            return Err("the dataset CA file holds no certificate".into());
        }
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
    }
    builder
        .build()
        .map_err(|e| format!("no HTTPS client: {}", chain(&e)))
}

/// An error with its causes, which say what actually went wrong.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Removes a download that did not finish.
struct Part {
    path: PathBuf,
    done: bool,
}

impl Drop for Part {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

async fn download(
    client: &reqwest::Client,
    url: &reqwest::Url,
    want: &str,
    work: &Path,
    cap: u64,
) -> Result<PathBuf, Failed> {
    use futures_util::StreamExt;
    let resp = client.get(url.clone()).send().await.map_err(|e| {
        let why = chain(&e);
        // A certificate the server shows that is not trusted will not change.
        if why.contains("certificate") {
            Failed::Final(format!("cannot connect: {why}"))
        } else {
            Failed::Again(format!("cannot connect: {why}"))
        }
    })?;
    let status = resp.status();
    if status.is_server_error() || matches!(status.as_u16(), 408 | 429) {
        return Err(Failed::Again(format!("the server answered {status}")));
    }
    if !status.is_success() {
        return Err(Failed::Final(format!("the server answered {status}")));
    }
    let too_big = || format!("it is larger than the {} allowed", super::size_text(cap));
    if resp.content_length().is_some_and(|n| n > cap) {
        return Err(Failed::Final(too_big()));
    }
    let local = |e: io::Error| Failed::Final(format!("cannot write it to {}: {e}", work.display()));
    let path = work.join(format!("archive-{:016x}.part", rand::random::<u64>()));
    let mut file = tokio::fs::File::create(&path).await.map_err(local)?;
    let mut part = Part { path, done: false };
    let mut hash = Sha256::new();
    let mut got = 0u64;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk
            .map_err(|e| Failed::Again(format!("cut off after {got} bytes: {}", chain(&e))))?;
        got += chunk.len() as u64;
        if got > cap {
            return Err(Failed::Final(too_big()));
        }
        hash.update(&chunk);
        file.write_all(&chunk).await.map_err(local)?;
    }
    file.flush().await.map_err(local)?;
    let have = hex::encode(hash.finalize());
    if have != want {
        return Err(Failed::Final(format!(
            "its SHA-256 is {have}, not {want} as published (a changed or damaged archive)"
        )));
    }
    part.done = true;
    Ok(part.path.clone())
}

/// Unpacks a `.tar.gz`, `.tgz` or `.tar` (told apart by their first bytes) into `into`,
/// at most `cap` bytes of files; returns the bytes unpacked. Runs on a blocking thread.
pub async fn unpack(archive: &Path, into: &Path, cap: u64) -> Result<u64, String> {
    let (archive, into) = (archive.to_path_buf(), into.to_path_buf());
    tokio::task::spawn_blocking(move || unpack_now(&archive, &into, cap))
        .await
        .map_err(|e| format!("unpacking the dataset stopped: {e}"))?
}

/// [`unpack`] on this thread.
pub fn unpack_now(archive: &Path, into: &Path, cap: u64) -> Result<u64, String> {
    let open = |e: io::Error| format!("cannot read the dataset archive: {e}");
    let mut file = File::open(archive).map_err(open)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(open)?;
    file.rewind().map_err(open)?;
    let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    std::fs::create_dir_all(into).map_err(|e| format!("cannot make {}: {e}", into.display()))?;
    let mut unpacked = Unpacked {
        into,
        cap,
        bytes: 0,
    };
    let damaged =
        |e: io::Error| format!("the dataset archive is damaged or not a .tar.gz or .tar: {e}");
    let mut tar = tar::Archive::new(reader);
    let mut count = 0u64;
    for entry in tar.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(format!(
                "the dataset archive has more than {MAX_ENTRIES} entries"
            ));
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        unpacked
            .entry(&mut entry)
            .map_err(|why| format!("dataset archive entry {name}: {why}"))?;
    }
    read_only(into).map_err(|e| format!("cannot make the dataset read-only: {e}"))?;
    Ok(unpacked.bytes)
}

struct Unpacked<'a> {
    into: &'a Path,
    cap: u64,
    bytes: u64,
}

impl Unpacked<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), String> {
        use tar::EntryType as T;
        let Some(rel) = inside(&entry.path_bytes())? else {
            return Ok(());
        };
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            return Ok(());
        }
        let dest = self.into.join(&rel);
        self.no_links_above(&rel)?;
        let io = |e: io::Error| e.to_string();
        match kind {
            T::Directory => match std::fs::symlink_metadata(&dest) {
                Ok(m) if m.is_dir() => Ok(()),
                Ok(_) => Err("already in the archive as a file or link".into()),
                Err(_) => std::fs::create_dir_all(&dest).map_err(io),
            },
            T::Regular | T::Continuous => {
                self.make_parent(&dest)?;
                self.file(entry, &dest)
            }
            T::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or("a symlink without a target")?
                    .into_owned();
                link_stays_inside(&rel, &target)?;
                self.make_parent(&dest)?;
                clear(&dest)?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &dest).map_err(io)
            }
            T::Link => Err("hard links are not allowed".into()),
            T::Char | T::Block => Err("device files are not allowed".into()),
            T::Fifo => Err("pipes are not allowed".into()),
            other => Err(format!("entries of type {other:?} are not allowed")),
        }
    }

    fn make_parent(&self, dest: &Path) -> Result<(), String> {
        match dest.parent() {
            Some(parent) => std::fs::create_dir_all(parent).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Refuses an entry whose way down passes a symlink: nothing is written through one.
    fn no_links_above(&self, rel: &Path) -> Result<(), String> {
        let mut at = self.into.to_path_buf();
        let mut parts = rel.components().peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                break;
            }
            at.push(part);
            if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(format!(
                    "it lies under {}, a symlink",
                    at.strip_prefix(self.into).unwrap_or(&at).display()
                ));
            }
        }
        Ok(())
    }

    fn file<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>, dest: &Path) -> Result<(), String> {
        let over = |cap| format!("the dataset unpacks to more than {}", super::size_text(cap));
        if self.bytes.saturating_add(entry.size()) > self.cap {
            return Err(over(self.cap));
        }
        clear(dest)?;
        let io = |e: io::Error| e.to_string();
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dest)
            .map_err(io)?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = entry.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            self.bytes += n as u64;
            if self.bytes > self.cap {
                return Err(over(self.cap));
            }
            out.write_all(&buf[..n]).map_err(io)?;
        }
        out.set_permissions(std::fs::Permissions::from_mode(0o444))
            .map_err(io)
    }
}

use std::os::unix::ffi::OsStrExt;

/// The entry's path relative to the target: `None` for the target itself (`.`);
/// refused when absolute or with `..`.
fn inside(raw: &[u8]) -> Result<Option<PathBuf>, String> {
    let path = Path::new(std::ffi::OsStr::from_bytes(raw));
    let mut rel = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Normal(p) => rel.push(p),
            Component::CurDir => {}
            Component::ParentDir => return Err("a path with .. is not allowed".into()),
            Component::RootDir | Component::Prefix(_) => {
                return Err("an absolute path is not allowed".into())
            }
        }
    }
    Ok((!rel.as_os_str().is_empty()).then_some(rel))
}

/// A symlink at `rel` may point only inside the target: relative, its `..` only
/// leading (so they climb real directories, never a link's target), and not above the
/// target once normalised.
fn link_stays_inside(rel: &Path, target: &[u8]) -> Result<(), String> {
    let out = || {
        format!(
            "a symlink to {} leads out of the dataset",
            String::from_utf8_lossy(target)
        )
    };
    let target = Path::new(std::ffi::OsStr::from_bytes(target));
    if target.as_os_str().is_empty() || target.is_absolute() {
        return Err(out());
    }
    let mut depth = rel.components().count() as i64 - 1;
    let mut descended = false;
    for part in target.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir if descended => return Err(out()),
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => {
                descended = true;
                depth += 1;
            }
            Component::RootDir | Component::Prefix(_) => return Err(out()),
        }
        if depth < 0 {
            return Err(out());
        }
    }
    Ok(())
}

/// Makes room for a file or link at `dest`: an earlier entry of the same name goes,
/// unless it is a directory.
fn clear(dest: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => Err("already in the archive as a directory".into()),
        Ok(_) => std::fs::remove_file(dest).map_err(|e| e.to_string()),
        Err(_) => Ok(()),
    }
}

/// Files 0444, directories 0555, links left as they are.
fn read_only(dir: &Path) -> io::Result<()> {
    for dirent in std::fs::read_dir(dir)? {
        let dirent = dirent?;
        let kind = dirent.file_type()?;
        if kind.is_dir() {
            read_only(&dirent.path())?;
        } else if kind.is_file() {
            std::fs::set_permissions(dirent.path(), std::fs::Permissions::from_mode(0o444))?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
}
