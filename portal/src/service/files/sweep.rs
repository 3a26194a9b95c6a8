//! What failures leave behind, removed: uploads whose portal died mid-way (their rows
//! are not touched for [`quota::STALE_AFTER_S`]) and objects no row names (a delete or a
//! replace whose object deletion failed, a crash between an object and its row).
//!
//! Invariant: an object is removed only when no file and no upload names it and it was
//! last written over an hour ago (so an upload that has just completed its object and is
//! about to write its row keeps it), and the listing of the store runs at most once an
//! hour.

use super::store::part_owner;
use super::{parts, quota};
use crate::db::{self, files as rows};
use crate::error::AppError;
use crate::service::Ctx;
use commons_api::uploads::part_count;
use std::sync::atomic::{AtomicI64, Ordering};

/// When the store was last listed for objects no row names (unix seconds).
static LAST_LISTED: AtomicI64 = AtomicI64::new(0);
/// How often the store is listed, and how old an object no row names must be to go.
const LIST_EVERY_S: i64 = 3600;

/// Removes dead uploads, and (hourly) objects no row names. Returns how many objects went.
pub async fn sweep(ctx: &Ctx) -> Result<usize, AppError> {
    let stale = ctx
        .db
        .run(|c| {
            let now = db::now();
            let parts_before = now - chrono::Duration::seconds(parts::RESUMABLE_FOR_S);
            let dead = rows::stale_uploads(c, quota::stale_before(now), parts_before)?;
            for u in &dead {
                rows::end_upload(c, u.id)?;
            }
            Ok::<_, AppError>(dead)
        })
        .await?;
    let mut gone = 0;
    for u in stale {
        tracing::warn!(
            space = u.space,
            upload = u.id,
            "an upload that stopped long ago is removed"
        );
        ctx.files.store.delete(&u.object).await?;
        if let Some(size) = u.size {
            parts::remove_parts(ctx, &u.object, part_count(size.max(0) as u64)).await;
        }
        gone += 1;
    }
    let now = chrono::Utc::now();
    let last = LAST_LISTED.load(Ordering::Relaxed);
    if now.timestamp() - last < LIST_EVERY_S {
        return Ok(gone);
    }
    LAST_LISTED.store(now.timestamp(), Ordering::Relaxed);
    let old = ctx
        .files
        .store
        .older_than(now - chrono::Duration::seconds(LIST_EVERY_S))
        .await?;
    for key in old {
        // A part's object lives as long as its upload.
        let k = part_owner(&key).unwrap_or(&key).to_string();
        let known = ctx.db.run(move |c| rows::object_known(c, &k)).await?;
        if !known {
            tracing::warn!(object = key, "an object no file names is removed");
            ctx.files.store.delete(&key).await?;
            gone += 1;
        }
    }
    Ok(gone)
}
