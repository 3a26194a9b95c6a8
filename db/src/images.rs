//! The image allow-list: the queries. The rules (who may add what, signatures) are in
//! `service::images`.
//!
//! Invariant: one entry per (lab or campus, `name_tag`): a UNIQUE index on
//! `(COALESCE(lab_id, 0), name_tag)`; a second insert is reported as `None`, never as an
//! internal error.

use super::models::ImageAllow;
use super::schema::{image_allows, labs};
use super::DbError;
use super::{now, DbConn};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// What an entry is made of.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    pub lab_id: Option<i64>,
    pub name_tag: &'a str,
    pub digest: &'a str,
    pub description: &'a str,
    pub signature: Option<&'a str>,
    pub signed_by: Option<&'a str>,
    pub created_by: &'a str,
}

/// Stores an entry; `None` when that lab (or the campus) already has `name_tag`.
pub fn insert(c: &mut DbConn, e: &NewEntry) -> Result<Option<ImageAllow>, DbError> {
    let insert = diesel::insert_into(image_allows::table).values((
        image_allows::lab_id.eq(e.lab_id),
        image_allows::name_tag.eq(e.name_tag),
        image_allows::digest.eq(e.digest),
        image_allows::description.eq(e.description),
        image_allows::signature.eq(e.signature),
        image_allows::signed_by.eq(e.signed_by),
        image_allows::created_by.eq(e.created_by),
        image_allows::created_at.eq(now()),
    ));
    match crate::insert_returning_id!(c, insert, image_allows::id) {
        Ok(id) => Ok(Some(get(c, id)?.ok_or(DbError::NotFound("image"))?)),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub fn get(c: &mut DbConn, id: i64) -> Result<Option<ImageAllow>, DbError> {
    Ok(image_allows::table
        .find(id)
        .select(ImageAllow::as_select())
        .first(c)
        .optional()?)
}

pub fn delete(c: &mut DbConn, id: i64) -> Result<bool, DbError> {
    Ok(diesel::delete(image_allows::table.find(id)).execute(c)? > 0)
}

/// The campus entries and those of `labs`, campus first, then by lab and name.
pub fn usable_by(c: &mut DbConn, labs: &[i64]) -> Result<Vec<ImageAllow>, DbError> {
    Ok(image_allows::table
        .filter(
            image_allows::lab_id
                .is_null()
                .or(image_allows::lab_id.eq_any(labs)),
        )
        .order((image_allows::lab_id, image_allows::name_tag))
        .select(ImageAllow::as_select())
        .load(c)?)
}

/// Every entry (operators' view).
pub fn all(c: &mut DbConn) -> Result<Vec<ImageAllow>, DbError> {
    Ok(image_allows::table
        .order((image_allows::lab_id, image_allows::name_tag))
        .select(ImageAllow::as_select())
        .load(c)?)
}

/// The entry a job of `lab` gets for `name_tag`: the lab's own, else the campus's.
pub fn for_job(c: &mut DbConn, lab: i64, name_tag: &str) -> Result<Option<ImageAllow>, DbError> {
    let mut found: Vec<ImageAllow> = image_allows::table
        .filter(image_allows::name_tag.eq(name_tag))
        .filter(
            image_allows::lab_id
                .is_null()
                .or(image_allows::lab_id.eq(lab)),
        )
        .select(ImageAllow::as_select())
        .load(c)?;
    found.sort_by_key(|e| e.lab_id.is_none());
    Ok(found.into_iter().next())
}

/// The campus-wide entry for `name_tag`, if there is one.
pub fn campus(c: &mut DbConn, name_tag: &str) -> Result<Option<ImageAllow>, DbError> {
    Ok(image_allows::table
        .filter(image_allows::name_tag.eq(name_tag))
        .filter(image_allows::lab_id.is_null())
        .select(ImageAllow::as_select())
        .first(c)
        .optional()?)
}

/// Slugs of labs by id, for showing entries.
pub fn lab_slugs(c: &mut DbConn) -> Result<std::collections::BTreeMap<i64, String>, DbError> {
    Ok(labs::table
        .select((labs::id, labs::slug))
        .load::<(i64, String)>(c)?
        .into_iter()
        .collect())
}

/// Sets whether lab `lab`'s jobs may use signed entries only.
pub fn set_require_signed(c: &mut DbConn, lab: i64, on: bool) -> Result<(), DbError> {
    diesel::update(labs::table.find(lab))
        .set(labs::require_signed_images.eq(on))
        .execute(c)?;
    Ok(())
}
