//! One upload into a file space, streamed: the body is counted against the quota, hashed
//! and written to the store as it arrives, and becomes the file only when all of it is
//! stored.
//!
//! 1. Check the path and the caller's right to write the space.
//! 2. Reserve the declared length, or a first grant (`quota::start`): 413 before a byte
//!    is read when the declared length does not fit.
//! 3. For each chunk: hash it, count it (past what is reserved, `quota::grow` asks for
//!    more, and 413 stops the upload), and hand it to the store's writer, which holds at
//!    most a few parts.
//! 4. At the end: check the length against the declared one and the checksum against the
//!    one the client sent, if any; complete the object.
//! 5. Commit: the upload's row goes and the file's row is written, in one transaction;
//!    the object it replaced is deleted after.
//!
//! Whatever stops it before step 5 (a refusal, a store failure, the client going away,
//! which drops this future) aborts the object and forgets the upload's row ([`Cleanup`]).

use super::quota::{self, Started};
use super::store::{fresh_key, Writer};
use super::{check_path, open, Access, FileEntry, Space, Which};
use crate::db::files::NewFile;
use crate::db::{self};
use crate::error::AppError;
use crate::service::{Actor, Ctx};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

/// How often a long upload of a declared length tells the database it is alive.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// What an upload made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    pub entry: FileEntry,
    /// A new path (false: an existing file was replaced).
    pub created: bool,
}

/// What is undone if the upload stops before its commit: its row, its object (the writer
/// while it writes, the completed object after).
struct Cleanup {
    ctx: Ctx,
    upload: i64,
    object: String,
    writer: Option<Writer>,
    armed: bool,
}

impl Cleanup {
    async fn run(mut self) {
        self.armed = false;
        undo(
            self.ctx.clone(),
            self.upload,
            self.object.clone(),
            self.writer.take(),
        )
        .await;
    }
}

async fn undo(ctx: Ctx, upload: i64, object: String, writer: Option<Writer>) {
    match writer {
        Some(w) => w.abort().await,
        None => {
            if let Err(e) = ctx.files.store.delete(&object).await {
                tracing::warn!(object, "a refused upload's object stays for the sweep: {e}");
            }
        }
    }
    if let Err(e) = ctx.db.run(move |c| quota::forget(c, upload)).await {
        tracing::warn!(upload, "a refused upload's row stays for the sweep: {e}");
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // The request went away mid-upload (its future was dropped): undo in the
        // background. Outside a runtime, the sweep undoes it later.
        if self.armed {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (ctx, object, writer) =
                    (self.ctx.clone(), self.object.clone(), self.writer.take());
                rt.spawn(undo(ctx, self.upload, object, writer));
            }
        }
    }
}

/// The client's expected checksum, as sent: 64 hex digits, any case.
fn expected_sha(given: Option<&str>) -> Result<Option<String>, AppError> {
    let Some(g) = given else { return Ok(None) };
    let s = g.trim().to_ascii_lowercase();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(Some(s))
    } else {
        Err(AppError::invalid(
            commons_api::files::SHA256_HEADER,
            format!(
                "{} must be the SHA-256 of the body in hex (64 digits), got {g:?}",
                commons_api::files::SHA256_HEADER
            ),
        ))
    }
}

/// Uploads `body` to `path` in the space `which` names: see the module's steps.
/// `declared` is the body's length when the client said it; `sha256` the checksum it
/// expects. The body is borrowed: what is left of it after a refusal is the caller's.
pub async fn upload<S, E>(
    ctx: &Ctx,
    actor: &Actor,
    which: Which,
    path: String,
    declared: Option<u64>,
    sha256: Option<&str>,
    body: &mut S,
) -> Result<Uploaded, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    check_path(&path)?;
    let actor = actor.clone();
    let space = ctx
        .db
        .run(move |c| open(c, &actor, &which, Access::Write))
        .await?;
    upload_into(ctx, space, path, declared, sha256, body).await
}

/// Steps 2 to 5 of an upload into `space`, which the caller may write; `path` is checked.
pub(super) async fn upload_into<S, E>(
    ctx: &Ctx,
    space: Space,
    path: String,
    declared: Option<u64>,
    sha256: Option<&str>,
    body: &mut S,
) -> Result<Uploaded, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let want_sha = expected_sha(sha256)?;
    let (quotas, p, s) = (ctx.files.quotas, path.clone(), space.clone());
    let object = fresh_key(&space.prefix);
    let o = object.clone();
    let started = ctx
        .db
        .run(move |c| quota::start(c, &quotas, &s, &p, &o, declared))
        .await?;
    let mut cleanup = Cleanup {
        ctx: ctx.clone(),
        upload: started.id,
        object: object.clone(),
        writer: None,
        armed: true,
    };
    match ctx.files.store.writer(&object).await {
        Ok(w) => cleanup.writer = Some(w),
        Err(e) => {
            cleanup.run().await;
            return Err(e);
        }
    }
    let received = match receive(ctx, &space, &path, started, declared, body, &mut cleanup).await {
        Ok(r) => r,
        Err(e) => {
            cleanup.run().await;
            return Err(e);
        }
    };
    if let Some(want) = want_sha.filter(|w| *w != received.1) {
        cleanup.run().await;
        return Err(AppError::invalid(
            commons_api::files::SHA256_HEADER,
            format!(
                "the body has SHA-256 {}, but {} says {want}: it was damaged on the way; \
                 nothing was kept, send it again",
                received.1,
                commons_api::files::SHA256_HEADER
            ),
        ));
    }
    let done = commit(ctx, &space, &path, &object, started.id, received).await;
    match done {
        Ok(up) => {
            cleanup.armed = false;
            Ok(up)
        }
        Err(e) => {
            cleanup.run().await;
            Err(e)
        }
    }
}

/// Steps 3 and 4: reads the body into the writer, counting and hashing; completes the
/// object. Returns the bytes and their SHA-256.
async fn receive<S, E>(
    ctx: &Ctx,
    space: &Space,
    path: &str,
    started: Started,
    declared: Option<u64>,
    body: &mut S,
    cleanup: &mut Cleanup,
) -> Result<(i64, String), AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let quotas = ctx.files.quotas;
    let mut hash = Sha256::new();
    let (mut received, mut reserved) = (0i64, started.reserved);
    let mut touched = Instant::now();
    ctx.files.store.check_room(reserved.max(0) as u64).await?;
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| AppError::BadRequest(format!("the upload was cut off: {e}")))?;
        received += chunk.len() as i64;
        if declared.is_some_and(|d| received as u64 > d) {
            return Err(AppError::BadRequest(
                "the body is longer than its Content-Length".into(),
            ));
        }
        if received > reserved {
            let (s, p, id) = (space.clone(), path.to_string(), started.id);
            let got = ctx
                .db
                .run(move |c| quota::grow(c, &quotas, &s, &p, id, received))
                .await?;
            ctx.files
                .store
                .check_room((got - reserved).max(0) as u64)
                .await?;
            (reserved, touched) = (got, Instant::now());
        } else if touched.elapsed() >= TOUCH_EVERY {
            let (p, id) = (path.to_string(), started.id);
            ctx.db
                .run(move |c| quota::touch(c, &p, id, reserved))
                .await?;
            touched = Instant::now();
        }
        hash.update(&chunk);
        if let Some(w) = cleanup.writer.as_mut() {
            w.write(chunk).await?;
        }
    }
    if declared.is_some_and(|d| (received as u64) < d) {
        return Err(AppError::BadRequest(format!(
            "the body ended after {received} of the {} bytes its Content-Length announced",
            declared.unwrap_or_default()
        )));
    }
    if let Some(w) = cleanup.writer.take() {
        w.finish().await?;
    }
    Ok((received, hex::encode(hash.finalize())))
}

/// Step 5: the upload becomes the file; the object it replaced goes.
pub(super) async fn commit(
    ctx: &Ctx,
    space: &Space,
    path: &str,
    object: &str,
    upload: i64,
    (bytes, sha256): (i64, String),
) -> Result<Uploaded, AppError> {
    let at = db::now();
    let (s, p, o, sha) = (
        space.clone(),
        path.to_string(),
        object.to_string(),
        sha256.clone(),
    );
    let replaced = ctx
        .db
        .run(move |c| {
            let new = NewFile {
                space: &s.key,
                path: &p,
                object: &o,
                bytes,
                sha256: &sha,
                at,
            };
            let existed = crate::db::files::get(c, &s.key, &p)?.is_some();
            quota::commit(c, &s, upload, &new).map(|old| (existed, old))
        })
        .await?;
    let (existed, old) = replaced;
    if let Some(old) = old {
        if let Err(e) = ctx.files.store.delete(&old).await {
            tracing::warn!(
                object = old,
                "a replaced file's object stays for the sweep: {e}"
            );
        }
    }
    tracing::info!(space = space.key, bytes, "file stored");
    Ok(Uploaded {
        entry: FileEntry {
            path: path.to_string(),
            size: bytes as u64,
            modified: at,
            sha256,
        },
        created: !existed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_checksums_are_hex() {
        let s = "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
        assert_eq!(
            expected_sha(Some(s)).unwrap().unwrap(),
            s.to_ascii_lowercase()
        );
        assert_eq!(expected_sha(None).unwrap(), None);
        let e = expected_sha(Some("abc")).unwrap_err();
        assert_eq!(e.field(), Some(commons_api::files::SHA256_HEADER));
    }
}
