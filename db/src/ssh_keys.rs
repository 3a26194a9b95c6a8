//! Users' SSH public keys: the queries. The rules a key must pass are in
//! the portal's `pubkey`, the use cases (limits, ownership, audit) in `service::ssh_keys`.
//!
//! For the SSH gateway: [`keys_of_user`] gives the keys a job's owner may log in with,
//! and [`touch`] records that one was used.
//!
//! Invariant: a fingerprint is stored once across all users (a UNIQUE column); a second
//! insert of it is reported as `None`, never as an internal error.

use super::models::SshKey;
use super::schema::{ssh_keys, users};
use super::DbError;
use super::{now, DbConn};
use crate::domain::ParsedKey;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// A user's keys, oldest first.
pub fn keys_of_user(c: &mut DbConn, user_id: i64) -> Result<Vec<SshKey>, DbError> {
    Ok(ssh_keys::table
        .filter(ssh_keys::user_id.eq(user_id))
        .order(ssh_keys::id)
        .select(SshKey::as_select())
        .load(c)?)
}

/// Records that key `key_id` was just used to log in (`last_used_at` = now). A key
/// removed meanwhile is no error.
pub fn touch(c: &mut DbConn, key_id: i64) -> Result<(), DbError> {
    diesel::update(ssh_keys::table.find(key_id))
        .set(ssh_keys::last_used_at.eq(now()))
        .execute(c)?;
    Ok(())
}

/// How many keys a user has.
pub fn count_of_user(c: &mut DbConn, user_id: i64) -> Result<i64, DbError> {
    Ok(ssh_keys::table
        .filter(ssh_keys::user_id.eq(user_id))
        .count()
        .get_result(c)?)
}

/// Is this fingerprint registered, by anyone?
pub fn fingerprint_taken(c: &mut DbConn, fingerprint: &str) -> Result<bool, DbError> {
    Ok(diesel::select(diesel::dsl::exists(
        ssh_keys::table.filter(ssh_keys::fingerprint.eq(fingerprint)),
    ))
    .get_result(c)?)
}

/// Stores a checked key for a user; `None` when its fingerprint is already registered.
pub fn insert(c: &mut DbConn, user_id: i64, key: &ParsedKey) -> Result<Option<SshKey>, DbError> {
    let insert = diesel::insert_into(ssh_keys::table).values((
        ssh_keys::user_id.eq(user_id),
        ssh_keys::name.eq(&key.name),
        ssh_keys::algorithm.eq(&key.algorithm),
        ssh_keys::fingerprint.eq(&key.fingerprint),
        ssh_keys::public_key.eq(&key.public_key),
        ssh_keys::created_at.eq(now()),
    ));
    let id = match crate::insert_returning_id!(c, insert, ssh_keys::id) {
        Ok(id) => id,
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(Some(
        ssh_keys::table
            .find(id)
            .select(SshKey::as_select())
            .first(c)?,
    ))
}

/// Key `key_id` if it is `user_id`'s.
pub fn own_key(c: &mut DbConn, user_id: i64, key_id: i64) -> Result<Option<SshKey>, DbError> {
    Ok(ssh_keys::table
        .find(key_id)
        .filter(ssh_keys::user_id.eq(user_id))
        .select(SshKey::as_select())
        .first(c)
        .optional()?)
}

/// Deletes key `key_id` of `user_id`; false when there was none.
pub fn delete_own(c: &mut DbConn, user_id: i64, key_id: i64) -> Result<bool, DbError> {
    let n = diesel::delete(
        ssh_keys::table
            .find(key_id)
            .filter(ssh_keys::user_id.eq(user_id)),
    )
    .execute(c)?;
    Ok(n > 0)
}

/// Locks the user's row until the transaction ends, so that two requests adding keys
/// for the same user count that user's keys one after the other (PostgreSQL; SQLite
/// has one writer anyway).
pub fn lock_user(c: &mut DbConn, user_id: i64) -> Result<(), DbError> {
    diesel::update(users::table.find(user_id))
        .set(users::display_name.eq(users::display_name))
        .execute(c)?;
    Ok(())
}
