//! The quotas of file spaces, and the bytes counted against them as uploads arrive.
//!
//! A space's quota: a lab's own value (operators) or `[files] lab_quota_gb`; for a user,
//! the largest value any of their labs' admins set for them, or `[files] user_quota_gb`.
//!
//! A space's use, as an upload to `path` sees it: the bytes of its files, less the file
//! at `path` (the upload will replace it) unless another upload to `path` is under way,
//! plus the bytes every other upload under way has reserved.
//!
//! Invariants:
//! - An upload counts its bytes before it stores them: it starts with its declared length
//!   reserved (all of it, so a body over the quota is refused before a byte is read), or
//!   with a grant of [`GRANT`] when its length is unknown, and asks for more as bytes
//!   arrive past what it holds ([`grow`]). A grant never passes the quota.
//! - Each count and reservation happens in one transaction with the space locked
//!   (`db::files::lock_space`): concurrent uploads into one space are counted one after
//!   the other, on every replica.

use super::{Owner, Space};
use crate::db::files::{self as rows, NewFile};
use crate::db::{self, DbConn};
use crate::error::AppError;
use chrono::NaiveDateTime;
use commons_api::files::{human_bytes, SpaceUse};

/// Bytes reserved at a time while a body of unknown length arrives.
pub const GRANT: i64 = 64 << 20;

/// The campus's default quotas, in GB (`[files]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quotas {
    pub user_gb: f64,
    pub lab_gb: f64,
}

/// GB (10^9 bytes) in whole bytes.
pub fn bytes_of(gb: f64) -> i64 {
    (gb * 1e9).round() as i64
}

/// The quota in force for `space`, in bytes.
pub fn quota_bytes(c: &mut DbConn, quotas: &Quotas, space: &Space) -> Result<i64, AppError> {
    let gb = match &space.owner {
        Owner::User(id) => rows::member_quotas_gb(c, *id)?
            .into_iter()
            .reduce(f64::max)
            .unwrap_or(quotas.user_gb),
        Owner::Lab { id, .. } => rows::lab_quota_gb(c, *id)?.unwrap_or(quotas.lab_gb),
    };
    Ok(bytes_of(gb))
}

/// What the space holds against its quota now.
pub fn space_use(c: &mut DbConn, quotas: &Quotas, space: &Space) -> Result<SpaceUse, AppError> {
    let (bytes, files) = rows::space_bytes(c, &space.key)?;
    let reserved: i64 = rows::uploads_of(c, &space.key)?
        .iter()
        .map(|u| u.reserved)
        .sum();
    Ok(SpaceUse {
        used_bytes: (bytes + reserved).max(0) as u64,
        files: files.max(0) as u64,
        quota_bytes: quota_bytes(c, quotas, space)?.max(0) as u64,
    })
}

/// What an upload to `path` may still take: the quota less the space's use as that
/// upload sees it (see the module's doc). `upload` is the upload asking, once started.
fn room(
    c: &mut DbConn,
    quotas: &Quotas,
    space: &Space,
    path: &str,
    upload: Option<i64>,
) -> Result<(i64, i64), AppError> {
    let (files, _) = rows::space_bytes(c, &space.key)?;
    let others: Vec<_> = rows::uploads_of(c, &space.key)?
        .into_iter()
        .filter(|u| Some(u.id) != upload)
        .collect();
    let replaced = if others.iter().any(|u| u.path == path) {
        0
    } else {
        rows::get(c, &space.key, path)?.map_or(0, |f| f.bytes)
    };
    let used = files - replaced + others.iter().map(|u| u.reserved).sum::<i64>();
    let quota = quota_bytes(c, quotas, space)?;
    Ok((quota - used, quota))
}

/// The refusal of an upload of `bytes` that would pass the space's quota: its whole
/// declared length (`whole`), or what arrived so far.
fn over(space: &Space, quota: i64, room: i64, bytes: i64, whole: bool) -> AppError {
    let whose = match &space.owner {
        Owner::User(_) => "your file quota".to_string(),
        Owner::Lab { slug, .. } => format!("lab {slug}'s file quota"),
    };
    let size = human_bytes(bytes.max(0) as u64);
    let this = if whole {
        format!("this upload is {size}")
    } else {
        format!("this upload had sent {size} when it was stopped")
    };
    AppError::OverQuota {
        code: "file_quota",
        message: format!(
            "{whose} of {} would be passed: {} is in use (uploads under way included) and \
             {this}; nothing of it was kept. Delete files, or ask for a larger quota",
            human_bytes(quota.max(0) as u64),
            human_bytes((quota - room).max(0) as u64),
        ),
    }
}

/// A new upload into `space`: what it reserved, and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub id: i64,
    pub reserved: i64,
}

/// Starts an upload to `path` whose contents will be `object`: reserves its `declared`
/// length (refused, 413, when it does not fit), or a grant when the length is unknown.
pub fn start(
    c: &mut DbConn,
    quotas: &Quotas,
    space: &Space,
    path: &str,
    object: &str,
    declared: Option<u64>,
) -> Result<Started, AppError> {
    db::transaction(c, |c| {
        rows::lock_space(c, &space.key)?;
        let (room, quota) = room(c, quotas, space, path, None)?;
        let reserved = match declared {
            Some(d) => {
                let d = i64::try_from(d).unwrap_or(i64::MAX);
                if d > room {
                    return Err(over(space, quota, room, d, true));
                }
                d
            }
            None => GRANT.min(room.max(0)),
        };
        let id = rows::start_upload(c, &space.key, path, object, reserved, db::now())?;
        Ok(Started { id, reserved })
    })
}

/// Checks, inside the caller's transaction, that an upload in parts of `size` bytes to
/// `path` fits the space's quota (413 `file_quota` otherwise); the space stays locked
/// until the transaction ends, so the caller's row that reserves it is counted in order.
pub fn fits(
    c: &mut DbConn,
    quotas: &Quotas,
    space: &Space,
    path: &str,
    size: i64,
) -> Result<(), AppError> {
    rows::lock_space(c, &space.key)?;
    let (room, quota) = room(c, quotas, space, path, None)?;
    if size > room {
        return Err(over(space, quota, room, size, true));
    }
    Ok(())
}

/// The answer when an upload's row went while it ran (the sweep took it for dead).
fn discarded(path: &str) -> AppError {
    AppError::conflict(
        "file_upload_discarded",
        format!("the upload of {path} was given up by the portal while it ran; send it again"),
    )
}

/// More room for upload `id`, which now has `received` bytes: returns what it holds now
/// (at least `received`), or refuses (413) when the quota cannot take them.
pub fn grow(
    c: &mut DbConn,
    quotas: &Quotas,
    space: &Space,
    path: &str,
    id: i64,
    received: i64,
) -> Result<i64, AppError> {
    db::transaction(c, |c| {
        rows::lock_space(c, &space.key)?;
        if rows::upload(c, id)?.is_none() {
            return Err(discarded(path));
        }
        let (room, quota) = room(c, quotas, space, path, Some(id))?;
        if received > room {
            return Err(over(space, quota, room, received, false));
        }
        let reserved = received.saturating_add(GRANT).min(room);
        rows::touch_upload(c, id, reserved, db::now())?;
        Ok(reserved)
    })
}

/// Keeps upload `id` alive without more room (a long upload of a declared length).
pub fn touch(c: &mut DbConn, path: &str, id: i64, reserved: i64) -> Result<(), AppError> {
    if rows::touch_upload(c, id, reserved, db::now())? {
        Ok(())
    } else {
        Err(discarded(path))
    }
}

/// Turns upload `id` into the file `new`; returns the object it replaced, if any.
pub fn commit(
    c: &mut DbConn,
    space: &Space,
    id: i64,
    new: &NewFile<'_>,
) -> Result<Option<String>, AppError> {
    db::transaction(c, |c| {
        rows::lock_space(c, &space.key)?;
        if !rows::end_upload(c, id)? {
            return Err(discarded(new.path));
        }
        Ok(rows::put(c, new)?)
    })
}

/// Forgets upload `id` (refused or cut off); its object is the caller's to remove.
pub fn forget(c: &mut DbConn, id: i64) -> Result<(), AppError> {
    rows::end_upload(c, id)?;
    Ok(())
}

/// When an upload counts as dead: no sign of life for this long.
pub const STALE_AFTER_S: i64 = 30 * 60;

/// A time `STALE_AFTER_S` before `now`.
pub fn stale_before(now: NaiveDateTime) -> NaiveDateTime {
    now - chrono::Duration::seconds(STALE_AFTER_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_quota_and_its_figures() {
        let e = over(&Space::of_user(1), 2_000_000, 500_000, 700_000, true);
        assert_eq!(e.code(), "file_quota");
        assert_eq!(e.status().as_u16(), 413);
        let m = e.to_string();
        assert!(
            m.starts_with("your file quota of 2 MB would be passed"),
            "{m}"
        );
        assert!(m.contains("1.5 MB is in use"), "{m}");
        assert!(m.contains("this upload is 700 kB;"), "{m}");
        let lab = over(&Space::of_lab(3, "vision"), 1_000, -5, 10, false).to_string();
        assert!(lab.starts_with("lab vision's file quota of 1 kB"), "{lab}");
        assert!(lab.contains("1 kB is in use"), "{lab}");
        assert!(lab.contains("had sent 10 B when"), "{lab}");
    }

    #[test]
    fn gigabytes_are_decimal() {
        assert_eq!(bytes_of(1.5), 1_500_000_000);
        assert_eq!(bytes_of(0.000002), 2_000);
    }
}
