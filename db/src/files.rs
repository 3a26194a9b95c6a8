//! Files in the campus object store: the rows of users' and labs' files, of uploads under
//! way, and the quotas set on them. The store holds the bytes; these rows say what each
//! space holds, so listings, quotas and downloads never list or read the store.
//!
//! Invariants (kept by `service::files`):
//! - One row per (space, path); its `object` is the store key of its contents, a fresh
//!   one per upload. A file is replaced by pointing its row at the new object.
//! - An upload's row is written before its object, and counts its `reserved` bytes
//!   against the space's quota until it is committed (its row goes in the transaction
//!   that writes the file's row) or abandoned.
//! - Writers of a space's quota take [`lock_space`] first: PostgreSQL counts concurrent
//!   uploads of one space one after the other (SQLite serialises writers anyway).

use super::schema::*;
use super::{DbConn, DbError};
use chrono::NaiveDateTime;
use diesel::prelude::*;

/// One file.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = files)]
pub struct FileRow {
    pub id: i64,
    pub space: String,
    pub path: String,
    pub object: String,
    pub bytes: i64,
    pub sha256: String,
    pub modified_at: NaiveDateTime,
}

/// One upload under way.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = file_uploads)]
pub struct UploadRow {
    pub id: i64,
    pub space: String,
    pub path: String,
    pub object: String,
    pub reserved: i64,
    pub started_at: NaiveDateTime,
    pub touched_at: NaiveDateTime,
    /// The user who started it, for an upload in parts (`None`: one streamed body).
    pub resumable_by: Option<i64>,
    /// The file's size, for an upload in parts.
    pub size: Option<i64>,
    /// The SHA-256 its parts must join into, when its start named one.
    pub sha256: Option<String>,
}

/// A new file's contents, as an upload committed them.
#[derive(Debug, Clone, Copy)]
pub struct NewFile<'a> {
    pub space: &'a str,
    pub path: &'a str,
    pub object: &'a str,
    pub bytes: i64,
    pub sha256: &'a str,
    pub at: NaiveDateTime,
}

/// Holds the space's row until the transaction ends (PostgreSQL), so that concurrent
/// uploads into one space count against its quota one after the other.
pub fn lock_space(c: &mut DbConn, space: &str) -> Result<(), DbError> {
    if let DbConn::Pg(pg) = c {
        diesel::sql_query("INSERT INTO file_spaces (space) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind::<diesel::sql_types::Text, _>(space)
            .execute(pg)?;
        file_spaces::table
            .find(space)
            .select(file_spaces::space)
            .for_update()
            .first::<String>(pg)?;
    }
    Ok(())
}

/// The file at `path`, if there is one.
pub fn get(c: &mut DbConn, space: &str, path: &str) -> Result<Option<FileRow>, DbError> {
    Ok(files::table
        .filter(files::space.eq(space))
        .filter(files::path.eq(path))
        .select(FileRow::as_select())
        .first(c)
        .optional()?)
}

/// `LIKE` pattern for a literal prefix, with `\` as the escape.
fn like_prefix(prefix: &str) -> String {
    let mut p = String::with_capacity(prefix.len() + 1);
    for ch in prefix.chars() {
        if matches!(ch, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(ch);
    }
    p.push('%');
    p
}

/// The space's files whose path starts with `prefix` (byte for byte), by path.
pub fn list(c: &mut DbConn, space: &str, prefix: &str) -> Result<Vec<FileRow>, DbError> {
    let mut q = files::table
        .filter(files::space.eq(space))
        .select(FileRow::as_select())
        .into_boxed();
    if !prefix.is_empty() {
        q = q.filter(files::path.like(like_prefix(prefix)).escape('\\'));
    }
    let mut rows: Vec<FileRow> = q.load(c)?;
    // SQLite's LIKE ignores ASCII case: the pattern narrows, this decides.
    rows.retain(|r| r.path.starts_with(prefix));
    // Sorted here: PostgreSQL's collation may not order by bytes.
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(rows)
}

/// Bytes and number of the space's files.
pub fn space_bytes(c: &mut DbConn, space: &str) -> Result<(i64, i64), DbError> {
    // Summed here: SUM over BIGINT is NUMERIC on PostgreSQL and BIGINT on SQLite.
    let sizes: Vec<i64> = files::table
        .filter(files::space.eq(space))
        .select(files::bytes)
        .load(c)?;
    Ok((sizes.iter().sum(), sizes.len() as i64))
}

/// The space's uploads under way.
pub fn uploads_of(c: &mut DbConn, space: &str) -> Result<Vec<UploadRow>, DbError> {
    Ok(file_uploads::table
        .filter(file_uploads::space.eq(space))
        .order(file_uploads::id)
        .select(UploadRow::as_select())
        .load(c)?)
}

/// Records an upload about to start; returns its id.
pub fn start_upload(
    c: &mut DbConn,
    space: &str,
    path: &str,
    object: &str,
    reserved: i64,
    at: NaiveDateTime,
) -> Result<i64, DbError> {
    diesel::insert_into(file_uploads::table)
        .values((
            file_uploads::space.eq(space),
            file_uploads::path.eq(path),
            file_uploads::object.eq(object),
            file_uploads::reserved.eq(reserved),
            file_uploads::started_at.eq(at),
            file_uploads::touched_at.eq(at),
        ))
        .execute(c)?;
    Ok(file_uploads::table
        .filter(file_uploads::object.eq(object))
        .select(file_uploads::id)
        .first(c)?)
}

/// The upload `id`, if it is still under way.
pub fn upload(c: &mut DbConn, id: i64) -> Result<Option<UploadRow>, DbError> {
    Ok(file_uploads::table
        .find(id)
        .select(UploadRow::as_select())
        .first(c)
        .optional()?)
}

/// Sets an upload's reserved bytes and its last sign of life; false when it is gone.
pub fn touch_upload(
    c: &mut DbConn,
    id: i64,
    reserved: i64,
    at: NaiveDateTime,
) -> Result<bool, DbError> {
    let n = diesel::update(file_uploads::table.find(id))
        .set((
            file_uploads::reserved.eq(reserved),
            file_uploads::touched_at.eq(at),
        ))
        .execute(c)?;
    Ok(n == 1)
}

/// Forgets an upload and its parts' rows; false when it was gone already.
pub fn end_upload(c: &mut DbConn, id: i64) -> Result<bool, DbError> {
    diesel::delete(file_upload_parts::table.filter(file_upload_parts::upload_id.eq(id)))
        .execute(c)?;
    Ok(diesel::delete(file_uploads::table.find(id)).execute(c)? == 1)
}

/// Uploads not touched since `before` (uploads in parts: since `parts_before`): their
/// portal died, they hang, or nobody came back to finish them.
pub fn stale_uploads(
    c: &mut DbConn,
    before: NaiveDateTime,
    parts_before: NaiveDateTime,
) -> Result<Vec<UploadRow>, DbError> {
    Ok(file_uploads::table
        .filter(
            file_uploads::resumable_by
                .is_null()
                .and(file_uploads::touched_at.lt(before))
                .or(file_uploads::resumable_by
                    .is_not_null()
                    .and(file_uploads::touched_at.lt(parts_before))),
        )
        .select(UploadRow::as_select())
        .load(c)?)
}

/// Writes the file's row (replacing the row at its path); returns the object it replaced.
pub fn put(c: &mut DbConn, new: &NewFile<'_>) -> Result<Option<String>, DbError> {
    let old = get(c, new.space, new.path)?;
    if let Some(old) = &old {
        diesel::update(files::table.find(old.id))
            .set((
                files::object.eq(new.object),
                files::bytes.eq(new.bytes),
                files::sha256.eq(new.sha256),
                files::modified_at.eq(new.at),
            ))
            .execute(c)?;
    } else {
        diesel::insert_into(files::table)
            .values((
                files::space.eq(new.space),
                files::path.eq(new.path),
                files::object.eq(new.object),
                files::bytes.eq(new.bytes),
                files::sha256.eq(new.sha256),
                files::modified_at.eq(new.at),
            ))
            .execute(c)?;
    }
    Ok(old.map(|o| o.object).filter(|o| o != new.object))
}

/// Deletes the file's row; returns it when there was one.
pub fn delete(c: &mut DbConn, space: &str, path: &str) -> Result<Option<FileRow>, DbError> {
    let old = get(c, space, path)?;
    if let Some(row) = &old {
        diesel::delete(files::table.find(row.id)).execute(c)?;
    }
    Ok(old)
}

/// Whether any file or upload names `object` (the sweep keeps those).
pub fn object_known(c: &mut DbConn, object: &str) -> Result<bool, DbError> {
    let files: i64 = files::table
        .filter(files::object.eq(object))
        .count()
        .get_result(c)?;
    let uploads: i64 = file_uploads::table
        .filter(file_uploads::object.eq(object))
        .count()
        .get_result(c)?;
    Ok(files + uploads > 0)
}

/// A lab's own quota for its shared space, in GB (`None`: the campus default).
pub fn lab_quota_gb(c: &mut DbConn, lab: i64) -> Result<Option<f64>, DbError> {
    Ok(labs::table
        .find(lab)
        .select(labs::files_quota_gb)
        .first(c)?)
}

/// Sets (or, with `None`, clears) a lab's own quota for its shared space.
pub fn set_lab_quota_gb(c: &mut DbConn, lab: i64, gb: Option<f64>) -> Result<(), DbError> {
    diesel::update(labs::table.find(lab))
        .set(labs::files_quota_gb.eq(gb))
        .execute(c)?;
    Ok(())
}

/// The quotas the user's labs set on their own space, in GB.
pub fn member_quotas_gb(c: &mut DbConn, user: i64) -> Result<Vec<f64>, DbError> {
    let set: Vec<Option<f64>> = memberships::table
        .filter(memberships::user_id.eq(user))
        .select(memberships::files_quota_gb)
        .load(c)?;
    Ok(set.into_iter().flatten().collect())
}

/// The quota lab `lab` gives `user` for their own space, in GB; `None` when the user is
/// not a member (`Some(None)`: a member without one).
pub fn member_quota_gb(
    c: &mut DbConn,
    lab: i64,
    user: i64,
) -> Result<Option<Option<f64>>, DbError> {
    Ok(memberships::table
        .filter(memberships::lab_id.eq(lab))
        .filter(memberships::user_id.eq(user))
        .select(memberships::files_quota_gb)
        .first(c)
        .optional()?)
}

/// Sets (or clears) the quota lab `lab` gives member `user` for their own space; false
/// when they are not a member.
pub fn set_member_quota_gb(
    c: &mut DbConn,
    lab: i64,
    user: i64,
    gb: Option<f64>,
) -> Result<bool, DbError> {
    let n = diesel::update(
        memberships::table
            .filter(memberships::lab_id.eq(lab))
            .filter(memberships::user_id.eq(user)),
    )
    .set(memberships::files_quota_gb.eq(gb))
    .execute(c)?;
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_escape_wildcards() {
        assert_eq!(like_prefix("a%b_c\\d/"), "a\\%b\\_c\\\\d/%");
        assert_eq!(like_prefix(""), "%");
    }
}
