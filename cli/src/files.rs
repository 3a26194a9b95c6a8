//! Files in the campus store: `commons cp` (upload, download), `commons files ls`,
//! `commons files rm`, and `commons get` (a job's outputs). `files:PATH` names your own space, `lab:SLUG/PATH` a lab's; in
//! `ls` and `rm` a bare PATH is your own.
//!
//! Invariants:
//! - Transfers stream: a file is read (or written) a buffer at a time, never held whole.
//! - A file over one part (8 MiB) goes up in parts (`crate::parts`): a lost part is sent
//!   again, and an interrupted copy run again resumes its upload.
//! - Every transfer is checked end to end: an upload's SHA-256, computed as it is read,
//!   must be what the portal stored; a download's, as it is written, what the portal
//!   sends in `x-commons-sha256`. A download is written beside its target and renamed
//!   into place only once it checks, so a cut-off download never leaves half a file.
//! - Paths are checked by the portal's own rules before anything is sent, and the paths
//!   of a listing before a download joins them to a local folder.

use crate::args::{CpArgs, FilesCommand, GetArgs};
use crate::client::Client;
use crate::error::{CliError, Result};
use crate::output::{self, Cell};
use commons_api::files::{
    check_path, check_prefix, encode_path, human_bytes, parse_ref, FileEntry, Space,
};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A place in a file space.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Remote {
    lab: Option<String>,
    path: String,
}

impl Remote {
    /// `files:PATH` or `lab:SLUG/PATH`; `None` for anything else (a local path).
    fn parse(field: &str, s: &str) -> Result<Option<Remote>> {
        if let Some(p) = s.strip_prefix("files:") {
            return Ok(Some(Remote {
                lab: None,
                path: p.to_string(),
            }));
        }
        if s.starts_with("lab:") {
            return Ok(Some(Remote::parse_or_mine(field, s)?));
        }
        Ok(None)
    }

    /// As [`Remote::parse`], a bare PATH being one's own.
    fn parse_or_mine(field: &str, s: &str) -> Result<Remote> {
        let s = s.strip_prefix("files:").unwrap_or(s);
        let (space, path) = parse_ref(field, s)?;
        Ok(Remote {
            lab: match space {
                Space::Mine => None,
                Space::Lab(slug) => Some(slug),
            },
            path: path.to_string(),
        })
    }

    fn api(&self) -> String {
        match &self.lab {
            Some(l) => format!("/api/v1/labs/{l}/files"),
            None => "/api/v1/files".into(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{}", self.api(), encode_path(path))
    }

    /// How a path of this space is written: `files:PATH`, `lab:SLUG/PATH`.
    fn show(&self, path: &str) -> String {
        match &self.lab {
            Some(l) => format!("lab:{l}/{path}"),
            None => format!("files:{path}"),
        }
    }

    /// The path as a folder: empty, or ending in '/'.
    fn folder(&self) -> String {
        if self.path.is_empty() || self.path.ends_with('/') {
            self.path.clone()
        } else {
            format!("{}/", self.path)
        }
    }
}

/// `commons cp SRC... DEST`.
pub fn cp(a: CpArgs) -> Result<u8> {
    let Some((dest, srcs)) = a.paths.split_last() else {
        return Err(CliError::Usage(
            "cp needs a source and a destination".into(),
        ));
    };
    let client = Client::signed_in()?;
    if let Some(to) = Remote::parse("destination", dest)? {
        for s in srcs {
            if Remote::parse("source", s)?.is_some() {
                return Err(CliError::Usage(format!(
                    "{s} and {dest} are both in the file store: cp copies between this \
                     computer and the store (download, then upload)"
                )));
            }
        }
        for (local, path) in plan_uploads(srcs, &to, a.recursive)? {
            upload(&client, &local, &to, &path)?;
        }
        return Ok(0);
    }
    let [src] = srcs else {
        return Err(CliError::Usage(format!(
            "{dest} is a local path, so cp downloads: name one files:PATH or lab:SLUG/PATH to \
             download, or make the destination files:PATH to upload"
        )));
    };
    let Some(from) = Remote::parse("source", src)? else {
        return Err(CliError::Usage(format!(
            "neither {src} nor {dest} is in the file store: write files:PATH or lab:SLUG/PATH"
        )));
    };
    download_all(&client, &from, Path::new(dest), a.recursive)?;
    Ok(0)
}

/// Which local file goes to which path.
fn plan_uploads(srcs: &[String], to: &Remote, recursive: bool) -> Result<Vec<(PathBuf, String)>> {
    let mut plan = Vec::new();
    let into_folder = srcs.len() > 1 || to.path.is_empty() || to.path.ends_with('/');
    for s in srcs {
        let local = PathBuf::from(s);
        let meta = std::fs::metadata(&local)
            .map_err(|e| CliError::Usage(format!("cannot read {s}: {e}")))?;
        let name = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| CliError::Usage(format!("{s} names no file")))?;
        if meta.is_dir() {
            if !recursive {
                return Err(CliError::Usage(format!(
                    "{s} is a folder: use -r to copy it with everything in it"
                )));
            }
            let mut found = Vec::new();
            walk(&local, &mut found)?;
            for (file, rel) in found {
                plan.push((file, format!("{}{name}/{rel}", to.folder())));
            }
        } else if into_folder {
            plan.push((local, format!("{}{name}", to.folder())));
        } else {
            plan.push((local, to.path.clone()));
        }
    }
    for (_, path) in &plan {
        check_path("destination", path)?;
    }
    Ok(plan)
}

/// The files under `dir` (all depths), with their paths relative to it, in name order.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) -> Result<()> {
    fn go(dir: &Path, rel: &str, out: &mut Vec<(PathBuf, String)>) -> Result<()> {
        let read =
            |e: std::io::Error| CliError::Usage(format!("cannot read {}: {e}", dir.display()));
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(read)?
            .collect::<std::io::Result<_>>()
            .map_err(read)?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            let meta = std::fs::metadata(&path).map_err(read)?;
            if meta.is_dir() {
                go(&path, &format!("{rel}{name}/"), out)?;
            } else if meta.is_file() {
                out.push((path, format!("{rel}{name}")));
            }
        }
        Ok(())
    }
    go(dir, "", out)
}

/// A reader that hashes what it reads.
struct Hashing<R> {
    inner: R,
    hash: Arc<Mutex<Sha256>>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Ok(mut h) = self.hash.lock() {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

fn upload(client: &Client, local: &Path, to: &Remote, path: &str) -> Result<()> {
    let shown = local.display();
    let file = std::fs::File::open(local)
        .map_err(|e| CliError::Usage(format!("cannot read {shown}: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| CliError::Usage(format!("cannot read {shown}: {e}")))?
        .len();
    if crate::parts::in_parts(len) {
        drop(file);
        let target = match &to.lab {
            Some(l) => format!("lab:{l}/{path}"),
            None => path.to_string(),
        };
        crate::parts::upload(client, local, len, &target, &to.show(path))?;
        eprintln!("{shown} -> {} ({})", to.show(path), human_bytes(len));
        return Ok(());
    }
    let hash = Arc::new(Mutex::new(Sha256::new()));
    let body = Hashing {
        inner: file,
        hash: hash.clone(),
    };
    let resp = client.put_body(&to.url(path), reqwest::blocking::Body::sized(body, len))?;
    let stored: FileEntry = resp.json().map_err(|e| {
        CliError::Other(anyhow::anyhow!(
            "the portal's answer to the upload of {shown} is not a file: {e}"
        ))
    })?;
    let sent = hash
        .lock()
        .map(|h| hex::encode(h.clone().finalize()))
        .unwrap_or_default();
    if stored.sha256 != sent || stored.size != len {
        return Err(CliError::Other(anyhow::anyhow!(
            "{} was damaged on the way: the portal stored {} bytes with SHA-256 {}, but {shown} has {len} with {sent}; copy it again",
            to.show(path),
            stored.size,
            stored.sha256
        )));
    }
    eprintln!("{shown} -> {} ({})", to.show(path), human_bytes(len));
    Ok(())
}

/// Downloads `from` (a file, or with `recursive` everything under it) to `dest`.
fn download_all(client: &Client, from: &Remote, dest: &Path, recursive: bool) -> Result<()> {
    let dest_is_dir = dest.is_dir() || dest.to_string_lossy().ends_with('/');
    if !recursive {
        check_path("source", &from.path)?;
        let target = if dest_is_dir {
            let name = from.path.rsplit('/').next().unwrap_or(&from.path);
            dest.join(name)
        } else {
            dest.to_path_buf()
        };
        return download(client, from, &from.path, &target);
    }
    let prefix = from.folder();
    check_prefix("source", &prefix)?;
    let listed: Vec<FileEntry> =
        client.get(&format!("{}?prefix={}", from.api(), encode_path(&prefix)))?;
    if listed.is_empty() {
        return Err(CliError::Usage(format!(
            "{} holds no files",
            from.show(&prefix)
        )));
    }
    // Like `cp -r DIR DEST`: the folder itself is made under DEST.
    let top = prefix
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    for f in listed {
        check_path("source", &f.path)?;
        let rel = f.path.strip_prefix(&prefix).unwrap_or(&f.path);
        let target = rel.split('/').fold(dest.join(top), |p, seg| p.join(seg));
        download(client, from, &f.path, &target)?;
    }
    Ok(())
}

/// One file, written beside `target` and renamed into place once its checksum matches.
fn download(client: &Client, from: &Remote, path: &str, target: &Path) -> Result<()> {
    let mut resp = client.get_body(&from.url(path))?;
    let want = resp
        .headers()
        .get(commons_api::files::SHA256_HEADER)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    let shown = target.display();
    let local = |e: std::io::Error| CliError::Other(anyhow::anyhow!("cannot write {shown}: {e}"));
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(local)?;
    }
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let part = target.with_file_name(format!(".{name}.commons-part"));
    let mut out = std::fs::File::create(&part).map_err(local)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    let result = loop {
        match resp.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                hash.update(&buf[..n]);
                bytes += n as u64;
                if let Err(e) = out.write_all(&buf[..n]) {
                    break Err(local(e));
                }
            }
            Err(e) => {
                break Err(CliError::Other(anyhow::anyhow!(
                    "the download of {} was cut off: {e}",
                    from.show(path)
                )))
            }
        }
    };
    let got = hex::encode(hash.finalize());
    let checked = result.and_then(|()| match want {
        Some(w) if w != got => Err(CliError::Other(anyhow::anyhow!(
            "{} was damaged on the way (SHA-256 {got}, the portal says {w}); nothing was written, copy it again",
            from.show(path)
        ))),
        _ => out.sync_all().map_err(local),
    });
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, target).map_err(local)?;
    eprintln!("{} -> {shown} ({})", from.show(path), human_bytes(bytes));
    Ok(())
}

/// `commons get ID [-o DIR]`: the job's outputs (its `jobs/ID/` files) into `DIR`
/// (`job-ID` by default), each at its path under the job's folder.
pub fn get(a: GetArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    let listed: Vec<FileEntry> = client.get(&format!("/api/v1/jobs/{}/outputs", a.id))?;
    if listed.is_empty() {
        eprintln!("job {} has kept no outputs (yet)", a.id);
        return Ok(0);
    }
    let dir = a
        .output
        .unwrap_or_else(|| PathBuf::from(format!("job-{}", a.id)));
    let prefix = format!("jobs/{}/", a.id);
    let mine = Remote {
        lab: None,
        path: prefix.clone(),
    };
    for f in listed {
        check_path("source", &f.path)?;
        let rel = f.path.strip_prefix(&prefix).unwrap_or(&f.path);
        let target = rel.split('/').fold(dir.clone(), |p, seg| p.join(seg));
        download(&client, &mine, &f.path, &target)?;
    }
    Ok(0)
}

/// `commons files ls|rm`.
pub fn files(c: FilesCommand) -> Result<u8> {
    match c {
        FilesCommand::Ls { prefix, json } => ls(prefix.as_deref().unwrap_or(""), json),
        FilesCommand::Rm { paths } => rm(&paths),
    }
}

fn ls(prefix: &str, json: bool) -> Result<u8> {
    let at = Remote::parse_or_mine("prefix", prefix)?;
    check_prefix("prefix", &at.path)?;
    let client = Client::signed_in()?;
    let url = format!("{}?prefix={}", at.api(), encode_path(&at.path));
    let v: serde_json::Value = client.get(&url)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let listed: Vec<FileEntry> = client.parse(v)?;
    let total: u64 = listed.iter().map(|f| f.size).sum();
    let n = listed.len();
    let rows = listed
        .into_iter()
        .map(|f| {
            vec![
                Cell::from(human_bytes(f.size)),
                output::when(f.modified).into(),
                f.path.into(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(&["SIZE", "MODIFIED", "PATH"], rows, false)
    );
    println!(
        "{n} file{} ({})",
        if n == 1 { "" } else { "s" },
        human_bytes(total)
    );
    Ok(0)
}

fn rm(paths: &[String]) -> Result<u8> {
    let targets = paths
        .iter()
        .map(|p| {
            let r = Remote::parse_or_mine("path", p)?;
            check_path("path", &r.path)?;
            Ok(r)
        })
        .collect::<Result<Vec<_>>>()?;
    let client = Client::signed_in()?;
    let mut failed = 0;
    for r in &targets {
        match client.delete(&r.url(&r.path)) {
            Ok(()) => eprintln!("removed {}", r.show(&r.path)),
            Err(e) => {
                eprintln!("commons: {}: {e}", r.show(&r.path));
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 {
        0
    } else {
        crate::error::exit::ERROR
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_space_or_a_local_path() {
        assert_eq!(Remote::parse("d", "./x").unwrap(), None);
        let mine = Remote::parse("d", "files:data/x").unwrap().unwrap();
        assert_eq!((mine.lab, mine.path.as_str()), (None, "data/x"));
        let lab = Remote::parse("d", "lab:vision/a/b").unwrap().unwrap();
        assert_eq!(lab.url("a/b c"), "/api/v1/labs/vision/files/a/b%20c");
        assert_eq!(lab.show("a"), "lab:vision/a");
        assert_eq!(Remote::parse_or_mine("p", "data/").unwrap().path, "data/");
        assert!(Remote::parse("d", "lab:No Lab/x").is_err());
    }

    #[test]
    fn uploads_go_to_a_file_or_into_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.txt");
        std::fs::write(&a, "a").unwrap();
        std::fs::create_dir_all(dir.path().join("set/sub")).unwrap();
        std::fs::write(dir.path().join("set/sub/b.bin"), "b").unwrap();
        let a_s = a.display().to_string();
        let to = |s: &str| Remote::parse("d", s).unwrap().unwrap();
        let one = plan_uploads(std::slice::from_ref(&a_s), &to("files:x/y.txt"), false).unwrap();
        assert_eq!(one[0].1, "x/y.txt");
        let into = plan_uploads(std::slice::from_ref(&a_s), &to("files:x/"), false).unwrap();
        assert_eq!(into[0].1, "x/a.txt");
        let set = dir.path().join("set").display().to_string();
        let e = plan_uploads(std::slice::from_ref(&set), &to("files:in"), false).unwrap_err();
        assert!(e.to_string().contains("-r"), "{e}");
        let all = plan_uploads(&[set, a_s], &to("files:in"), true).unwrap();
        let paths: Vec<_> = all.iter().map(|p| p.1.as_str()).collect();
        assert_eq!(paths, ["in/set/sub/b.bin", "in/a.txt"]);
        let bad = plan_uploads(&[a.display().to_string()], &to("files:/abs"), false).unwrap_err();
        assert!(
            matches!(bad, CliError::Invalid { ref field, .. } if field == "destination"),
            "{bad}"
        );
    }
}
