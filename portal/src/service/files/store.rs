//! The file spaces' side of the campus object store: the store `[checkpoints]` names
//! (a local directory or an S3 bucket), under `files/`. No database in here.
//!
//! Layout, under the store's root:
//! ```text
//! files/users/{user id}/{random 128-bit hex}   one upload's contents
//! files/labs/{lab id}/{random 128-bit hex}
//! ```
//! Invariants:
//! - An object is written once, by one upload, and never changed; the database's `files`
//!   rows say which path it is (see `service::files` for why the path is not the key).
//! - A body is written as it arrives: up to one part ([`PART_BYTES`]) is held, then the
//!   object goes as a multipart upload with at most [`PARTS_IN_FLIGHT`] parts in flight;
//!   a body that ends within its first part is one PUT (S3 refuses a multipart upload of
//!   no part, and a small file costs one request). Until it completes nothing is visible
//!   under its key; an abort leaves nothing (S3: an upload cut off by a crash stays
//!   invisible until the bucket's lifecycle rule for incomplete uploads removes it).

use super::range::{wanted, Wanted};
use crate::error::AppError;
use crate::service::checkpoints;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use std::sync::Arc;

/// The size of one part of a multipart upload (S3 wants at least 5 MiB but the last).
pub const PART_BYTES: usize = 8 << 20;
/// Parts of one upload sent at once: memory per upload stays near (1 + this) parts.
pub const PARTS_IN_FLIGHT: usize = 2;

/// A store failure as users see it; the cause goes to the log.
pub fn unavailable(what: &str, e: object_store::Error) -> AppError {
    tracing::error!("file store: {what}: {e}");
    AppError::Unavailable(format!("the file store could not {what}; try again later"))
}

/// A fresh key for an upload's contents under a space's `prefix`.
pub fn fresh_key(prefix: &str) -> String {
    format!("{prefix}/{}", hex::encode(rand::random::<[u8; 16]>()))
}

/// The key of part `n` of the upload in parts whose object is `object`.
pub fn part_key(object: &str, n: u32) -> String {
    format!("{object}.part{n:06}")
}

/// The upload object a part's key belongs to (`None`: not a part's key).
pub fn part_owner(key: &str) -> Option<&str> {
    let (owner, n) = key.rsplit_once(".part")?;
    (n.len() == 6 && n.bytes().all(|b| b.is_ascii_digit())).then_some(owner)
}

/// The file spaces' view of the campus store: cheap to clone.
#[derive(Clone, Debug)]
pub struct FileStore {
    store: checkpoints::Store,
}

impl FileStore {
    pub fn new(store: checkpoints::Store) -> FileStore {
        FileStore { store }
    }

    async fn objects(&self) -> Result<Arc<dyn ObjectStore>, AppError> {
        self.store.objects().await
    }

    /// Refuses (507) `incoming` bytes that would take a local store under its floor.
    pub async fn check_room(&self, incoming: u64) -> Result<(), AppError> {
        self.store.check_room(incoming).await
    }

    /// A writer of the object `key`, which appears only when [`Writer::finish`] succeeds.
    pub async fn writer(&self, key: &str) -> Result<Writer, AppError> {
        Ok(Writer {
            store: self.objects().await?,
            key: Path::from(key),
            held: Vec::new(),
            held_bytes: 0,
            multipart: None,
        })
    }

    /// The object's bytes `range` (all of it when `None`), as they come from the store.
    pub async fn read(
        &self,
        key: &str,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<BoxStream<'static, Result<Bytes, object_store::Error>>, AppError> {
        let store = self.objects().await?;
        let opts = GetOptions {
            range: range.map(GetRange::Bounded),
            ..Default::default()
        };
        let got = store
            .get_opts(&Path::from(key), opts)
            .await
            .map_err(|e| unavailable("read the file", e))?;
        Ok(got.into_stream().boxed())
    }

    /// A presigned GET of `key` valid for `valid`, when the store signs URLs itself (S3);
    /// `None` for a directory or memory (the portal signs its own URL then).
    pub async fn presigned_get(
        &self,
        key: &str,
        valid: std::time::Duration,
    ) -> Result<Option<String>, AppError> {
        self.store.presigned_get(&Path::from(key), valid).await
    }

    /// The object `key`, whole or the one range `range_header` asks for (see
    /// [`super::range`]); 404 when there is no such object.
    pub async fn read_object(
        &self,
        key: &str,
        range_header: Option<&str>,
    ) -> Result<ObjectRead, AppError> {
        let store = self.objects().await?;
        let path = Path::from(key);
        let size = match store.head(&path).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => return Err(AppError::NotFound("object")),
            Err(e) => return Err(unavailable("read the file", e)),
        };
        let (range, read) = match wanted(range_header, size) {
            Wanted::Unsatisfiable => return Ok(ObjectRead::Unsatisfiable { size }),
            Wanted::Whole if size == 0 => {
                return Ok(ObjectRead::Body {
                    size,
                    range: None,
                    body: Box::pin(futures_util::stream::empty()),
                })
            }
            Wanted::Whole => (None, None),
            Wanted::Part { start, end } => (Some((start, end)), Some(start..end + 1)),
        };
        let body = self.read(key, read).await?;
        Ok(ObjectRead::Body { size, range, body })
    }

    /// Stores `bytes` as the object `key` in one request (one part of an upload in parts).
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), AppError> {
        let store = self.objects().await?;
        store
            .put(&Path::from(key), PutPayload::from(bytes))
            .await
            .map_err(|e| unavailable("store the part", e))?;
        Ok(())
    }

    /// Deletes one object; one already gone is fine.
    pub async fn delete(&self, key: &str) -> Result<(), AppError> {
        let store = self.objects().await?;
        match store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(unavailable("delete a file", e)),
        }
    }

    /// Keys under `files/` last written before `before`, with their sizes.
    pub async fn older_than(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<String>, AppError> {
        let store = self.objects().await?;
        store
            .list(Some(&Path::from("files")))
            .try_filter(|m| futures_util::future::ready(m.last_modified < before))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .map_err(|e| unavailable("list the files", e))
    }
}

/// An object being read for a signed URL.
pub enum ObjectRead {
    /// Its bytes, or the part asked for (`range`: first and last byte); `size`: all of it.
    Body {
        size: u64,
        range: Option<(u64, u64)>,
        body: BoxStream<'static, Result<Bytes, object_store::Error>>,
    },
    /// The range asked for lies past its end.
    Unsatisfiable { size: u64 },
}

/// One object being written: see the module's invariants.
pub struct Writer {
    store: Arc<dyn ObjectStore>,
    key: Path,
    /// What arrived before the first part was full.
    held: Vec<Bytes>,
    held_bytes: usize,
    multipart: Option<WriteMultipart>,
}

impl Writer {
    /// Takes the next bytes, waiting while the parts in flight are at their limit.
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), AppError> {
        if let Some(m) = &mut self.multipart {
            m.wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| unavailable("store the file", e))?;
            m.put(chunk);
            return Ok(());
        }
        self.held_bytes += chunk.len();
        self.held.push(chunk);
        if self.held_bytes >= PART_BYTES {
            let upload = self
                .store
                .put_multipart(&self.key)
                .await
                .map_err(|e| unavailable("start storing the file", e))?;
            let mut m = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            for b in self.held.drain(..) {
                m.put(b);
            }
            self.held_bytes = 0;
            self.multipart = Some(m);
        }
        Ok(())
    }

    /// Completes the object: from here on it is in the store under its key.
    pub async fn finish(self) -> Result<(), AppError> {
        match self.multipart {
            Some(m) => {
                m.finish()
                    .await
                    .map_err(|e| unavailable("store the file", e))?;
            }
            None => {
                let payload: PutPayload = self.held.into_iter().collect();
                self.store
                    .put(&self.key, payload)
                    .await
                    .map_err(|e| unavailable("store the file", e))?;
            }
        }
        Ok(())
    }

    /// Gives up: nothing of the object stays.
    pub async fn abort(self) {
        if let Some(m) = self.multipart {
            if let Err(e) = m.abort().await {
                tracing::warn!(key = %self.key, "an aborted upload's parts may stay: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_keys_lead_back_to_their_upload() {
        let k = part_key("files/users/7/abc", 12);
        assert_eq!(k, "files/users/7/abc.part000012");
        assert_eq!(part_owner(&k), Some("files/users/7/abc"));
        assert_eq!(part_owner("files/users/7/abc"), None);
        assert_eq!(part_owner("files/users/7/abc.partial"), None);
    }
}
