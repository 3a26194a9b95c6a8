//! The image allow-list: campus-wide entries (operators) and lab entries (the lab's
//! admins), each `NAME:TAG` pinned to a digest, optionally signed by a campus image
//! authority; and the check every job passes at submit.
//!
//! Invariants:
//! - Campus entries are added and removed by operators only; a lab's entries by its admins
//!   (and operators). Members add nothing (403).
//! - A signature is verified against the campus authority keys (`[images]
//!   authority_keys`) before the entry is stored; a bad one is 422 naming `signature`.
//!   A lab that requires signed images accepts jobs on signed entries only.
//! - A job names an image its lab's entries or the campus entries allow, or it is refused
//!   (422 naming `image`) with nothing stored; the job keeps the digest and signature it
//!   was allowed with, and the agent runs that digest only.
//! - Every change is audited in the same transaction.

use super::{Actor, Ctx};
use crate::db::images::{self as q, NewEntry};
use crate::db::models::{ImageAllow, Lab};
use crate::db::{self, DbConn};
use crate::error::AppError;
use commons_api::image::{self as rules, AuthorityKey};
use std::sync::Arc;

/// The campus image authority keys, from the portal's configuration.
pub type Authorities = Arc<Vec<AuthorityKey>>;

/// Longest description.
const MAX_DESCRIPTION: usize = 300;

pub use commons_api::image::{ImageView, NewImage};

/// Who adds an entry: a signed-in user, or the operator CLI.
pub enum Adder<'a> {
    User(&'a Actor),
    Cli,
}

/// Checks and stores an entry.
pub async fn add(state: &Ctx, actor: &Actor, req: NewImage) -> Result<ImageView, AppError> {
    let mut req = req;
    if req.digest.is_none() {
        let name = rules::name_tag("name_tag", &req.name_tag)?;
        let found = tokio::task::spawn_blocking(move || local_digest(&name))
            .await
            .map_err(|e| AppError::Internal(e.into()))?;
        req.digest = Some(found.map_err(|why| {
            AppError::invalid(
                "digest",
                format!("give the digest (docker image inspect --format '{{{{.Id}}}}' NAME:TAG on a server that has the image): {why}"),
            )
        })?);
    }
    let actor = actor.clone();
    let keys = state.image_authorities.clone();
    let view = state
        .db
        .run(move |c| store(c, Adder::User(&actor), &req, &keys))
        .await?;
    tracing::info!(image = %view.name_tag, digest = %view.digest, lab = ?view.lab, "image allowed");
    Ok(view)
}

/// The entries `actor` may use or manage: the campus's and their labs' (every lab's for
/// an operator).
pub async fn list(state: &Ctx, actor: &Actor) -> Result<Vec<ImageView>, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let entries = if actor.user.is_operator {
                q::all(c)?
            } else {
                let labs: Vec<i64> = actor.labs.iter().map(|(l, _)| l.id).collect();
                q::usable_by(c, &labs)?
            };
            views(c, entries)
        })
        .await
}

/// The entries jobs of the actor's labs may name (the job form's choices).
pub async fn for_form(state: &Ctx, actor: &Actor) -> Result<Vec<ImageView>, AppError> {
    let labs: Vec<i64> = actor.labs.iter().map(|(l, _)| l.id).collect();
    state
        .db
        .run(move |c| {
            let entries = q::usable_by(c, &labs)?;
            views(c, entries)
        })
        .await
}

/// Removes an entry: campus entries by operators, a lab's by its admins. An entry the
/// actor cannot see is "not found".
pub async fn remove(state: &Ctx, actor: &Actor, id: i64) -> Result<(), AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            db::transaction(c, |c| {
                let entry = q::get(c, id)?.ok_or(AppError::NotFound("image"))?;
                let visible = match entry.lab_id {
                    None => true,
                    Some(l) => actor.user.is_operator || actor.labs.iter().any(|(x, _)| x.id == l),
                };
                if !visible {
                    return Err(AppError::NotFound("image"));
                }
                match entry.lab_id {
                    None => actor.require_operator()?,
                    Some(l) if !actor.admin_of(l) => {
                        return Err(AppError::Forbidden(
                            "only the lab's admins (or operators) may remove its images".into(),
                        ));
                    }
                    Some(_) => {}
                }
                q::delete(c, id)?;
                Ok(db::audit::record(
                    c,
                    &actor.user,
                    entry.lab_id,
                    "remove_image",
                    &format!("image {}", entry.name_tag),
                    &entry.digest,
                    "none",
                )?)
            })
        })
        .await
}

/// Sets whether lab `slug`'s jobs may use signed entries only (its admins, operators).
pub async fn set_require_signed(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    on: bool,
) -> Result<bool, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            db::transaction(c, |c| {
                let admin = super::lab_admin(c, &actor, &slug)?;
                let before = admin.lab().require_signed_images;
                q::set_require_signed(c, admin.lab().id, on)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(admin.lab().id),
                    "set_require_signed_images",
                    &format!("lab {slug}"),
                    &before.to_string(),
                    &on.to_string(),
                )?;
                Ok(on)
            })
        })
        .await
}

/// Checks and stores an entry (in one transaction with its audit entry).
pub fn store(
    c: &mut DbConn,
    who: Adder,
    req: &NewImage,
    keys: &[AuthorityKey],
) -> Result<ImageView, AppError> {
    let name_tag = rules::name_tag("name_tag", &req.name_tag)?;
    let digest = req
        .digest
        .as_deref()
        .map(str::trim)
        .ok_or_else(|| AppError::invalid("digest", "a digest is required"))?;
    rules::digest(digest)?;
    let description = req.description.as_deref().unwrap_or("").trim();
    if description.chars().count() > MAX_DESCRIPTION || description.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "description",
            format!("use at most {MAX_DESCRIPTION} characters on one line"),
        ));
    }
    let signature = req
        .signature
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    db::transaction(c, |c| {
        let lab = entry_lab(c, &who, req)?;
        let signed_by = match signature {
            Some(s) => Some(rules::verify(&name_tag, digest, s, keys)?),
            None => None,
        };
        if signed_by.is_none() && lab.as_ref().is_some_and(|l| l.require_signed_images) {
            return Err(AppError::invalid(
                "signature",
                "this lab requires images signed by a campus image authority: add the signature (ssh-keygen -Y sign -n gpu-commons-image over \"gpu-commons-image-v1 NAME:TAG@DIGEST\")",
            ));
        }
        let created_by = match &who {
            Adder::User(a) => a.user.username.clone(),
            Adder::Cli => "admin CLI".to_string(),
        };
        let entry = NewEntry {
            lab_id: lab.as_ref().map(|l| l.id),
            name_tag: &name_tag,
            digest,
            description,
            signature,
            signed_by: signed_by.as_deref(),
            created_by: &created_by,
        };
        let stored = q::insert(c, &entry)?.ok_or_else(|| {
            AppError::conflict(
                "already_allowed",
                format!(
                    "{name_tag} is already on the {} allow-list: remove that entry first to pin another digest",
                    lab.as_ref().map_or("campus".to_string(), |l| format!("lab {}", l.slug))
                ),
            )
        })?;
        let target = format!("image {name_tag}");
        let after = format!(
            "{digest}{}",
            if signed_by.is_some() { " (signed)" } else { "" }
        );
        let lab_id = lab.as_ref().map(|l| l.id);
        audit_allow(c, &who, lab_id, &target, &after)?;
        Ok(view(stored, lab.map(|l| l.slug)))
    })
}

/// The lab an entry is for (its admin adds it; the CLI may name any lab), or none for a
/// campus-wide entry (operators only).
fn entry_lab(c: &mut DbConn, who: &Adder, req: &NewImage) -> Result<Option<Lab>, AppError> {
    let Some(slug) = &req.lab else {
        if let Adder::User(actor) = who {
            actor.require_operator().map_err(|_| {
                AppError::Forbidden(
                    "only operators may allow an image campus-wide; a lab admin names the lab \
                     (\"lab\": \"SLUG\")"
                        .into(),
                )
            })?;
        }
        return Ok(None);
    };
    Ok(Some(match who {
        Adder::User(actor) => super::lab_admin(c, actor, slug)?.lab().clone(),
        Adder::Cli => db::users::find_lab(c, slug)?
            .ok_or_else(|| AppError::invalid("lab", format!("no lab {slug:?}")))?,
    }))
}

fn audit_allow(
    c: &mut DbConn,
    who: &Adder,
    lab_id: Option<i64>,
    target: &str,
    after: &str,
) -> Result<(), AppError> {
    match who {
        Adder::User(a) => {
            db::audit::record(c, &a.user, lab_id, "allow_image", target, "none", after)?
        }
        Adder::Cli => {
            db::audit::record_as(c, "admin CLI", lab_id, "allow_image", target, "none", after)?
        }
    }
    Ok(())
}

/// The pin a job of lab `l` naming `image` runs with, or 422 naming `image` that says
/// how to get it allowed.
pub fn pin_for_job(c: &mut DbConn, l: &Lab, image: &str) -> Result<ImageAllow, AppError> {
    let name = rules::job_image(image)?;
    let entry = q::for_job(c, l.id, &name)?.ok_or_else(|| {
        AppError::invalid(
            "image",
            format!(
                "{name} is not on the image allow-list of lab {} or of the campus: ask a lab admin \
                 to allow it (the lab page's Images, POST /api/v1/images, or an operator's \
                 `commons-portal admin images allow {name} --lab {}`); see the allowed images with \
                 GET /api/v1/images",
                l.slug, l.slug
            ),
        )
    })?;
    if l.require_signed_images && entry.signed_by.is_none() {
        return Err(AppError::invalid(
            "image",
            format!(
                "lab {} runs signed images only, and the allow-list entry of {name} is not signed: ask a lab admin to add it with a campus authority's signature",
                l.slug
            ),
        ));
    }
    Ok(entry)
}

/// Checks that every lab's jobs may name `image`: a campus-wide entry (what a campus
/// app preset needs), or 422 naming `image`.
pub fn check_campus(c: &mut DbConn, image: &str) -> Result<(), AppError> {
    let name = rules::job_image(image)?;
    if q::campus(c, &name)?.is_none() {
        return Err(AppError::invalid(
            "image",
            format!(
                "{name} is not on the campus's image allow-list, so not every lab's jobs may                  run it: allow it campus-wide first (the Images page, POST /api/v1/images),                  or make the preset a lab's"
            ),
        ));
    }
    Ok(())
}

fn views(c: &mut DbConn, entries: Vec<ImageAllow>) -> Result<Vec<ImageView>, AppError> {
    let slugs = q::lab_slugs(c)?;
    Ok(entries
        .into_iter()
        .map(|e| {
            let lab = e.lab_id.and_then(|l| slugs.get(&l).cloned());
            view(e, lab)
        })
        .collect())
}

fn view(e: ImageAllow, lab: Option<String>) -> ImageView {
    ImageView {
        id: e.id,
        name_tag: e.name_tag,
        digest: e.digest,
        description: e.description,
        lab,
        signed_by: e.signed_by,
        signature: e.signature,
        created_by: e.created_by,
        created_at: e.created_at,
    }
}

/// The ID of image `name_tag` in the Docker Engine on this host, from the Docker CLI
/// (`docker image inspect --format '{{.Id}}'`). The portal asks the CLI rather than the
/// engine's API so that it links no Docker client library: this is an operator's
/// convenience on a host that has the image, not a path any job takes.
pub fn local_digest(name_tag: &str) -> Result<String, String> {
    let out = std::process::Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", "--", name_tag])
        .output()
        .map_err(|e| format!("cannot run the docker command: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker image inspect {name_tag}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    rules::digest(&id).map_err(|e| e.message)?;
    Ok(id)
}
