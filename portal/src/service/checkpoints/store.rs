//! The object store that holds checkpoint archives: a local directory (the default) or
//! an S3-compatible bucket, through `object_store`. No database in here.
//!
//! Layout, under the store's root (the directory, or the bucket's prefix):
//! ```text
//! jobs/{job}/{attempt}/{seq}/part-{n:05}-{sha256}   one uploaded part
//! jobs/{job}/{attempt}/{seq}/manifest.json          written at commit (CheckpointManifest)
//! ```
//! `seq` is the attempt's commit number: parts are uploaded under the next one, and a
//! commit turns that prefix into a checkpoint without moving anything; the next upload
//! goes to `seq + 1`.
//!
//! Invariants:
//! - A part's name carries its checksum, so the list of parts is one LIST, and a part
//!   uploaded again with other contents is a new object (the old one is deleted after).
//!   Two objects for one part number (a crash between the two) count as no part at all.
//! - Every write is a single atomic PUT (parts are at most `part_mb`).
//! - A local store's directory is made on first use, not at start.
//! - A local store keeps a free-space floor on its filesystem ([`Store::check_room`],
//!   `statvfs`): the store sits beside the SQLite file by default, and a disk filled by
//!   checkpoints would stop the database too. S3 has no floor here (the bucket's quotas).

use crate::config::{CheckpointLocation, Config};
use crate::error::AppError;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The name of a committed checkpoint's manifest, beside its parts.
pub const MANIFEST: &str = "manifest.json";

/// How checkpoints are kept (from `[checkpoints]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub keep_per_job: u32,
    pub lab_cap_gb: f64,
    pub part_bytes: u64,
    /// The campus's cap on one attempt's checkpoint (read it through
    /// `checkpoints::attempt_cap_bytes`, which knows the job).
    pub attempt_cap_gb: f64,
}

/// The free space a local directory store keeps on its filesystem: the larger of the two.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    pub min_free_gb: f64,
    pub min_free_percent: f64,
}

impl Floor {
    /// The floor in bytes on a filesystem of `size` bytes.
    pub fn bytes(&self, size: u64) -> u64 {
        let by_share = size as f64 * self.min_free_percent / 100.0;
        (self.min_free_gb * 1e9).max(by_share).ceil() as u64
    }
}

/// A filesystem's space, from `statvfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still use (`f_bavail`).
    pub free: u64,
    /// Bytes in all (`f_blocks`).
    pub size: u64,
}

/// The space of the filesystem holding `path`.
pub fn space(path: &std::path::Path) -> std::io::Result<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter
    // that statvfs fills in; it is read only when the call succeeded.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok(Space {
        free: (st.f_bavail as u64).saturating_mul(frsize),
        size: (st.f_blocks as u64).saturating_mul(frsize),
    })
}

/// The checkpoint store: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    limits: Limits,
    /// A local directory's free-space floor (none for S3 and in memory).
    floor: Option<Floor>,
    /// `file:///...` or `s3://bucket/prefix`, for logs.
    describe: String,
    /// S3: the bucket itself and the store's prefix in it, to presign GETs.
    signer: Option<(Arc<object_store::aws::AmazonS3>, Path)>,
}

enum Backend {
    /// A directory, opened on first use.
    Dir {
        dir: PathBuf,
        opened: tokio::sync::OnceCell<Arc<dyn ObjectStore>>,
    },
    Ready(Arc<dyn ObjectStore>),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("at", &self.inner.describe)
            .field("limits", &self.inner.limits)
            .finish()
    }
}

/// One part found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPart {
    pub n: u32,
    pub bytes: u64,
    pub sha256: String,
}

/// A store failure as users see it; the cause goes to the log.
pub fn unavailable(what: &str, e: object_store::Error) -> AppError {
    tracing::error!("checkpoint store: {what}: {e}");
    AppError::Unavailable(format!(
        "the checkpoint store could not {what}; try again later"
    ))
}

/// `jobs/{job}`: everything a job has in the store.
pub fn job_prefix(job: i64) -> Path {
    Path::from(format!("jobs/{job}"))
}

/// `jobs/{job}/{attempt}/{seq}`: one commit's parts and manifest.
pub fn commit_prefix(job: i64, attempt: i32, seq: i32) -> Path {
    Path::from(format!("jobs/{job}/{attempt}/{seq}"))
}

/// The object of part `n` with checksum `sha256` under `prefix`.
pub fn part_path(prefix: &Path, n: u32, sha256: &str) -> Path {
    prefix.clone().join(format!("part-{n:05}-{sha256}"))
}

/// (n, sha256) of a part's file name, `None` for any other object.
pub fn parse_part_name(name: &str) -> Option<(u32, String)> {
    let (n, sha) = name.strip_prefix("part-")?.split_once('-')?;
    let num: u32 = n.parse().ok()?;
    (format!("{num:05}") == n && is_sha256(sha)).then(|| (num, sha.to_string()))
}

/// 64 lowercase hex digits.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Store {
    /// The store `[checkpoints]` names. Nothing is contacted or created yet.
    pub fn from_config(config: &Config) -> anyhow::Result<Store> {
        let c = &config.checkpoints;
        let limits = Limits {
            keep_per_job: c.keep_per_job.max(1),
            lab_cap_gb: c.lab_cap_gb,
            part_bytes: c.part_bytes(),
            attempt_cap_gb: c.attempt_cap_gb,
        };
        let floor = Floor {
            min_free_gb: c.min_free_gb,
            min_free_percent: c.min_free_percent,
        };
        let mut signer = None;
        let (backend, describe, floor) = match c.location(&config.database_url)? {
            CheckpointLocation::Dir(dir) => {
                let describe = format!("file://{}", dir.display());
                (
                    Backend::Dir {
                        dir,
                        opened: Default::default(),
                    },
                    describe,
                    Some(floor),
                )
            }
            CheckpointLocation::S3 { bucket, prefix } => {
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&bucket)
                    .with_region(c.region.as_deref().unwrap_or("us-east-1"))
                    .with_allow_http(c.allow_http);
                if let Some(endpoint) = &c.endpoint {
                    b = b.with_endpoint(endpoint);
                }
                if let (Some(id), Some(secret)) = (&c.access_key_id, c.secret()?) {
                    b = b.with_access_key_id(id).with_secret_access_key(secret.0);
                }
                let s3 = Arc::new(b.build()?);
                signer = Some((s3.clone(), Path::from(prefix.as_str())));
                let s3: Arc<dyn ObjectStore> = s3;
                let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                    s3
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(
                        s3,
                        Path::from(prefix.as_str()),
                    ))
                };
                (
                    Backend::Ready(store),
                    format!("s3://{bucket}/{prefix}"),
                    None,
                )
            }
        };
        Ok(Store {
            inner: Arc::new(Inner {
                backend,
                limits,
                floor,
                describe,
                signer,
            }),
        })
    }

    /// A store in memory (tests).
    pub fn in_memory(limits: Limits) -> Store {
        Store {
            inner: Arc::new(Inner {
                backend: Backend::Ready(Arc::new(object_store::memory::InMemory::new())),
                limits,
                floor: None,
                describe: "memory".into(),
                signer: None,
            }),
        }
    }

    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// A presigned GET of `path` (under the store's prefix) valid for `valid`, made by
    /// the store's own signer: S3 only (`None` for a directory or memory). Nothing is
    /// contacted: the bucket's credentials sign it here.
    pub async fn presigned_get(
        &self,
        path: &Path,
        valid: std::time::Duration,
    ) -> Result<Option<String>, AppError> {
        use object_store::signer::{Method, Signer};
        let Some((s3, prefix)) = &self.inner.signer else {
            return Ok(None);
        };
        let full: Path = prefix.parts().chain(path.parts()).collect();
        let url = s3
            .signed_url(Method::GET, &full, valid)
            .await
            .map_err(|e| unavailable("sign a URL of the file", e))?;
        Ok(Some(url.to_string()))
    }

    /// Where it keeps things, for logs and the docs.
    pub fn describe(&self) -> &str {
        &self.inner.describe
    }

    pub(crate) async fn objects(&self) -> Result<Arc<dyn ObjectStore>, AppError> {
        match &self.inner.backend {
            Backend::Ready(s) => Ok(s.clone()),
            Backend::Dir { dir, opened } => opened
                .get_or_try_init(|| async {
                    let dir = dir.clone();
                    let made = tokio::task::spawn_blocking(move || {
                        std::fs::create_dir_all(&dir)?;
                        let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                            .map_err(std::io::Error::other)?
                            .with_automatic_cleanup(true)
                            .with_fsync(true);
                        Ok::<_, std::io::Error>(Arc::new(fs) as Arc<dyn ObjectStore>)
                    })
                    .await
                    .map_err(|e| AppError::Internal(e.into()))?;
                    made.map_err(|e| {
                        tracing::error!("checkpoint store {}: {e}", self.inner.describe);
                        AppError::Unavailable(
                            "the checkpoint store's directory cannot be used".into(),
                        )
                    })
                })
                .await
                .cloned(),
        }
    }

    /// Refuses (507) a write of `incoming` bytes that would leave a local store's
    /// filesystem under its floor. Stores without a floor (S3, memory) take it.
    pub async fn check_room(&self, incoming: u64) -> Result<(), AppError> {
        let (Some(floor), Backend::Dir { dir, .. }) = (self.inner.floor, &self.inner.backend)
        else {
            return Ok(());
        };
        // The directory exists from here on (statvfs needs it).
        self.objects().await?;
        let at = dir.clone();
        let measured = tokio::task::spawn_blocking(move || space(&at))
            .await
            .map_err(|e| AppError::Internal(e.into()))?;
        let s = measured.map_err(|e| {
            tracing::error!("checkpoint store {}: statvfs: {e}", self.inner.describe);
            AppError::Unavailable("the checkpoint store's free space cannot be read".into())
        })?;
        let keep = floor.bytes(s.size);
        if s.free.saturating_sub(incoming) >= keep {
            return Ok(());
        }
        tracing::warn!(
            free = s.free,
            size = s.size,
            floor = keep,
            "checkpoint store at its free-space floor: uploads refused"
        );
        Err(AppError::InsufficientStorage(format!(
            "the checkpoint store has {} GB free of {} GB, and keeps at least {} GB free \
             (its floor: the larger of {} GB and {} % of the disk): uploads resume once \
             space is freed",
            super::gb(s.free as f64),
            super::gb(s.size as f64),
            super::gb(keep as f64),
            floor.min_free_gb,
            floor.min_free_percent,
        )))
    }

    /// The parts under `prefix`, by number: each with every object found for it (one,
    /// unless a replacement was interrupted).
    pub async fn parts(&self, prefix: &Path) -> Result<BTreeMap<u32, Vec<StoredPart>>, AppError> {
        let store = self.objects().await?;
        let found: Vec<_> = store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| unavailable("list the parts", e))?;
        let mut parts: BTreeMap<u32, Vec<StoredPart>> = BTreeMap::new();
        for meta in found {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            if let Some((n, sha256)) = parse_part_name(name) {
                parts.entry(n).or_default().push(StoredPart {
                    n,
                    bytes: meta.size,
                    sha256,
                });
            }
        }
        Ok(parts)
    }

    pub async fn put(&self, path: &Path, data: Bytes) -> Result<(), AppError> {
        let store = self.objects().await?;
        store
            .put(path, data.into())
            .await
            .map_err(|e| unavailable("store the data", e))?;
        Ok(())
    }

    /// Reads a whole (small) object; `None` when it is not there.
    pub async fn read(&self, path: &Path) -> Result<Option<Bytes>, AppError> {
        let store = self.objects().await?;
        match store.get(path).await {
            Ok(got) => Ok(Some(
                got.bytes()
                    .await
                    .map_err(|e| unavailable("read the data", e))?,
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable("read the data", e)),
        }
    }

    /// The objects at `paths`, one after the other, as one stream.
    pub async fn concat(
        &self,
        paths: Vec<Path>,
    ) -> Result<BoxStream<'static, Result<Bytes, object_store::Error>>, AppError> {
        let store = self.objects().await?;
        Ok(futures_util::stream::iter(paths)
            .then(move |p| {
                let store = store.clone();
                async move { store.get(&p).await }
            })
            .map_ok(|got| got.into_stream())
            .try_flatten()
            .boxed())
    }

    /// Deletes one object; one already gone is fine.
    pub async fn delete(&self, path: &Path) -> Result<(), AppError> {
        let store = self.objects().await?;
        match store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(unavailable("delete an object", e)),
        }
    }

    /// Deletes everything under `prefix`; returns how many objects went.
    pub async fn delete_prefix(&self, prefix: &Path) -> Result<usize, AppError> {
        let store = self.objects().await?;
        let found: Vec<Path> = store
            .list(Some(prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| unavailable("list objects", e))?;
        let n = found.len();
        let gone: Vec<Path> = store
            .delete_stream(futures_util::stream::iter(found.into_iter().map(Ok)).boxed())
            .try_collect()
            .await
            .or_else(|e| match e {
                object_store::Error::NotFound { .. } => Ok(Vec::new()),
                e => Err(unavailable("delete objects", e)),
            })?;
        Ok(n.max(gone.len()))
    }

    /// The jobs that have anything in the store.
    pub async fn jobs(&self) -> Result<Vec<i64>, AppError> {
        let store = self.objects().await?;
        let listed = store
            .list_with_delimiter(Some(&Path::from("jobs")))
            .await
            .map_err(|e| unavailable("list the jobs", e))?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename()?.parse().ok())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn the_floor_is_the_larger_of_its_two_figures() {
        let f = Floor {
            min_free_gb: 2.0,
            min_free_percent: 5.0,
        };
        assert_eq!(f.bytes(10_000_000_000), 2_000_000_000);
        assert_eq!(f.bytes(100_000_000_000), 5_000_000_000);
        let none = Floor {
            min_free_gb: 0.0,
            min_free_percent: 0.0,
        };
        assert_eq!(none.bytes(1 << 40), 0);
        let s = space(std::path::Path::new("/")).unwrap();
        assert!(s.size > 0 && s.free <= s.size, "{s:?}");
        assert!(space(std::path::Path::new("/no/such/dir")).is_err());
    }

    #[test]
    fn part_names_carry_number_and_checksum() {
        let p = part_path(&commit_prefix(7, 2, 1), 3, SHA);
        assert_eq!(p.as_ref(), format!("jobs/7/2/1/part-00003-{SHA}"));
        assert_eq!(
            parse_part_name(p.filename().unwrap()),
            Some((3, SHA.to_string()))
        );
        assert_eq!(parse_part_name(MANIFEST), None);
        assert_eq!(parse_part_name("part-x-y"), None);
        assert_eq!(parse_part_name(&format!("part-3-{SHA}")), None);
        assert_eq!(parse_part_name(&format!("part-1-{}", &SHA[1..])), None);
        assert!(!is_sha256(&SHA.to_uppercase()));
    }

    #[tokio::test]
    async fn parts_list_deletes_and_concatenates() {
        let store = Store::in_memory(Limits {
            keep_per_job: 2,
            lab_cap_gb: 1.0,
            part_bytes: 16,
            attempt_cap_gb: 1.0,
        });
        let prefix = commit_prefix(1, 1, 1);
        store
            .put(&part_path(&prefix, 1, SHA), Bytes::from_static(b"world"))
            .await
            .unwrap();
        store
            .put(&part_path(&prefix, 0, SHA), Bytes::from_static(b"hello "))
            .await
            .unwrap();
        store
            .put(&prefix.clone().join(MANIFEST), Bytes::from_static(b"{}"))
            .await
            .unwrap();
        let parts = store.parts(&prefix).await.unwrap();
        assert_eq!(parts.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(parts[&0][0].bytes, 6);
        let all: Vec<Bytes> = store
            .concat(vec![part_path(&prefix, 0, SHA), part_path(&prefix, 1, SHA)])
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(all.concat(), b"hello world");
        assert_eq!(store.jobs().await.unwrap(), vec![1]);
        assert_eq!(store.delete_prefix(&job_prefix(1)).await.unwrap(), 3);
        assert!(store.parts(&prefix).await.unwrap().is_empty());
        assert!(store.jobs().await.unwrap().is_empty());
        assert_eq!(store.read(&prefix.join(MANIFEST)).await.unwrap(), None);
    }
}
