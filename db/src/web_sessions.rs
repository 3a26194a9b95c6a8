//! Browser sessions kept server-side (see `auth::store`).
//!
//! Invariants: a session key is stored only as its SHA-256; a row past its `expires_at` is
//! never read as a session (and is removed when new sessions are made); deleting a row
//! ends the session on every replica at once, because every request reads it.

use super::schema::web_sessions;
use super::users::hash_secret;
use super::DbError;
use super::{now, DbConn};
use chrono::Duration;
use diesel::prelude::*;

/// A session's state as it is stored: the middleware's map as JSON, and the signed-in
/// user (if any) apart, so all of a user's sessions can be ended together.
pub struct Stored {
    pub state: String,
}

/// The live session of `key`, if there is one.
pub fn load(c: &mut DbConn, key: &str) -> Result<Option<Stored>, DbError> {
    let state = web_sessions::table
        .filter(web_sessions::id_hash.eq(hash_secret(key)))
        .filter(web_sessions::expires_at.gt(now()))
        .select(web_sessions::state)
        .first::<String>(c)
        .optional()?;
    Ok(state.map(|state| Stored { state }))
}

/// Stores a new session; also removes expired ones.
pub fn insert(
    c: &mut DbConn,
    key: &str,
    user: Option<i64>,
    state: &str,
    ttl_s: i64,
) -> Result<(), DbError> {
    let at = now();
    diesel::delete(web_sessions::table.filter(web_sessions::expires_at.le(at))).execute(c)?;
    diesel::insert_into(web_sessions::table)
        .values((
            web_sessions::id_hash.eq(hash_secret(key)),
            web_sessions::user_id.eq(user),
            web_sessions::state.eq(state),
            web_sessions::created_at.eq(at),
            web_sessions::expires_at.eq(at + Duration::seconds(ttl_s)),
        ))
        .execute(c)?;
    Ok(())
}

/// Replaces a live session's state; false when there is no live session of `key`.
pub fn update(
    c: &mut DbConn,
    key: &str,
    user: Option<i64>,
    state: &str,
    ttl_s: i64,
) -> Result<bool, DbError> {
    let at = now();
    let n = diesel::update(
        web_sessions::table
            .filter(web_sessions::id_hash.eq(hash_secret(key)))
            .filter(web_sessions::expires_at.gt(at)),
    )
    .set((
        web_sessions::user_id.eq(user),
        web_sessions::state.eq(state),
        web_sessions::expires_at.eq(at + Duration::seconds(ttl_s)),
    ))
    .execute(c)?;
    Ok(n > 0)
}

/// Pushes a live session's idle expiry out to `ttl_s` from now (`anonymous_ttl_s` for a
/// session without a signed-in user). Written only when that moves it by more than
/// `slack_s`, so a busy page is not a write per request.
pub fn touch(
    c: &mut DbConn,
    key: &str,
    ttl_s: i64,
    anonymous_ttl_s: i64,
    slack_s: i64,
) -> Result<(), DbError> {
    let at = now();
    let hash = hash_secret(key);
    for (signed_in, ttl) in [(true, ttl_s), (false, anonymous_ttl_s)] {
        let until = at + Duration::seconds(ttl);
        let q = web_sessions::table
            .filter(web_sessions::id_hash.eq(&hash))
            .filter(web_sessions::expires_at.gt(at))
            .filter(web_sessions::expires_at.lt(until - Duration::seconds(slack_s)));
        if signed_in {
            diesel::update(q.filter(web_sessions::user_id.is_not_null()))
                .set(web_sessions::expires_at.eq(until))
                .execute(c)?;
        } else {
            diesel::update(q.filter(web_sessions::user_id.is_null()))
                .set(web_sessions::expires_at.eq(until))
                .execute(c)?;
        }
    }
    Ok(())
}

pub fn delete(c: &mut DbConn, key: &str) -> Result<(), DbError> {
    diesel::delete(web_sessions::table.filter(web_sessions::id_hash.eq(hash_secret(key))))
        .execute(c)?;
    Ok(())
}

/// Ends every session of `user`; returns how many were live.
pub fn delete_for_user(c: &mut DbConn, user: i64) -> Result<usize, DbError> {
    let at = now();
    let live = web_sessions::table
        .filter(web_sessions::user_id.eq(user))
        .filter(web_sessions::expires_at.gt(at))
        .count()
        .get_result::<i64>(c)?;
    diesel::delete(web_sessions::table.filter(web_sessions::user_id.eq(user))).execute(c)?;
    Ok(usize::try_from(live).unwrap_or(0))
}

/// The user's live sessions.
pub fn count_for_user(c: &mut DbConn, user: i64) -> Result<i64, DbError> {
    Ok(web_sessions::table
        .filter(web_sessions::user_id.eq(user))
        .filter(web_sessions::expires_at.gt(now()))
        .count()
        .get_result::<i64>(c)?)
}
