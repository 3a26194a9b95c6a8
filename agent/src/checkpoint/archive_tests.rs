//! Unit tests of `archive`: a round trip keeps what the job wrote (and only that), and
//! archives with dangerous entries are refused whole.

use super::*;
use std::os::unix::fs::MetadataExt;

/// A cap no test here reaches.
const NO_CAP: u64 = u64::MAX;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// An entry as an attacker writes it: name, type, link target, content.
type Raw<'a> = (&'a str, tar::EntryType, &'a str, &'a [u8]);

/// A tar + zstd archive with entries written as given, names unchecked.
pub(crate) fn raw_archive(path: &Path, entries: &[Raw<'_>]) {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        let mut h = tar::Header::new_gnu();
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    let tar = b.into_inner().unwrap();
    std::fs::write(path, zstd::encode_all(&tar[..], 3).unwrap()).unwrap();
}

#[test]
fn a_round_trip_keeps_files_modes_times_and_inner_links() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("model/shards")).unwrap();
    std::fs::write(src.join("step"), "1200\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(src.join("model/shards/0.bin"), &big).unwrap();
    std::fs::set_permissions(src.join("step"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    File::options()
        .write(true)
        .open(src.join("step"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    std::os::unix::fs::symlink("model/shards/0.bin", src.join("latest")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("escape")).unwrap();
    std::os::unix::fs::symlink("../../x", src.join("model/up")).unwrap();
    let fifo = std::ffi::CString::new(src.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);

    let out = tmp.path().join("a.tar.zst");
    let packed = pack(&src, &out, NO_CAP, &AtomicBool::new(false)).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(packed.bytes, bytes.len() as u64);
    assert_eq!(packed.sha256, hex::encode(Sha256::digest(&bytes)));
    assert_eq!(packed.skipped.len(), 3, "{:?}", packed.skipped);
    assert!(!tmp.path().join("a.tar.zst.tmp").exists());

    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let got = unpack(&out, &dest, NO_CAP).unwrap();
    assert_eq!(got.bytes, 5 + big.len() as u64);
    assert_eq!(std::fs::read(dest.join("step")).unwrap(), b"1200\n");
    assert_eq!(std::fs::read(dest.join("model/shards/0.bin")).unwrap(), big);
    let m = std::fs::metadata(dest.join("step")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o640);
    assert_eq!(m.modified().unwrap(), old);
    assert_eq!(
        std::fs::read_link(dest.join("latest")).unwrap(),
        Path::new("model/shards/0.bin")
    );
    for gone in ["escape", "model/up", "pipe"] {
        assert!(
            std::fs::symlink_metadata(dest.join(gone)).is_err(),
            "{gone} left out"
        );
    }
    if is_root() {
        for p in ["step", "model", "model/shards/0.bin", "latest"] {
            let m = std::fs::symlink_metadata(dest.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (JOB_UID, JOB_GID), "{p}");
        }
    }
}

#[test]
fn a_file_that_changes_while_archived_still_matches_its_header() {
    let mut r = Exact::new(&b"abc"[..], 5);
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"abc\0\0", "shrunk: padded");
    let mut r = Exact::new(&b"abcdef"[..], 2);
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"ab", "grew: cut");
}

#[test]
fn cancelling_stops_packing() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("src")).unwrap();
    std::fs::write(tmp.path().join("src/a"), "a").unwrap();
    let err = pack(
        &tmp.path().join("src"),
        &tmp.path().join("a.tar.zst"),
        NO_CAP,
        &AtomicBool::new(true),
    )
    .unwrap_err();
    assert!(matches!(err, ArchiveError::Cancelled), "{err}");
}

#[test]
fn dangerous_archives_are_refused() {
    use tar::EntryType::*;
    let cases: Vec<(&str, Vec<Raw<'_>>)> = vec![
        ("..", vec![("../evil", Regular, "", b"x")]),
        ("..", vec![("a/../../evil", Regular, "", b"x")]),
        ("absolute", vec![("/tmp/evil", Regular, "", b"x")]),
        ("outside", vec![("l", Symlink, "/etc", b"")]),
        ("outside", vec![("d/l", Symlink, "../..", b"")]),
        (
            "not a directory",
            vec![("l", Symlink, ".", b""), ("l/x", Regular, "", b"x")],
        ),
        ("absolute", vec![("h", Link, "/etc/passwd", b"")]),
        ("..", vec![("h", Link, "../x", b"")]),
        ("not a file", vec![("h", Link, "missing", b"")]),
        ("Char", vec![("null", Char, "", b"")]),
        ("Block", vec![("disk", Block, "", b"")]),
        ("Fifo", vec![("pipe", Fifo, "", b"")]),
        (
            "twice",
            vec![("a", Regular, "", b"x"), ("a", Symlink, "b", b"")],
        ),
    ];
    for (want, entries) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let ar = tmp.path().join("a.tar.zst");
        raw_archive(&ar, &entries);
        let dest = tmp.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        let err = unpack(&ar, &dest, NO_CAP).unwrap_err();
        assert!(
            matches!(err, ArchiveError::Refused(_)) && err.to_string().contains(want),
            "{entries:?}: {err}"
        );
        assert!(!tmp.path().join("evil").exists());
    }
}

#[test]
fn inner_hard_links_and_dot_paths_are_restored() {
    use tar::EntryType::*;
    let tmp = tempfile::tempdir().unwrap();
    let ar = tmp.path().join("a.tar.zst");
    raw_archive(
        &ar,
        &[
            ("./", Directory, "", b""),
            ("./d/a", Regular, "", b"hello"),
            ("d/b", Link, "d/a", b""),
        ],
    );
    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    unpack(&ar, &dest, NO_CAP).unwrap();
    assert_eq!(std::fs::read(dest.join("d/b")).unwrap(), b"hello");
}

#[test]
fn links_are_judged_lexically_from_their_directory() {
    assert!(link_stays_inside(Path::new("a"), Path::new("b/c")));
    assert!(link_stays_inside(Path::new("d/a"), Path::new("../b")));
    assert!(!link_stays_inside(Path::new("d/a"), Path::new("../../b")));
    assert!(!link_stays_inside(Path::new("a"), Path::new("/b")));
    assert!(link_stays_inside(Path::new("a"), Path::new(".")));
}

const GIB: u64 = 1 << 30;

/// Runs `f` on a thread; fails the test when it takes longer than `within` (a pack that
/// reads 2 TB of zeros would otherwise hold the test for an hour).
fn within<T: Send + 'static>(within: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("still running after {within:?}"))
}

#[test]
fn a_2t_sparse_file_is_refused_at_once_without_reading_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("step"), "1\n").unwrap();
    // `truncate -s 2T`: 2 TiB of holes.
    File::create(src.join("huge"))
        .unwrap()
        .set_len(2 << 40)
        .unwrap();
    let out = tmp.path().join("a.tar.zst");
    let (s, o) = (src.clone(), out.clone());
    let started = std::time::Instant::now();
    let got = within(Duration::from_secs(10), move || {
        pack(&s, &o, GIB, &AtomicBool::new(false))
    });
    let took = started.elapsed();
    let err = got.unwrap_err();
    assert!(matches!(err, ArchiveError::OverCap(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("2.0 TiB") && text.contains("cap of 1.0 GiB"),
        "{text}"
    );
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    eprintln!("a 2 TiB sparse file refused in {took:?}: {text}");
    assert!(!out.exists() && !tmp.path().join("a.tar.zst.tmp").exists());
}

#[test]
fn sparse_files_travel_sparse_and_come_back_sparse() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let p = src.join("weights");
    let f = File::create(&p).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"first", 0).unwrap();
    f.write_all_at(b"second", 300 << 20).unwrap();
    f.set_len(GIB).unwrap();
    drop(f);
    let out = tmp.path().join("a.tar.zst");
    let (s, o) = (src.clone(), out.clone());
    let packed = within(Duration::from_secs(5), move || {
        pack(&s, &o, 2 * GIB, &AtomicBool::new(false))
    })
    .unwrap();
    assert!(
        packed.bytes < 1 << 20,
        "{} bytes for 11 of data",
        packed.bytes
    );
    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let got = unpack(&out, &dest, 2 * GIB).unwrap();
    assert_eq!(got.bytes, GIB, "counted at its apparent size");
    let back = File::open(dest.join("weights")).unwrap();
    let m = back.metadata().unwrap();
    assert_eq!(m.len(), GIB);
    let mut buf = [0u8; 6];
    back.read_exact_at(&mut buf, 300 << 20).unwrap();
    assert_eq!(&buf, b"second");
    back.read_exact_at(&mut buf[..5], 0).unwrap();
    assert_eq!(&buf[..5], b"first");
    assert!(m.blocks() * 512 < 4 << 20, "{} blocks written", m.blocks());
    // The same cap that let it out lets it back; a smaller one does not.
    let again = tmp.path().join("again");
    std::fs::create_dir(&again).unwrap();
    let err = unpack(&out, &again, GIB - 1).unwrap_err();
    assert!(matches!(err, ArchiveError::OverCap(_)), "{err}");
}

#[test]
fn an_archive_over_the_cap_is_refused_before_anything_is_written() {
    use tar::EntryType::*;
    let tmp = tempfile::tempdir().unwrap();
    let ar = tmp.path().join("a.tar.zst");
    let chunk = vec![7u8; 600 * 1024];
    raw_archive(
        &ar,
        &[
            ("d/", Directory, "", b""),
            ("d/a", Regular, "", &chunk),
            ("b", Regular, "", &chunk),
        ],
    );
    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let err = unpack(&ar, &dest, 1 << 20).unwrap_err();
    assert!(matches!(err, ArchiveError::OverCap(_)), "{err}");
    assert!(err.to_string().contains("1.2 MiB"), "{err}");
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0, "nothing made");
    assert_eq!(unpack(&ar, &dest, 2 << 20).unwrap().bytes, 1200 * 1024);
}

#[test]
fn a_sparse_entry_claiming_2t_is_refused_before_a_byte_is_written() {
    // What `truncate -s 2T` on the last server would make the next one write.
    let tmp = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    let ext = sparse::header(&mut h, 2 << 40, &[(0, 512)]).unwrap();
    let data = io::Cursor::new(ext).chain(&[1u8; 512][..]);
    b.append_data(&mut h, "huge", data).unwrap();
    let tar = b.into_inner().unwrap();
    let ar = tmp.path().join("a.tar.zst");
    std::fs::write(&ar, zstd::encode_all(&tar[..], 3).unwrap()).unwrap();
    assert_eq!(claimed(&ar).unwrap(), 2 << 40);
    let dest = tmp.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let started = std::time::Instant::now();
    let err = unpack(&ar, &dest, GIB).unwrap_err();
    assert!(matches!(err, ArchiveError::OverCap(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);
}

#[test]
fn caps_read_in_binary_units() {
    assert_eq!(binary(812), "812 B");
    assert_eq!(binary(3 << 20), "3.0 MiB");
    assert_eq!(binary(2 << 40), "2.0 TiB");
}
