//! The per-server dataset cache: each (key, version) filled once, shared by every job
//! that mounts it, evicted least recently used within a cap, never while mounted.
//!
//! On disk, under the cache's root:
//! - `entries/<id>/`, one per (key, version), `<id>` the SHA-256 hex of `key NUL version`:
//!   `data/` is the dataset (what jobs mount), `meta.json` its key, version and bytes,
//!   `used` the stamp of its last acquire (for the LRU order across restarts) and
//!   `pins/<SHA-256 hex of an attempt dir>` holds that attempt directory's path.
//! - `tmp/`: fills under way, entries being removed and [`Cache::scratch`] files (the
//!   archives being downloaded); emptied when the cache is opened.
//!
//! Acquiring a (key, version):
//! 1. Take that pair's fill lock, so concurrent callers in this process fill once and
//!    the others find it held when they get the lock.
//! 2. Held already: pin it, stamp it, return its `data/`.
//! 3. Otherwise the room is the cap less the bytes pinned by live attempts and less what
//!    other fills under way said they need; a dataset known to be larger is refused now.
//! 4. Evict unpinned entries, least recently used first, until the expected bytes fit;
//!    reserve them, and fill `tmp/<n>/data` with the room as the fill's byte cap.
//! 5. Evict again until the bytes actually written fit, then pin, stamp and move
//!    `tmp/<n>` to `entries/<id>` with one rename: a reader sees all of it or none.
//!
//! A pin is a file naming the attempt's directory; it holds while that directory exists,
//! so pins survive an agent restart, and one whose attempt is gone counts for nothing
//! (it is removed when next looked at).

use super::size_text;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One dataset the cache holds, as the portal's placement sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub key: String,
    pub version: String,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    held: Held,
    /// The last acquire's stamp: larger is more recent.
    used: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Bytes that fills under way expect to write, by fill number.
    reserved: HashMap<u64, u64>,
    /// The largest stamp given so far.
    stamp: u64,
}

impl State {
    fn used_bytes(&self) -> u64 {
        let held: u64 = self.entries.values().map(|e| e.held.bytes).sum();
        held + self.reserved.values().sum::<u64>()
    }
}

/// A per-server cache of datasets, keyed by (key, version): key such as
/// `vision/imagenet`, version a content version (a SHA-256 hex, or any
/// `[A-Za-z0-9._:-]{1,128}`).
pub struct Cache {
    root: PathBuf,
    cap: u64,
    state: Mutex<State>,
    /// One lock per (key, version) ever asked for here: small, and bounded by the
    /// datasets the labs publish.
    fills: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    next: AtomicU64,
}

impl Cache {
    /// Opens (creating) the cache under `root` with at most `cap_bytes` of datasets (0: no
    /// cap). Leftover partial fills from a crash are removed.
    pub fn open(root: PathBuf, cap_bytes: u64) -> io::Result<Cache> {
        let tmp = root.join("tmp");
        if tmp.exists() {
            remove_tree(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        let entries_dir = root.join("entries");
        std::fs::create_dir_all(&entries_dir)?;
        let mut state = State::default();
        for dirent in std::fs::read_dir(&entries_dir)? {
            let path = dirent?.path();
            let Some(id) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            match load_entry(&path) {
                Some(entry) if id == entry_id(&entry.held.key, &entry.held.version) => {
                    state.stamp = state.stamp.max(entry.used);
                    state.entries.insert(id, entry);
                }
                _ => {
                    tracing::warn!(path = %path.display(), "removing an incomplete dataset entry");
                    remove_tree(&path)?;
                }
            }
        }
        Ok(Cache {
            root,
            cap: cap_bytes,
            state: Mutex::new(state),
            fills: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    /// The cap in bytes (0: none).
    pub fn cap_bytes(&self) -> u64 {
        self.cap
    }

    /// A directory for work files of fills (a download on its way): on the cache's file
    /// system, and emptied when the cache is next opened.
    pub fn scratch(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// What the cache holds now, sorted by key and version.
    pub fn held(&self) -> Vec<Held> {
        let state = self.state();
        let mut held: Vec<Held> = state.entries.values().map(|e| e.held.clone()).collect();
        held.sort_by(|a, b| (&a.key, &a.version).cmp(&(&b.key, &b.version)));
        held
    }

    /// Drops `user`'s pins (called when an attempt is cleaned up; pins whose attempt
    /// directory is gone are ignored on their own too).
    pub fn release(&self, user: &Path) {
        let state = self.state();
        let name = pin_name(user);
        for id in state.entries.keys() {
            let pin = self.entry_dir(id).join("pins").join(&name);
            if let Err(e) = std::fs::remove_file(&pin) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(pin = %pin.display(), "dataset pin not removed: {e}");
                }
            }
        }
    }

    /// The dataset's directory, filled once (see the module's steps): `fill(tmp_dir,
    /// byte_cap)` writes the content into `tmp_dir` and returns the bytes written. The
    /// directory is pinned by `user` (the attempt's directory) while that exists.
    pub async fn acquire<F, Fut>(
        &self,
        key: &str,
        version: &str,
        user: &Path,
        expected_bytes: Option<u64>,
        fill: F,
    ) -> Result<PathBuf, String>
    where
        F: FnOnce(PathBuf, u64) -> Fut,
        Fut: Future<Output = Result<u64, String>>,
    {
        check_names(key, version)?;
        let id = entry_id(key, version);
        let lock = {
            let mut fills = self.fills.lock().unwrap_or_else(PoisonError::into_inner);
            fills.entry(id.clone()).or_default().clone()
        };
        let _one_fill = lock.lock().await;
        if let Some(data) = self.hit(&id, user)? {
            return Ok(data);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let room = self.reserve(key, &id, n, expected_bytes)?;
        let mut filling = Filling {
            cache: self,
            n,
            dir: self.scratch().join(format!("fill-{n}")),
            done: false,
        };
        let data = filling.dir.join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| format!("dataset {key}: cannot make its directory: {e}"))?;
        let bytes = fill(data, room)
            .await
            .map_err(|e| format!("dataset {key}: {e}"))?;
        if bytes > room {
            return Err(format!(
                "dataset {key} came to {}, more than the room left in this server's dataset \
                 cache ({})",
                size_text(bytes),
                size_text(room)
            ));
        }
        let held = Held {
            key: key.to_string(),
            version: version.to_string(),
            bytes,
        };
        let path = self.install(&mut filling, &id, held, user)?;
        Ok(path)
    }

    /// The state: every change to it is whole before its lock is let go, so a panic
    /// elsewhere leaves nothing half done.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry_dir(&self, id: &str) -> PathBuf {
        self.root.join("entries").join(id)
    }

    /// Step 2: the entry's `data/`, pinned and stamped, when it is held.
    fn hit(&self, id: &str, user: &Path) -> Result<Option<PathBuf>, String> {
        let mut state = self.state();
        let Some(key) = state.entries.get(id).map(|e| e.held.key.clone()) else {
            return Ok(None);
        };
        let dir = self.entry_dir(id);
        pin(&dir, user).map_err(|e| format!("dataset {key}: cannot pin it: {e}"))?;
        self.stamp(&mut state, id);
        Ok(Some(dir.join("data")))
    }

    /// Steps 3 and 4: refuses what cannot fit, evicts for what is expected, reserves it,
    /// and says the fill's byte cap.
    fn reserve(&self, key: &str, id: &str, n: u64, expected: Option<u64>) -> Result<u64, String> {
        let mut state = self.state();
        if self.cap == 0 {
            state.reserved.insert(n, expected.unwrap_or(0));
            return Ok(u64::MAX);
        }
        let busy = self.pinned_bytes(&state) + state.reserved.values().sum::<u64>();
        let room = self.cap.saturating_sub(busy);
        if let Some(want) = expected.filter(|&want| want > room) {
            return Err(format!(
                "dataset {key} is {}, more than this server's dataset cache can hold ({}, {} \
                 of it in use by running jobs)",
                size_text(want),
                size_text(self.cap),
                size_text(busy)
            ));
        }
        let want = expected.unwrap_or(0);
        let gone = self.evict(&mut state, want, id);
        state.reserved.insert(n, want);
        drop(state);
        remove_later(gone);
        Ok(room)
    }

    /// Step 5: makes room for `held.bytes`, then moves the fill into place, pinned.
    fn install(
        &self,
        filling: &mut Filling<'_>,
        id: &str,
        held: Held,
        user: &Path,
    ) -> Result<PathBuf, String> {
        let key = held.key.clone();
        let failed = |e: io::Error| format!("dataset {key}: cannot keep it in the cache: {e}");
        let mut state = self.state();
        state.reserved.remove(&filling.n);
        let gone = self.evict(&mut state, held.bytes, id);
        if self.cap != 0 && state.used_bytes() + held.bytes > self.cap {
            let busy = self.pinned_bytes(&state) + state.reserved.values().sum::<u64>();
            drop(state);
            remove_later(gone);
            return Err(format!(
                "dataset {key} is {}, more than this server's dataset cache can hold now ({}, \
                 {} of it in use by running jobs)",
                size_text(held.bytes),
                size_text(self.cap),
                size_text(busy)
            ));
        }
        let meta = serde_json::to_vec(&held)
            .map_err(io::Error::other)
            .map_err(failed)?;
        crate::atomic::write(&filling.dir.join("meta.json"), &meta, 0o644).map_err(failed)?;
        pin(&filling.dir, user).map_err(failed)?;
        let dir = self.entry_dir(id);
        std::fs::rename(&filling.dir, &dir).map_err(failed)?;
        filling.done = true;
        state
            .entries
            .insert(id.to_string(), Entry { held, used: 0 });
        self.stamp(&mut state, id);
        drop(state);
        remove_later(gone);
        Ok(dir.join("data"))
    }

    /// Removes unpinned entries (never `keep`), least recently used first, until `need`
    /// more bytes fit the cap or none is left to remove. Each goes out of view at once
    /// (renamed under `tmp/`); the returned directories are deleted off the lock.
    fn evict(&self, state: &mut State, need: u64, keep: &str) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        if self.cap == 0 {
            return gone;
        }
        let mut order: Vec<(u64, String)> = state
            .entries
            .iter()
            .filter(|(id, _)| id.as_str() != keep)
            .map(|(id, e)| (e.used, id.clone()))
            .collect();
        order.sort();
        for (_, id) in order {
            if state.used_bytes() + need <= self.cap {
                break;
            }
            let dir = self.entry_dir(&id);
            if live_pins(&dir) {
                continue;
            }
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let to = self.scratch().join(format!("evicted-{n}"));
            match std::fs::rename(&dir, &to) {
                Ok(()) => {
                    if let Some(e) = state.entries.remove(&id) {
                        tracing::info!(
                            key = e.held.key,
                            version = e.held.version,
                            "dataset evicted"
                        );
                    }
                    gone.push(to);
                }
                Err(e) => tracing::warn!(dir = %dir.display(), "dataset not evicted: {e}"),
            }
        }
        gone
    }

    fn pinned_bytes(&self, state: &State) -> u64 {
        let pinned = state
            .entries
            .iter()
            .filter(|(id, _)| live_pins(&self.entry_dir(id)));
        pinned.map(|(_, e)| e.held.bytes).sum()
    }

    fn stamp(&self, state: &mut State, id: &str) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        state.stamp = (state.stamp + 1).max(now);
        let stamp = state.stamp;
        if let Some(entry) = state.entries.get_mut(id) {
            entry.used = stamp;
        }
        let used = self.entry_dir(id).join("used");
        if let Err(e) = std::fs::write(&used, stamp.to_string()) {
            tracing::warn!(path = %used.display(), "dataset use not recorded: {e}");
        }
    }
}

/// A fill under way: when dropped unfinished (failed, or its caller went away), its
/// reservation ends and its directory is removed.
struct Filling<'a> {
    cache: &'a Cache,
    n: u64,
    dir: PathBuf,
    done: bool,
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        self.cache.state().reserved.remove(&self.n);
        if !self.done {
            remove_later(vec![self.dir.clone()]);
        }
    }
}

fn entry_id(key: &str, version: &str) -> String {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0]);
    h.update(version.as_bytes());
    hex::encode(h.finalize())
}

fn pin_name(user: &Path) -> String {
    hex::encode(Sha256::digest(user.as_os_str().as_bytes()))
}

fn check_names(key: &str, version: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 256 || key.chars().any(char::is_control) {
        return Err(format!("dataset {key:?}: not a dataset name"));
    }
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if version.is_empty() || version.len() > 128 || !version.chars().all(fine) {
        return Err(format!(
            "dataset {key}: version {version:?} is not 1 to 128 of A-Z a-z 0-9 . _ : -"
        ));
    }
    Ok(())
}

fn load_entry(dir: &Path) -> Option<Entry> {
    let held: Held = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).ok()?).ok()?;
    if !dir.join("data").is_dir() {
        return None;
    }
    let used = std::fs::read_to_string(dir.join("used"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    Some(Entry { held, used })
}

/// Pins the entry at `dir` for `user`.
fn pin(dir: &Path, user: &Path) -> io::Result<()> {
    let pins = dir.join("pins");
    std::fs::create_dir_all(&pins)?;
    std::fs::write(pins.join(pin_name(user)), user.as_os_str().as_bytes())
}

/// Whether a pin of the entry at `dir` names an attempt directory that still exists.
/// Pins that do not are removed.
fn live_pins(dir: &Path) -> bool {
    let Ok(pins) = std::fs::read_dir(dir.join("pins")) else {
        return false;
    };
    let mut live = false;
    for pin in pins.flatten() {
        let path = pin.path();
        let Ok(user) = std::fs::read(&path) else {
            continue;
        };
        if Path::new(std::ffi::OsStr::from_bytes(&user)).exists() {
            live = true;
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
    live
}

/// Deletes directories off the async threads (a dataset may hold a million files).
fn remove_later(dirs: Vec<PathBuf>) {
    if dirs.is_empty() {
        return;
    }
    let work = move || {
        for dir in dirs {
            if let Err(e) = remove_tree(&dir) {
                tracing::warn!(dir = %dir.display(), "dataset directory not removed: {e}");
            }
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => drop(handle.spawn_blocking(work)),
        Err(_) => work(),
    }
}

/// Removes a tree whose directories may be read-only (datasets are 0555).
pub(crate) fn remove_tree(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_writable(dir)?;
            std::fs::remove_dir_all(dir)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn make_writable(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Ok(());
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for dirent in std::fs::read_dir(dir)? {
        make_writable(&dirent?.path())?;
    }
    Ok(())
}
