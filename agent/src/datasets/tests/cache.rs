//! The cache: one fill for concurrent callers, LRU within the cap, pins, restarts.

use crate::datasets::{Cache, Held};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fill that writes one file and says it wrote `bytes` (the cache trusts the count,
/// so large sizes cost nothing here).
async fn fill_with(dir: PathBuf, bytes: u64) -> Result<u64, String> {
    tokio::fs::write(dir.join("README"), b"a dataset")
        .await
        .map_err(|e| e.to_string())?;
    Ok(bytes)
}

async fn get(cache: &Cache, key: &str, user: &Path, bytes: u64) -> Result<PathBuf, String> {
    cache
        .acquire(key, "v1", user, Some(bytes), |dir, _cap| {
            fill_with(dir, bytes)
        })
        .await
}

fn keys(cache: &Cache) -> Vec<String> {
    cache.held().into_iter().map(|h| h.key).collect()
}

/// An attempt directory: a pin holds while it exists.
fn attempt(root: &Path, name: &str) -> PathBuf {
    let dir = root.join("attempts").join(name);
    std::fs::create_dir_all(&dir).expect("attempt dir");
    dir
}

/// Waits (with a generous deadline) until `dir` holds nothing.
async fn until_empty(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<_> = std::fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|d| d.path())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still in {}: {left:?}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn concurrent_acquires_fill_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = Arc::new(Cache::open(tmp.path().join("cache"), 0).expect("open"));
    let fills = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (cache, fills) = (cache.clone(), fills.clone());
        let user = attempt(tmp.path(), &format!("{i}-1"));
        tasks.push(tokio::spawn(async move {
            cache
                .acquire(
                    "vision/imagenet",
                    "abc123",
                    &user,
                    None,
                    |dir, _| async move {
                        fills.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        fill_with(dir, 9).await
                    },
                )
                .await
        }));
    }
    let mut paths = Vec::new();
    for task in tasks {
        paths.push(task.await.expect("task").expect("acquire"));
    }
    assert_eq!(fills.load(Ordering::SeqCst), 1, "fills");
    assert!(paths.iter().all(|p| p == &paths[0]), "paths: {paths:?}");
    assert_eq!(
        std::fs::read(paths[0].join("README")).expect("file"),
        b"a dataset"
    );
    let held = Held {
        key: "vision/imagenet".into(),
        version: "abc123".into(),
        bytes: 9,
    };
    assert_eq!(cache.held(), vec![held]);
}

#[tokio::test]
async fn least_recently_used_goes_first_within_the_cap() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(tmp.path().join("cache"), 300).expect("open");
    assert_eq!(cache.cap_bytes(), 300);
    let user = attempt(tmp.path(), "1-1");
    for key in ["a", "b", "c"] {
        get(&cache, key, &user, 100).await.expect(key);
    }
    cache.release(&user);
    get(&cache, "a", &user, 100).await.expect("a again");
    cache.release(&user);
    get(&cache, "d", &user, 100).await.expect("d");
    assert_eq!(
        keys(&cache),
        ["a", "c", "d"],
        "b was the least recently used"
    );
    // Unknown size: evicted after the fill, to fit what it wrote.
    cache.release(&user);
    cache
        .acquire("e", "v1", &user, None, |dir, cap| async move {
            assert_eq!(cap, 300, "the room: nothing is pinned");
            fill_with(dir, 150).await
        })
        .await
        .expect("e");
    assert_eq!(keys(&cache), ["d", "e"]);
    until_empty(&cache.scratch()).await;
}

#[tokio::test]
async fn pinned_entries_are_never_evicted_and_too_large_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(tmp.path().join("cache"), 10_000_000_000).expect("open");
    let running = attempt(tmp.path(), "1-1");
    let done = attempt(tmp.path(), "2-1");
    get(&cache, "pinned", &running, 3_100_000_000)
        .await
        .expect("pinned");
    get(&cache, "old", &done, 5_000_000_000).await.expect("old");
    cache.release(&done);
    let err = get(&cache, "vision/imagenet", &done, 12_000_000_000)
        .await
        .expect_err("too large");
    assert_eq!(
        err,
        "dataset vision/imagenet is 12.0 GB, more than this server's dataset cache can hold \
         (10.0 GB, 3.1 GB of it in use by running jobs)"
    );
    assert_eq!(keys(&cache), ["old", "pinned"], "a refusal evicts nothing");
    get(&cache, "new", &done, 6_000_000_000).await.expect("new");
    assert_eq!(keys(&cache), ["new", "pinned"], "old went, pinned stayed");
}

#[tokio::test]
async fn a_pin_whose_attempt_is_gone_does_not_count() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(tmp.path().join("cache"), 200).expect("open");
    let gone = attempt(tmp.path(), "1-1");
    let other = attempt(tmp.path(), "2-1");
    get(&cache, "a", &gone, 150).await.expect("a");
    std::fs::remove_dir(&gone).expect("attempt cleaned up");
    get(&cache, "b", &other, 150).await.expect("b");
    assert_eq!(keys(&cache), ["b"]);
}

#[tokio::test]
async fn a_fill_over_the_room_fails_and_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(tmp.path().join("cache"), 100).expect("open");
    let user = attempt(tmp.path(), "1-1");
    let err = cache
        .acquire("big", "v1", &user, None, |dir, cap| async move {
            assert_eq!(cap, 100);
            fill_with(dir, 150).await
        })
        .await
        .expect_err("over the room");
    assert!(
        err.contains("dataset big came to 150 bytes, more than the room left"),
        "{err}"
    );
    let err = cache
        .acquire("broken", "v1", &user, None, |_, _| async {
            Err("the download failed".to_string())
        })
        .await
        .expect_err("fill failed");
    assert_eq!(err, "dataset broken: the download failed");
    assert!(cache.held().is_empty());
    until_empty(&cache.scratch()).await;
    get(&cache, "broken", &user, 10)
        .await
        .expect("filled on a later try");
}

#[tokio::test]
async fn reopening_keeps_entries_and_removes_partial_fills() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cache");
    let user = attempt(tmp.path(), "1-1");
    let first = {
        let cache = Cache::open(root.clone(), 1000).expect("open");
        get(&cache, "a", &user, 10).await.expect("a")
    };
    let partial = root.join("tmp/fill-7/data/half");
    std::fs::create_dir_all(&partial).expect("partial fill");
    let torn = root.join("entries/0123abcd");
    std::fs::create_dir_all(torn.join("data")).expect("entry without meta");
    let cache = Cache::open(root.clone(), 1000).expect("open again");
    assert!(!torn.exists(), "an entry without its meta is removed");
    until_empty(&cache.scratch()).await;
    let again = cache
        .acquire("a", "v1", &user, None, |_, _| async {
            panic!("filled again")
        })
        .await
        .expect("a held");
    assert_eq!(again, first);
    assert_eq!(keys(&cache), ["a"]);
}

#[tokio::test]
async fn bad_versions_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(tmp.path().join("cache"), 0).expect("open");
    let err = get_version(&cache, "../x").await;
    assert!(err.contains("version \"../x\" is not"), "{err}");
    let err = get_version(&cache, &"a".repeat(129)).await;
    assert!(err.contains("is not 1 to 128"), "{err}");
}

async fn get_version(cache: &Cache, version: &str) -> String {
    cache
        .acquire("k", version, Path::new("/"), None, |dir, _| {
            fill_with(dir, 1)
        })
        .await
        .expect_err("refused")
}
