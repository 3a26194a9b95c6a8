//! App presets: web apps that operators (campus-wide) and lab admins (for their lab)
//! describe once, and the launch that turns one into an interactive job serving it.
//!
//! Invariants:
//! - Campus presets are written by operators only; a lab's by its admins (and
//!   operators). Members write none (403); a preset of a lab the caller is not in is
//!   "not found" (404) to them, as is launching it.
//! - A preset's image is on the allow-list its users' jobs may name: the campus's for a
//!   campus preset (every lab's jobs may run it), the lab's or the campus's for a lab's.
//!   The launch goes through the job submission itself, so the image is checked again
//!   against the launching user's lab, and nothing is half-written.
//! - Every write is audited in the same transaction.

use super::{Actor, Ctx};
use crate::db::app_presets::{self as q, PresetRow};
use crate::db::{self, DbConn};
use crate::error::AppError;
use commons_api::app_preset::{self as rules, LaunchRequest, PresetRequest, PresetView};
use std::collections::BTreeMap;

pub use commons_api::app_preset::Choice;

fn view(row: &PresetRow, slugs: &BTreeMap<i64, String>) -> PresetView {
    PresetView {
        id: row.id,
        lab: row.lab_id.and_then(|l| slugs.get(&l).cloned()),
        spec: row.spec(),
        updated_by: row.updated_by.clone(),
        updated_at: row.updated_at,
    }
}

fn views(c: &mut DbConn, rows: &[PresetRow]) -> Result<Vec<PresetView>, AppError> {
    let labs: Vec<i64> = rows.iter().filter_map(|r| r.lab_id).collect();
    let slugs = db::users::lab_slugs(c, &labs)?;
    Ok(rows.iter().map(|r| view(r, &slugs)).collect())
}

/// Whether `actor` may change or remove a preset of `lab` (`None`: the campus's).
pub fn may_manage(actor: &Actor, lab: Option<i64>) -> bool {
    match lab {
        None => actor.user.is_operator,
        Some(l) => actor.admin_of(l),
    }
}

/// The presets `actor` may launch: the campus's and their labs'.
pub async fn list(ctx: &Ctx, actor: &Actor) -> Result<Vec<PresetView>, AppError> {
    let labs: Vec<i64> = actor.labs.iter().map(|(l, _)| l.id).collect();
    ctx.db
        .run(move |c| {
            let rows = q::usable_by(c, &labs)?;
            views(c, &rows)
        })
        .await
}

/// The presets of the console page, with whether `actor` may change each: every preset
/// for an operator, else those the actor may launch.
pub async fn console(ctx: &Ctx, actor: &Actor) -> Result<Vec<(PresetView, bool)>, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let rows = if actor.user.is_operator {
                q::all(c)?
            } else {
                let labs: Vec<i64> = actor.labs.iter().map(|(l, _)| l.id).collect();
                q::usable_by(c, &labs)?
            };
            let editable: Vec<bool> = rows.iter().map(|r| may_manage(&actor, r.lab_id)).collect();
            Ok(views(c, &rows)?.into_iter().zip(editable).collect())
        })
        .await
}

/// Preset `id` if `actor` may see it (a campus preset, one of their labs', or any for
/// an operator), else "not found".
fn visible(c: &mut DbConn, actor: &Actor, id: i64) -> Result<PresetRow, AppError> {
    let row = q::get(c, id)?.ok_or(AppError::NotFound("app preset"))?;
    let seen = match row.lab_id {
        None => true,
        Some(l) => actor.user.is_operator || actor.labs.iter().any(|(x, _)| x.id == l),
    };
    if seen {
        Ok(row)
    } else {
        Err(AppError::NotFound("app preset"))
    }
}

/// One preset `actor` may see.
pub async fn get(ctx: &Ctx, actor: &Actor, id: i64) -> Result<PresetView, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let row = visible(c, &actor, id)?;
            Ok(views(c, &[row])?.remove(0))
        })
        .await
}

/// The lab a new preset is for (`None`: the campus, operators only), checked for
/// `actor`, and the preset's image against the allow-list its users see.
fn target(
    c: &mut DbConn,
    actor: &Actor,
    lab: Option<&str>,
    image: &str,
) -> Result<Option<crate::db::models::Lab>, AppError> {
    match lab {
        None => {
            actor.require_operator().map_err(|_| {
                AppError::Forbidden(
                    "only operators may make a campus-wide preset; a lab admin names the lab \
                     (\"lab\": \"SLUG\")"
                        .into(),
                )
            })?;
            super::images::check_campus(c, image)?;
            Ok(None)
        }
        Some(slug) => {
            let admin = super::lab_admin(c, actor, slug)?;
            super::images::pin_for_job(c, admin.lab(), image)?;
            Ok(Some(admin.lab().clone()))
        }
    }
}

fn taken(name: &str, lab: Option<&crate::db::models::Lab>) -> AppError {
    AppError::conflict(
        "preset_exists",
        format!(
            "{} has a preset named {name} already: change that one, or choose another name",
            lab.map_or("the campus".to_string(), |l| format!("lab {}", l.slug))
        ),
    )
}

/// Checks and stores a new preset.
pub async fn create(ctx: &Ctx, actor: &Actor, req: PresetRequest) -> Result<PresetView, AppError> {
    let spec = rules::check(&req)?;
    let actor = actor.clone();
    let view = ctx
        .db
        .run(move |c| {
            db::transaction(c, |c| {
                let lab = target(c, &actor, req.lab.as_deref(), &spec.image)?;
                let lab_id = lab.as_ref().map(|l| l.id);
                let by = &actor.user.username;
                let id = q::insert(c, lab_id, &spec, by)?
                    .ok_or_else(|| taken(&spec.name, lab.as_ref()))?;
                let what = format!("{} ({}, port {})", spec.title, spec.image, spec.port);
                let target = format!("app preset {}", spec.name);
                db::audit::record(
                    c,
                    &actor.user,
                    lab_id,
                    "add_app_preset",
                    &target,
                    "none",
                    &what,
                )?;
                let row = q::get(c, id)?.ok_or(AppError::NotFound("app preset"))?;
                Ok::<_, AppError>(views(c, &[row])?.remove(0))
            })
        })
        .await?;
    tracing::info!(preset = %view.handle(), "app preset added");
    Ok(view)
}

/// Replaces preset `id` (its lab stays: a `lab` in the request must be its own).
pub async fn update(
    ctx: &Ctx,
    actor: &Actor,
    id: i64,
    req: PresetRequest,
) -> Result<PresetView, AppError> {
    let spec = rules::check(&req)?;
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            db::transaction(c, |c| {
                let row = visible(c, &actor, id)?;
                let own = match row.lab_id {
                    Some(l) => Some(db::users::lab_by_id(c, l)?.slug),
                    None => None,
                };
                if req.lab.is_some() && req.lab != own {
                    return Err(AppError::invalid(
                        "lab",
                        "a preset stays with its lab (or the campus): make a new one for another",
                    ));
                }
                let lab = target(c, &actor, own.as_deref(), &spec.image)?;
                if !q::update(c, id, &spec, &actor.user.username)? {
                    return Err(taken(&spec.name, lab.as_ref()));
                }
                let before = format!("{} ({}, port {})", row.title, row.image, row.port);
                let after = format!("{} ({}, port {})", spec.title, spec.image, spec.port);
                let target = format!("app preset {}", spec.name);
                db::audit::record(
                    c,
                    &actor.user,
                    row.lab_id,
                    "change_app_preset",
                    &target,
                    &before,
                    &after,
                )?;
                let row = q::get(c, id)?.ok_or(AppError::NotFound("app preset"))?;
                Ok(views(c, &[row])?.remove(0))
            })
        })
        .await
}

/// Removes preset `id` (who may write it may remove it). Jobs launched from it go on.
pub async fn delete(ctx: &Ctx, actor: &Actor, id: i64) -> Result<(), AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            db::transaction(c, |c| {
                let row = visible(c, &actor, id)?;
                if !may_manage(&actor, row.lab_id) {
                    return Err(AppError::Forbidden(match row.lab_id {
                        None => "only operators may remove a campus preset".into(),
                        Some(_) => {
                            "only the lab's admins (or operators) may remove its presets".into()
                        }
                    }));
                }
                q::delete(c, id)?;
                let target = format!("app preset {}", row.name);
                Ok(db::audit::record(
                    c,
                    &actor.user,
                    row.lab_id,
                    "remove_app_preset",
                    &target,
                    &row.title,
                    "none",
                )?)
            })
        })
        .await
}

/// Launches preset `id` for `actor`: an interactive job serving the app, submitted like
/// any other (quota, allow-list, lab membership), named and tagged after the preset.
pub async fn launch(
    ctx: &Ctx,
    actor: &Actor,
    id: i64,
    choice: LaunchRequest,
) -> Result<super::views::JobView, AppError> {
    let preset = get(ctx, actor, id).await?;
    let req = rules::job_request(&preset.spec, preset.lab.as_deref(), &choice)?;
    let view = super::jobs::submit(ctx, actor, req).await?;
    tracing::info!(job = view.id, preset = %preset.handle(), "app launched");
    Ok(view)
}
