//! The operator CLI (`commons-portal admin ...`): same binary, same database as the server.

use crate::db::models::Role;
use crate::db::{users, Db};
use crate::error::AppError;

fn plain(e: impl Into<AppError>) -> anyhow::Error {
    let e: AppError = e.into();
    match e.field() {
        Some(f) => anyhow::anyhow!("{f}: {e}"),
        None => anyhow::anyhow!("{e}"),
    }
}

pub fn create_lab(db: &Db, slug: &str, name: &str) -> anyhow::Result<String> {
    let lab = db
        .run_blocking(|c| users::create_lab(c, slug, name))
        .map_err(plain)?;
    Ok(format!("created lab {} ({})", lab.slug, lab.name))
}

pub fn create_user(
    db: &Db,
    username: &str,
    email: &str,
    lab: Option<&str>,
    role: Role,
    operator: bool,
) -> anyhow::Result<String> {
    db.run_blocking(|c| {
        crate::db::transaction(c, |c| {
            let user = users::create_user(c, username, email, operator)?;
            if let Some(slug) = lab {
                let lab = users::lab_by_slug(c, slug)?;
                users::set_membership(c, user.id, lab.id, role)?;
            }
            Ok::<_, AppError>(())
        })
    })
    .map_err(plain)?;
    Ok(format!("created user {username}"))
}

pub fn api_token(db: &Db, username: &str) -> anyhow::Result<String> {
    db.run_blocking(|c| {
        let user = users::user_by_name(c, username)?
            .ok_or_else(|| AppError::invalid("USERNAME", format!("no user {username:?}")))?;
        Ok::<_, AppError>(users::create_api_token(c, user.id, "created by admin CLI")?)
    })
    .map_err(plain)
}

/// Ends every browser session of `username`; says how many were live.
pub fn sign_out(db: &Db, username: &str) -> anyhow::Result<String> {
    db.run_blocking(|c| {
        let user = users::user_by_name(c, username)?
            .ok_or_else(|| AppError::invalid("USERNAME", format!("no user {username:?}")))?;
        let n = crate::db::web_sessions::delete_for_user(c, user.id)?;
        Ok::<_, AppError>(format!("ended {n} browser session(s) of {username}"))
    })
    .map_err(plain)
}

pub fn enrol_token(db: &Db, slug: &str) -> anyhow::Result<String> {
    db.run_blocking(|c| {
        let lab = users::lab_by_slug(c, slug)?;
        users::create_enrol_token(c, lab.id)
    })
    .map_err(plain)
}

/// `admin images allow`: a campus (or `lab`) entry for `name_tag`, pinned to `digest` or,
/// when none is given, to the image's ID in the local Docker Engine. Prints the entry.
pub fn allow_image(
    db: &Db,
    keys: &[commons_api::image::AuthorityKey],
    req: crate::service::images::NewImage,
) -> anyhow::Result<String> {
    use crate::service::images::{self, Adder};
    let mut req = req;
    if req.digest.is_none() {
        let name = commons_api::image::name_tag("NAME:TAG", &req.name_tag)
            .map_err(|e| anyhow::anyhow!("NAME:TAG: {e}"))?;
        req.digest = Some(images::local_digest(&name).map_err(|e| {
            anyhow::anyhow!("cannot read the digest of {name} from the local Docker Engine: {e}")
        })?);
    }
    let v = db
        .run_blocking(|c| images::store(c, Adder::Cli, &req, keys))
        .map_err(plain)?;
    Ok(format!(
        "allowed {} at {} ({}){}",
        v.name_tag,
        v.digest,
        v.lab
            .map_or("campus-wide".to_string(), |l| format!("lab {l}")),
        v.signed_by
            .map(|k| format!(", signed by {k}"))
            .unwrap_or_default()
    ))
}
