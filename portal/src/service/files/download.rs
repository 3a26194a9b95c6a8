//! Downloads: a file's row says its size, checksum and object; the object's bytes (or
//! the one range asked for, [`super::range`]) stream from the store as they come.

use super::range::{wanted, Wanted};
use super::{check_path, entry, open, Access, FileEntry, Space, Which};
use crate::db::files as rows;
use crate::error::AppError;
use crate::service::{Actor, Ctx};
use bytes::Bytes;
use futures_util::stream::BoxStream;

/// A download under way.
pub enum Download {
    /// The file, or the part asked for (`range`: first and last byte).
    Body {
        file: FileEntry,
        range: Option<(u64, u64)>,
        body: BoxStream<'static, Result<Bytes, object_store::Error>>,
    },
    /// The range asked for lies past the file's end.
    Unsatisfiable { size: u64 },
}

/// The file at `path` of the space `which` names, whole or the range `range_header`
/// asks for. 404 when there is no such file.
pub async fn download(
    ctx: &Ctx,
    actor: &Actor,
    which: Which,
    path: String,
    range_header: Option<&str>,
) -> Result<Download, AppError> {
    check_path(&path)?;
    let actor = actor.clone();
    let space = ctx
        .db
        .run(move |c| open(c, &actor, &which, Access::Read))
        .await?;
    download_from(ctx, space, path, range_header).await
}

/// The file at `path` (checked) of `space`, which the caller may read.
pub(super) async fn download_from(
    ctx: &Ctx,
    space: Space,
    path: String,
    range_header: Option<&str>,
) -> Result<Download, AppError> {
    let row = ctx
        .db
        .run(move |c| rows::get(c, &space.key, &path))
        .await?
        .ok_or(AppError::NotFound("file"))?;
    let object = row.object.clone();
    let file = entry(row);
    let (range, read) = match wanted(range_header, file.size) {
        Wanted::Unsatisfiable => return Ok(Download::Unsatisfiable { size: file.size }),
        Wanted::Whole if file.size == 0 => {
            return Ok(Download::Body {
                file,
                range: None,
                body: Box::pin(futures_util::stream::empty()),
            })
        }
        Wanted::Whole => (None, None),
        Wanted::Part { start, end } => (Some((start, end)), Some(start..end + 1)),
    };
    let body = ctx.files.store.read(&object, read).await?;
    Ok(Download::Body { file, range, body })
}
