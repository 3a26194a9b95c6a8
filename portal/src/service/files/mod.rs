//! Files: every user's own space and every lab's shared one, in the campus object store
//! (the store of `[checkpoints]`, under `files/`): list, upload, download, delete, and
//! the quotas that bound each space.
//!
//! Who may do what:
//! - A user reads and writes their own space; nobody else does (operators included:
//!   a person's files are theirs).
//! - A lab's members (and operators) read the lab's space; its admins (and operators)
//!   write it. Anyone else is refused (403), naming the rule.
//!
//! Where things are kept, and why:
//! - Each file is a row in the database (`db::files`): path, size, SHA-256, time, and the
//!   key of its contents in the store. Listings, quotas and downloads read rows, never
//!   the store, so a listing of a space costs one query however large its files (the
//!   checksum is computed once, as the bytes arrive, and kept in the row) and both
//!   backends of the store answer alike.
//! - The contents' key is fresh per upload (`files/users/{id}/{random}`), not the path:
//!   a path of up to 1,024 bytes with any character would not fit a local filesystem's
//!   255-byte names, a replaced file switches to its new object in one transaction (no
//!   copy, which S3 limits to 5 GB in one request), and a download under way keeps
//!   reading the object it started on.
//!
//! Invariants:
//! - Nothing partial is ever seen: an upload's object is complete before its row is
//!   written, and an upload refused (quota, checksum, a client gone) leaves neither row
//!   nor object ([`upload`]).
//! - A space's use (its files' bytes, plus the bytes reserved by uploads under way) never
//!   passes its quota by an upload: bytes are counted as they arrive, in the transaction
//!   that locks the space ([`quota`]).
//! - Rows go before objects on delete and replace: a failure in between leaves an object
//!   no row names, which [`sweep`] removes later.

pub mod datasets;
mod download;
pub mod inputs;
pub mod outputs;
pub mod parts;
pub mod quota;
pub mod range;
mod settings;
pub mod signed;
pub mod store;
mod sweep;
mod upload;

use super::{Actor, Ctx};
use crate::db::{self, files as rows, DbConn};
use crate::error::AppError;
pub use commons_api::files::{FileEntry, FilesQuotaRequest, FilesQuotaSaved, SpaceUse};
pub use download::{download, Download};
pub use quota::Quotas;
pub use settings::{set_lab_quota, set_member_quota, uses};
pub use store::FileStore;
pub use sweep::sweep;
pub use upload::{upload, Uploaded};

/// The file spaces' store and the campus's default quotas (`Ctx::files`).
#[derive(Debug, Clone)]
pub struct Files {
    pub store: FileStore,
    pub quotas: Quotas,
    /// Signs the portal's own object URLs for agents ([`signed`]).
    pub signer: signed::UrlSigner,
    /// Agents get the store's own presigned URLs where it makes them (S3).
    pub presign: bool,
}

impl Files {
    /// The spaces in `store` (the checkpoints' store), with `[files]`'s quotas; `signer`
    /// signs agents' object URLs when the store does not (a local one).
    pub fn new(
        store: crate::service::checkpoints::Store,
        config: &crate::config::FilesConfig,
        signer: signed::UrlSigner,
    ) -> Files {
        Files {
            store: FileStore::new(store),
            quotas: Quotas {
                user_gb: config.user_quota_gb,
                lab_gb: config.lab_quota_gb,
            },
            signer,
            presign: config.agents_read_from_store,
        }
    }
}

/// Which space a request names: the caller's own, or a lab's by slug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    Mine,
    Lab(String),
}

impl From<commons_api::files::Space> for Which {
    fn from(s: commons_api::files::Space) -> Which {
        match s {
            commons_api::files::Space::Mine => Which::Mine,
            commons_api::files::Space::Lab(slug) => Which::Lab(slug),
        }
    }
}

/// A space the caller may use, as [`open`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Space {
    /// Its rows' `space` (`user:7`, `lab:3`).
    pub key: String,
    /// Where its objects go in the store.
    pub prefix: String,
    pub owner: Owner,
}

/// Whose space it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    User(i64),
    Lab { id: i64, slug: String },
}

impl Space {
    pub fn of_user(id: i64) -> Space {
        Space {
            key: format!("user:{id}"),
            prefix: format!("files/users/{id}"),
            owner: Owner::User(id),
        }
    }

    pub fn of_lab(id: i64, slug: &str) -> Space {
        Space {
            key: format!("lab:{id}"),
            prefix: format!("files/labs/{id}"),
            owner: Owner::Lab {
                id,
                slug: slug.to_string(),
            },
        }
    }
}

/// Reading or writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The space `which` names, if `actor` may use it so: 404 for an unknown lab, 403 for a
/// lab the actor is not a member (read) or an admin (write) of.
pub fn open(
    c: &mut DbConn,
    actor: &Actor,
    which: &Which,
    access: Access,
) -> Result<Space, AppError> {
    let slug = match which {
        Which::Mine => return Ok(Space::of_user(actor.user.id)),
        Which::Lab(slug) => slug,
    };
    let lab = db::users::find_lab(c, slug)?.ok_or(AppError::NotFound("lab"))?;
    let member = actor.labs.iter().any(|(l, _)| l.id == lab.id);
    match access {
        Access::Read if member || actor.user.is_operator => {}
        Access::Write if actor.admin_of(lab.id) => {}
        Access::Read => {
            return Err(AppError::Forbidden(format!(
                "only members of lab {slug} may read its files"
            )))
        }
        Access::Write => {
            return Err(AppError::Forbidden(format!(
                "only lab {slug}'s admins may change its files; members may read them"
            )))
        }
    }
    Ok(Space::of_lab(lab.id, &lab.slug))
}

/// A path from a request, checked (422 naming the rule).
pub fn check_path(path: &str) -> Result<(), AppError> {
    Ok(commons_api::files::check_path("path", path)?)
}

fn entry(r: rows::FileRow) -> FileEntry {
    FileEntry {
        path: r.path,
        size: r.bytes.max(0) as u64,
        modified: r.modified_at,
        sha256: r.sha256,
    }
}

/// The files of the space whose path starts with `prefix`, by path.
pub async fn list(
    ctx: &Ctx,
    actor: &Actor,
    which: Which,
    prefix: String,
) -> Result<Vec<FileEntry>, AppError> {
    commons_api::files::check_prefix("prefix", &prefix)?;
    let actor = actor.clone();
    let found = ctx
        .db
        .run(move |c| {
            let space = open(c, &actor, &which, Access::Read)?;
            Ok::<_, AppError>(rows::list(c, &space.key, &prefix)?)
        })
        .await?;
    Ok(found.into_iter().map(entry).collect())
}

/// What the Files page shows of a space: the files under a folder, the space's use, and
/// whether the caller may change it.
#[derive(Debug, Clone)]
pub struct Listing {
    pub files: Vec<FileEntry>,
    pub space_use: SpaceUse,
    pub writable: bool,
}

/// The files of the space under `prefix`, with its use against its quota.
pub async fn browse(
    ctx: &Ctx,
    actor: &Actor,
    which: Which,
    prefix: String,
) -> Result<Listing, AppError> {
    commons_api::files::check_prefix("dir", &prefix)?;
    let (actor, quotas) = (actor.clone(), ctx.files.quotas);
    ctx.db
        .run(move |c| {
            let space = open(c, &actor, &which, Access::Read)?;
            let writable = open(c, &actor, &which, Access::Write).is_ok();
            let files = rows::list(c, &space.key, &prefix)?;
            Ok(Listing {
                files: files.into_iter().map(entry).collect(),
                space_use: quota::space_use(c, &quotas, &space)?,
                writable,
            })
        })
        .await
}

/// Deletes a file: its row, then its object. 404 when there is no such file.
pub async fn delete(ctx: &Ctx, actor: &Actor, which: Which, path: String) -> Result<(), AppError> {
    check_path(&path)?;
    let actor = actor.clone();
    let gone = ctx
        .db
        .run(move |c| {
            let space = open(c, &actor, &which, Access::Write)?;
            db::transaction(c, |c| {
                rows::lock_space(c, &space.key)?;
                Ok::<_, AppError>(rows::delete(c, &space.key, &path)?)
            })
        })
        .await?
        .ok_or(AppError::NotFound("file"))?;
    if let Err(e) = ctx.files.store.delete(&gone.object).await {
        tracing::warn!(
            object = gone.object,
            "a deleted file's object stays for the sweep: {e}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_are_keyed_by_owner_id() {
        assert_eq!(Space::of_user(7).key, "user:7");
        assert_eq!(Space::of_user(7).prefix, "files/users/7");
        let lab = Space::of_lab(3, "vision");
        assert_eq!(
            (lab.key.as_str(), lab.prefix.as_str()),
            ("lab:3", "files/labs/3")
        );
    }
}
