//! Setting the file spaces' quotas (operators a lab's, a lab's admins their members'),
//! each change with its audit entry; and the use shown in `GET /api/v1/me` and on
//! *My usage*.

use super::quota::{self, Quotas};
use super::{FilesQuotaRequest, FilesQuotaSaved, Space, SpaceUse};
use crate::db::{self, files as rows, DbConn};
use crate::error::AppError;
use crate::service::{lab_admin, Actor, Ctx};

/// A quota in GB as given: a number, 0 or more, or `null`.
fn checked(req: &FilesQuotaRequest) -> Result<Option<f64>, AppError> {
    match req.quota_gb {
        Some(v) if !v.is_finite() || v < 0.0 => Err(AppError::invalid(
            "quota_gb",
            format!(
                "quota_gb must be a number of GB, 0 or more (or null for the default); got {v}"
            ),
        )),
        v => Ok(v),
    }
}

fn show(v: Option<f64>) -> String {
    v.map_or("default".into(), |v| format!("{v} GB"))
}

/// Sets (or with `null` clears) lab `slug`'s own quota for its shared space (operators).
pub async fn set_lab_quota(
    ctx: &Ctx,
    actor: &Actor,
    slug: String,
    req: FilesQuotaRequest,
) -> Result<FilesQuotaSaved, AppError> {
    actor.require_operator()?;
    let gb = checked(&req)?;
    let (actor, quotas) = (actor.clone(), ctx.files.quotas);
    ctx.db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab().id;
            db::transaction(c, |c| {
                let before = rows::lab_quota_gb(c, lab)?;
                rows::set_lab_quota_gb(c, lab, gb)?;
                let (target, b, a) = (format!("lab {slug}"), show(before), show(gb));
                db::audit::record(
                    c,
                    admin.user(),
                    Some(lab),
                    "set_lab_files_quota",
                    &target,
                    &b,
                    &a,
                )?;
                let space = Space::of_lab(lab, &slug);
                Ok(FilesQuotaSaved {
                    quota_gb: gb,
                    quota_bytes: quota::quota_bytes(c, &quotas, &space)?.max(0) as u64,
                })
            })
        })
        .await
}

/// Sets (or clears) the quota lab `slug` gives `username` for their own space (the lab's
/// admins, operators). 404 when they are not a member.
pub async fn set_member_quota(
    ctx: &Ctx,
    actor: &Actor,
    slug: String,
    username: String,
    req: FilesQuotaRequest,
) -> Result<FilesQuotaSaved, AppError> {
    let gb = checked(&req)?;
    let (actor, quotas) = (actor.clone(), ctx.files.quotas);
    ctx.db
        .run(move |c| {
            let admin = lab_admin(c, &actor, &slug)?;
            let lab = admin.lab().id;
            let member =
                db::users::user_by_name(c, &username)?.ok_or(AppError::NotFound("member"))?;
            db::transaction(c, |c| {
                let before = rows::member_quota_gb(c, lab, member.id)?
                    .ok_or(AppError::NotFound("member"))?;
                rows::set_member_quota_gb(c, lab, member.id, gb)?;
                let (target, b, a) = (format!("member {username}"), show(before), show(gb));
                db::audit::record(
                    c,
                    admin.user(),
                    Some(lab),
                    "set_member_files_quota",
                    &target,
                    &b,
                    &a,
                )?;
                let space = Space::of_user(member.id);
                Ok(FilesQuotaSaved {
                    quota_gb: gb,
                    quota_bytes: quota::quota_bytes(c, &quotas, &space)?.max(0) as u64,
                })
            })
        })
        .await
}

/// The use of the user's own space, and of each of their labs' (by lab id).
pub fn uses(
    c: &mut DbConn,
    quotas: &Quotas,
    actor: &Actor,
) -> Result<(SpaceUse, Vec<(i64, SpaceUse)>), AppError> {
    let mine = quota::space_use(c, quotas, &Space::of_user(actor.user.id))?;
    let mut labs = Vec::new();
    for (lab, _) in &actor.labs {
        labs.push((
            lab.id,
            quota::space_use(c, quotas, &Space::of_lab(lab.id, &lab.slug))?,
        ));
    }
    Ok((mine, labs))
}
