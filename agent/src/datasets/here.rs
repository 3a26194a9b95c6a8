//! This server's side of datasets: what its owner exports (`--data NAME=/path`), its
//! cache (`--dataset-cache-gb`), and how a job's [`DatasetMount`]s become host
//! directories to mount read-only: an export as it is, a `lab:` dataset fetched file by
//! file through the portal, an `https:` archive fetched and unpacked, both into the
//! cache.
//!
//! Invariants: no host path but an export reaches a job, and only the export the portal
//! names; a `lab:` file arrives with the size and SHA-256 the portal listed, or the fill
//! fails naming it.

use super::{archive, size_text, Cache};
use crate::checkpoint::client::{ok, transport};
use crate::checkpoint::CheckpointClient;
use crate::reconcile::Key;
use crate::signed::{Listed, Source};
use commons_proto::{
    dataset_file_path, dataset_path, CachedDataset, DatasetListing, DatasetMount, DatasetSource,
    NodeDatasets,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// `commons-agent run --data NAME=/path ... --dataset-cache-gb N --dataset-ca FILE`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatasetsConfig {
    pub exports: BTreeMap<String, PathBuf>,
    /// GB (10^9 bytes) of cached datasets at most; 0: no cap.
    pub cache_gb: u64,
    /// PEM certificates trusted for `https:` datasets besides the usual roots.
    pub ca_file: Option<PathBuf>,
}

/// `NAME=/absolute/path`, an existing directory.
pub fn parse_export(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("--data {s:?}: write NAME=/path"))?;
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(format!(
            "--data {s:?}: NAME takes 1 to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() || !path.is_dir() {
        return Err(format!(
            "--data {s:?}: {} is not a directory (give an absolute path)",
            path.display()
        ));
    }
    Ok((name.to_string(), path))
}

/// What the executor needs for datasets.
pub struct Here {
    pub exports: BTreeMap<String, PathBuf>,
    pub cache: Cache,
    ca: Option<Vec<u8>>,
    /// Bytes per second of the last fetch (0: none yet).
    rate: AtomicU64,
}

impl Here {
    /// Opens the cache under `state_dir/datasets`.
    pub fn open(cfg: &DatasetsConfig, state_dir: &Path) -> std::io::Result<Here> {
        let ca = cfg.ca_file.as_ref().map(std::fs::read).transpose()?;
        Ok(Here {
            exports: cfg.exports.clone(),
            cache: Cache::open(state_dir.join("datasets"), cfg.cache_gb * 1_000_000_000)?,
            ca,
            rate: AtomicU64::new(0),
        })
    }

    /// What this server offers, for the portal's placement.
    pub fn offer(&self) -> NodeDatasets {
        let mut cached: Vec<CachedDataset> = self
            .cache
            .held()
            .into_iter()
            .map(|h| CachedDataset {
                key: h.key,
                version: h.version,
                bytes: h.bytes,
            })
            .collect();
        cached.sort();
        let rate = self.rate.load(Ordering::Relaxed);
        NodeDatasets {
            exports: self.exports.keys().cloned().collect(),
            cached,
            cache_cap_bytes: self.cache.cap_bytes(),
            fetch_bytes_per_s: (rate > 0).then_some(rate),
        }
    }

    /// The host directory of each mount, in order (each pinned by `attempt_dir`);
    /// `log` gets a line per dataset. `Err`: why the attempt fails.
    pub async fn prepare(
        &self,
        client: Option<&CheckpointClient>,
        key: Key,
        attempt_dir: &Path,
        mounts: &[DatasetMount],
        log: &(dyn Fn(&str) + Sync),
    ) -> Result<Vec<(String, PathBuf)>, String> {
        let mut out = Vec::new();
        for (i, m) in mounts.iter().enumerate() {
            let began = Instant::now();
            let fetched = AtomicBool::new(false);
            let dir = match &m.source {
                DatasetSource::Refused { why } => return Err(format!("dataset {}: {why}", m.key)),
                DatasetSource::Node { name } => {
                    let dir = self.exports.get(name).ok_or_else(|| {
                        format!(
                            "dataset {}: this server does not export {name} (its owner \
                             exports it with commons-agent run --data {name}=/path)",
                            m.key
                        )
                    })?;
                    log(&format!(
                        "dataset {}: the server's export {name} at {}",
                        m.key, m.mount
                    ));
                    out.push((m.mount.clone(), dir.clone()));
                    continue;
                }
                DatasetSource::Lab { .. } => {
                    let client = client.ok_or_else(|| {
                        format!(
                            "dataset {}: this server has no connection to the portal's files",
                            m.key
                        )
                    })?;
                    self.lab(client, key, i, m, attempt_dir, &fetched).await?
                }
                DatasetSource::Https { url, sha256 } => {
                    self.https(m, url, sha256, attempt_dir, &fetched).await?
                }
            };
            let how = if fetched.load(Ordering::Relaxed) {
                "fetched into this server's cache"
            } else {
                "from this server's cache"
            };
            log(&format!(
                "dataset {} at {}: {how} in {:.1} s",
                m.key,
                m.mount,
                began.elapsed().as_secs_f64()
            ));
            out.push((m.mount.clone(), dir));
        }
        Ok(out)
    }

    fn note(&self, bytes: u64, began: Instant) {
        let secs = began.elapsed().as_secs_f64().max(0.001);
        if bytes >= 1_000_000 {
            self.rate
                .store((bytes as f64 / secs) as u64, Ordering::Relaxed);
        }
    }

    async fn lab(
        &self,
        client: &CheckpointClient,
        key: Key,
        index: usize,
        m: &DatasetMount,
        attempt_dir: &Path,
        fetched: &AtomicBool,
    ) -> Result<PathBuf, String> {
        let listing = list(client, key, index)
            .await
            .map_err(|e| format!("dataset {}: cannot list its files ({e})", m.key))?;
        let total: u64 = listing.files.iter().map(|f| f.size).sum();
        let fill = |dir: PathBuf, cap: u64| async move {
            if total > cap {
                return Err(format!(
                    "dataset {} is {}, more than this server's dataset cache has room for ({})",
                    m.key,
                    size_text(total),
                    size_text(cap)
                ));
            }
            fetched.store(true, Ordering::Relaxed);
            let began = Instant::now();
            let mut files = Listed::new(listing.files.clone());
            for i in 0..files.files.len() {
                let path = files.files[i].path.clone();
                fetch_file(client, key, index, &mut files, i, &dir)
                    .await
                    .map_err(|e| format!("dataset {}: file {path}: {e}", m.key))?;
            }
            self.note(total, began);
            Ok(total)
        };
        self.cache
            .acquire(&m.key, &listing.version, attempt_dir, Some(total), fill)
            .await
    }

    async fn https(
        &self,
        m: &DatasetMount,
        url: &str,
        sha256: &str,
        attempt_dir: &Path,
        fetched: &AtomicBool,
    ) -> Result<PathBuf, String> {
        let scratch = self.cache.scratch();
        let ca = self.ca.as_deref();
        let fill = |dir: PathBuf, cap: u64| async move {
            fetched.store(true, Ordering::Relaxed);
            let began = Instant::now();
            let file = archive::fetch(url, sha256, ca, &scratch, cap).await?;
            let got = archive::unpack(&file, &dir, cap).await;
            let _ = tokio::fs::remove_file(&file).await;
            let n = got?;
            self.note(n, began);
            Ok(n)
        };
        self.cache
            .acquire(&m.key, sha256, attempt_dir, None, fill)
            .await
    }
}

async fn list(
    client: &CheckpointClient,
    (job, attempt): Key,
    index: usize,
) -> Result<DatasetListing, String> {
    let mut n = 0;
    loop {
        let got = async {
            let resp = client
                .request(reqwest::Method::GET, &dataset_path(job, attempt, index))
                .send()
                .await
                .map_err(transport)?;
            ok(resp)
                .await?
                .json::<DatasetListing>()
                .await
                .map_err(transport)
        }
        .await;
        match got {
            Ok(l) => return Ok(l),
            Err(e) if e.is_final() || n + 1 >= crate::inputs::TRIES => return Err(e.to_string()),
            Err(_) => {
                n += 1;
                tokio::time::sleep(client.policy().backoff(n)).await;
            }
        }
    }
}

/// File `i` of `files` into `dir`, checked against its listed size and SHA-256, from its
/// signed URL while fresh (listed again when stale or refused), tried up to
/// [`crate::inputs::TRIES`] times.
async fn fetch_file(
    client: &CheckpointClient,
    key: Key,
    index: usize,
    files: &mut Listed,
    i: usize,
    dir: &Path,
) -> Result<(), String> {
    let f = files.files[i].clone();
    if !crate::outputs::stays_inside(&f.path) {
        return Err("the portal sent a path outside the dataset".into());
    }
    let to = f.path.split('/').fold(dir.to_path_buf(), |p, s| p.join(s));
    let path = dataset_file_path(
        key.0,
        key.1,
        index,
        &commons_api::files::percent_encode_path(&f.path),
    );
    let (mut n, mut relist) = (0, false);
    loop {
        if relist || files.stale(i) {
            files.refresh(list(client, key, index).await?.files);
        }
        let source = files.source(i, &path);
        let signed = matches!(source, Source::Signed(_));
        match fetch_once(client, source, &f, &to).await {
            Ok(()) => return Ok(()),
            // A signed URL refused (expired, the object replaced): list again.
            Err((e, last)) if (last && !signed) || n + 1 >= crate::inputs::TRIES => return Err(e),
            Err(_) => {
                n += 1;
                relist = signed;
                tokio::time::sleep(client.policy().backoff(n)).await;
            }
        }
    }
}

/// One try; the error says whether trying again cannot help.
async fn fetch_once(
    client: &CheckpointClient,
    source: Source<'_>,
    f: &commons_proto::InputFile,
    to: &Path,
) -> Result<(), (String, bool)> {
    use crate::inputs::{download, Fetch, Quiet};
    download(client, source, f, to, &mut Quiet)
        .await
        .map_err(|e| match e {
            Fetch::Api(e) => {
                let last = e.is_final();
                (e.to_string(), last)
            }
            Fetch::Local(e) => (format!("cannot write it: {e}"), true),
            Fetch::Stopped => ("stopped".into(), true),
        })
}
