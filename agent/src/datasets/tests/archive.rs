//! Archives: the download (hash, retries, caps, HTTPS with a test CA) and unpacking
//! (what is refused, the byte cap, read-only results).

use super::server::{Reply, Server, CA_PEM};
use crate::datasets::archive::{fetch, fetch_with, unpack};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Appends an entry with a raw name (the tar crate's builder refuses the bad ones).
fn raw(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
    h.set_cksum();
    b.append(&h, data).expect("append");
}

/// An entry: name, type, link target, content.
type Raw<'a> = (&'a str, tar::EntryType, &'a str, &'a [u8]);

fn tar_of(entries: &[Raw]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        raw(&mut b, name, *kind, link, data);
    }
    b.into_inner().expect("tar")
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

async fn unpack_bytes(archive: &[u8], cap: u64) -> (tempfile::TempDir, Result<u64, String>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("a.tar.gz");
    std::fs::write(&path, archive).expect("archive");
    let got = unpack(&path, &tmp.path().join("data"), cap).await;
    (tmp, got)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

use tar::EntryType as T;

#[tokio::test]
async fn unpacks_files_dirs_and_inside_links_read_only() {
    let tar = tar_of(&[
        ("./", T::Directory, "", b""),
        ("train/", T::Directory, "", b""),
        ("train/0001.jpg", T::Regular, "", b"0123456789"),
        ("deep/er/labels.txt", T::Regular, "", b"cat\n"),
        ("deep/er/train", T::Symlink, "../../train", b""),
        ("latest", T::Symlink, "train/0001.jpg", b""),
    ]);
    for archive in [gz(&tar), tar.clone()] {
        let (tmp, got) = unpack_bytes(&archive, 1000).await;
        assert_eq!(got, Ok(14));
        let data = tmp.path().join("data");
        assert_eq!(
            std::fs::read(data.join("deep/er/train/0001.jpg")).expect("via link"),
            b"0123456789"
        );
        assert_eq!(
            std::fs::read(data.join("latest")).expect("link"),
            b"0123456789"
        );
        assert_eq!(mode(&data.join("train/0001.jpg")), 0o444);
        assert_eq!(mode(&data.join("deep/er")), 0o555);
        assert_eq!(mode(&data), 0o555);
        crate::datasets::cache::remove_tree(&data).expect("removable");
    }
}

#[tokio::test]
async fn refuses_what_could_leave_the_dataset() {
    let cases: [(&[Raw], &str); 8] = [
        (
            &[("../evil", T::Regular, "", b"x")],
            "entry ../evil: a path with .. is not allowed",
        ),
        (
            &[("a/../../evil", T::Regular, "", b"x")],
            "a path with .. is not allowed",
        ),
        (
            &[("/etc/evil", T::Regular, "", b"x")],
            "entry /etc/evil: an absolute path is not allowed",
        ),
        (
            &[("l", T::Symlink, "/etc", b"")],
            "entry l: a symlink to /etc leads out of the dataset",
        ),
        (
            &[("d/l", T::Symlink, "../../etc", b"")],
            "a symlink to ../../etc leads out",
        ),
        (&[("l", T::Symlink, "d/../..", b"")], "leads out"),
        (
            &[("h", T::Link, "/etc/passwd", b"")],
            "entry h: hard links are not allowed",
        ),
        (
            &[("dev", T::Block, "", b"")],
            "entry dev: device files are not allowed",
        ),
    ];
    for (entries, want) in cases {
        let (_tmp, got) = unpack_bytes(&gz(&tar_of(entries)), 1000).await;
        let err = got.expect_err(want);
        assert!(err.contains(want), "{err:?} should say {want:?}");
    }
    let through = tar_of(&[("l", T::Symlink, ".", b""), ("l/x", T::Regular, "", b"x")]);
    let (_tmp, got) = unpack_bytes(&through, 1000).await;
    assert_eq!(
        got,
        Err("dataset archive entry l/x: it lies under l, a symlink".into())
    );
}

#[tokio::test]
async fn a_bomb_fails_at_the_cap() {
    let mut b = tar::Builder::new(Vec::new());
    let zeros = vec![0u8; 4_000_000];
    let mut h = tar::Header::new_gnu();
    h.set_size(zeros.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "zeros.bin", &zeros[..])
        .expect("append");
    let archive = gz(&b.into_inner().expect("tar"));
    assert!(
        archive.len() < 100_000,
        "it compresses well: {}",
        archive.len()
    );
    let (_tmp, got) = unpack_bytes(&archive, 1_000_000).await;
    assert_eq!(
        got,
        Err("dataset archive entry zeros.bin: the dataset unpacks to more than 1.0 MB".into())
    );
    let (_tmp, got) = unpack_bytes(
        b"this is not an archive at all, not even close to one",
        1000,
    )
    .await;
    assert!(got
        .expect_err("garbage")
        .contains("damaged or not a .tar.gz"));
}

fn parts_left(work: &Path) -> Vec<String> {
    let names = std::fs::read_dir(work).expect("work").flatten();
    names
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
async fn a_download_is_tried_again_after_a_500_and_a_cut() {
    let body = gz(b"dataset bytes").repeat(50);
    let server = Server::start(
        vec![
            Reply::Status(500),
            Reply::CutOff(body.clone()),
            Reply::Body(body.clone()),
        ],
        false,
    )
    .await;
    let work = tempfile::tempdir().expect("work");
    let path = fetch_with(&server.url, &sha(&body), None, work.path(), 1 << 20, true)
        .await
        .expect("fetched");
    assert_eq!(std::fs::read(&path).expect("archive"), body);
    assert_eq!(server.requests(), 3);
    assert_eq!(
        parts_left(work.path()).len(),
        1,
        "only the finished download"
    );
}

#[tokio::test]
async fn a_wrong_hash_a_404_or_too_much_fail_at_once() {
    let body = b"not what was published".to_vec();
    let server = Server::start(vec![Reply::Body(body.clone())], false).await;
    let work = tempfile::tempdir().expect("work");
    let want = sha(b"the published archive");
    let err = fetch_with(&server.url, &want, None, work.path(), 1000, true)
        .await
        .expect_err("mismatch");
    let port = server
        .url
        .split(':')
        .nth(2)
        .and_then(|s| s.split('/').next())
        .expect("port");
    assert_eq!(
        err,
        format!(
            "dataset archive http://127.0.0.1:{port}/datasets/imagenet.tar.gz: its SHA-256 is {}, \
             not {want} as published (a changed or damaged archive)",
            sha(&body)
        )
    );
    assert!(!err.contains("secret"), "the query stays out of logs");
    assert_eq!(server.requests(), 1);
    let err = fetch_with(&server.url, &sha(&body), None, work.path(), 10, true)
        .await
        .expect_err("over the cap");
    assert!(
        err.ends_with("it is larger than the 10 bytes allowed"),
        "{err}"
    );
    let missing = Server::start(vec![Reply::Status(404)], false).await;
    let err = fetch_with(&missing.url, &want, None, work.path(), 1000, true)
        .await
        .expect_err("404");
    assert!(err.ends_with("the server answered 404 Not Found"), "{err}");
    assert_eq!(missing.requests(), 1);
    let err = fetch(&server.url, &want, None, work.path(), 1000)
        .await
        .expect_err("http");
    assert!(err.ends_with("only https addresses are allowed"), "{err}");
    assert!(
        parts_left(work.path()).is_empty(),
        "no partial files: {:?}",
        parts_left(work.path())
    );
}

#[tokio::test]
async fn https_with_the_dataset_ca() {
    let body = gz(b"over TLS");
    let server = Server::start(vec![Reply::Body(body.clone())], true).await;
    let work = tempfile::tempdir().expect("work");
    let path = fetch(&server.url, &sha(&body), Some(CA_PEM), work.path(), 1000)
        .await
        .expect("fetched over https");
    assert_eq!(std::fs::read(path).expect("archive"), body);
    let err = fetch(&server.url, &sha(&body), None, work.path(), 1000)
        .await
        .expect_err("untrusted");
    assert!(err.contains("certificate"), "{err}");
    assert_eq!(server.requests(), 1);
    assert_eq!(
        server.connections(),
        2,
        "an untrusted server is not tried again"
    );
    let err = fetch(
        &server.url,
        &sha(&body),
        Some(b"nonsense"),
        work.path(),
        1000,
    )
    .await
    .expect_err("bad CA file");
    assert!(err.contains("dataset CA file"), "{err}");
}

/// The whole journey as the executor would run it: fetch into the cache's scratch
/// directory, unpack into the fill's directory, and later evict the read-only tree.
#[tokio::test]
async fn a_dataset_fills_the_cache_from_https() {
    let archive = gz(&tar_of(&[("images/1.png", T::Regular, "", b"png")]));
    let server = Server::start(vec![Reply::Body(archive.clone())], true).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = crate::datasets::Cache::open(tmp.path().join("cache"), 1000).expect("open");
    let user = tmp.path().join("attempts/1-1");
    std::fs::create_dir_all(&user).expect("attempt");
    let (url, sha256, scratch) = (server.url.clone(), sha(&archive), cache.scratch());
    let data = cache
        .acquire(
            "vision/tiny",
            &sha(&archive),
            &user,
            None,
            |dir, cap| async move {
                let file = fetch(&url, &sha256, Some(CA_PEM), &scratch, cap).await?;
                let bytes = unpack(&file, &dir, cap).await;
                let _ = tokio::fs::remove_file(&file).await;
                bytes
            },
        )
        .await
        .expect("filled");
    assert_eq!(
        std::fs::read(data.join("images/1.png")).expect("file"),
        b"png"
    );
    assert_eq!(mode(&data), 0o555);
    std::fs::remove_dir(&user).expect("attempt gone");
    cache
        .acquire("other", "v1", tmp.path(), Some(1000), |_, _| async {
            Ok(0)
        })
        .await
        .expect("other");
    assert!(!data.exists(), "the read-only tree was evicted");
}
