//! Uploads in parts: the upload's row (a `file_uploads` row with `resumable_by` set) and
//! one row per part stored. The parts' bytes are objects in the store, keyed from the
//! upload's object (`service::files::store::part_key`).
//!
//! Invariants (kept by `service::files::parts`):
//! - A part's row is written after its object is stored, so a row always names bytes
//!   that are there; writing a part again replaces its row.
//! - [`super::files::end_upload`] removes the parts' rows with the upload's.

use super::schema::*;
use super::{DbConn, DbError};
use crate::files::UploadRow;
use chrono::NaiveDateTime;
use diesel::prelude::*;

/// A new upload in parts.
#[derive(Debug, Clone, Copy)]
pub struct NewParted<'a> {
    pub space: &'a str,
    pub path: &'a str,
    pub object: &'a str,
    pub user: i64,
    pub size: i64,
    pub sha256: Option<&'a str>,
    pub at: NaiveDateTime,
}

/// Records an upload in parts that reserves its whole size; returns its id.
pub fn start(c: &mut DbConn, new: &NewParted<'_>) -> Result<i64, DbError> {
    diesel::insert_into(file_uploads::table)
        .values((
            file_uploads::space.eq(new.space),
            file_uploads::path.eq(new.path),
            file_uploads::object.eq(new.object),
            file_uploads::reserved.eq(new.size),
            file_uploads::started_at.eq(new.at),
            file_uploads::touched_at.eq(new.at),
            file_uploads::resumable_by.eq(Some(new.user)),
            file_uploads::size.eq(Some(new.size)),
            file_uploads::sha256.eq(new.sha256),
        ))
        .execute(c)?;
    Ok(file_uploads::table
        .filter(file_uploads::object.eq(new.object))
        .select(file_uploads::id)
        .first(c)?)
}

/// The upload in parts `id`, if it is still under way.
pub fn get(c: &mut DbConn, id: i64) -> Result<Option<UploadRow>, DbError> {
    Ok(file_uploads::table
        .find(id)
        .filter(file_uploads::resumable_by.is_not_null())
        .select(UploadRow::as_select())
        .first(c)
        .optional()?)
}

/// The unfinished uploads in parts `user` started, oldest first.
pub fn of_user(c: &mut DbConn, user: i64) -> Result<Vec<UploadRow>, DbError> {
    Ok(file_uploads::table
        .filter(file_uploads::resumable_by.eq(user))
        .order(file_uploads::id)
        .select(UploadRow::as_select())
        .load(c)?)
}

/// The parts of upload `id` stored so far: (number, bytes), ascending.
pub fn parts(c: &mut DbConn, id: i64) -> Result<Vec<(i32, i64)>, DbError> {
    Ok(file_upload_parts::table
        .filter(file_upload_parts::upload_id.eq(id))
        .order(file_upload_parts::n)
        .select((file_upload_parts::n, file_upload_parts::bytes))
        .load(c)?)
}

/// Records part `n` of upload `id` as stored and the upload as alive; false when the
/// upload is gone (given up, completed, or swept).
pub fn put_part(
    c: &mut DbConn,
    id: i64,
    n: i32,
    bytes: i64,
    at: NaiveDateTime,
) -> Result<bool, DbError> {
    super::transaction::<_, DbError, _>(c, |c| {
        let alive = diesel::update(file_uploads::table.find(id))
            .set(file_uploads::touched_at.eq(at))
            .execute(c)?
            == 1;
        if !alive {
            return Ok(false);
        }
        diesel::delete(
            file_upload_parts::table
                .filter(file_upload_parts::upload_id.eq(id))
                .filter(file_upload_parts::n.eq(n)),
        )
        .execute(c)?;
        diesel::insert_into(file_upload_parts::table)
            .values((
                file_upload_parts::upload_id.eq(id),
                file_upload_parts::n.eq(n),
                file_upload_parts::bytes.eq(bytes),
            ))
            .execute(c)?;
        Ok(true)
    })
}
