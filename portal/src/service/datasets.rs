//! Lab datasets: registered by a lab's admins, listed to whoever may use them, checked
//! when a job names them (at submission and again when it starts), and turned into the
//! `Start`'s [`DatasetMount`]s.
//!
//! Who may do what:
//! - A lab's admins (and operators) register and remove the lab's datasets; every change
//!   is audited.
//! - A user may use (list, mount) a dataset when they are a member of its lab or its
//!   visibility names one of their labs (or is `campus`). A job whose owner may no
//!   longer use one of its datasets when it starts is told so by its agent's refusal.
//! - A `lab:` dataset's content version is a SHA-256 over its files' paths and
//!   checksums, so every server caches one version per content, and a change of the
//!   folder is a new version.

use super::{Actor, Ctx};
use crate::db::{self, datasets as q, files as rows, DbConn};
use crate::error::AppError;
use commons_api::datasets::{
    check_request, parse_source, DatasetRequest, DatasetView, JobDataset, Source,
};
use commons_proto::{DatasetMount, DatasetSource, InputFile, NodeDatasets};
use sha2::{Digest, Sha256};

/// The slugs of `actor`'s labs.
fn slugs(actor: &Actor) -> Vec<String> {
    actor.labs.iter().map(|(l, _)| l.slug.clone()).collect()
}

/// Registers a dataset of lab `slug` (its admins). A `lab:` source must hold files.
pub async fn register(
    ctx: &Ctx,
    actor: &Actor,
    slug: &str,
    req: DatasetRequest,
) -> Result<DatasetView, AppError> {
    let source = check_request(&req)?;
    let actor = actor.clone();
    let slug = slug.to_string();
    ctx.db
        .run(move |c| {
            crate::db::transaction(c, |c| {
                let admin = super::lab_admin(c, &actor, &slug)?;
                let lab = admin.lab().clone();
                if let Source::Lab { prefix } = &source {
                    if lab_files(c, lab.id, &lab.slug, prefix)?.is_empty() {
                        return Err(AppError::invalid(
                            "source",
                            format!("no files under {:?} in lab {slug}'s files", req.source),
                        ));
                    }
                }
                let row = q::insert(c, lab.id, &req, &actor.user.username)?.ok_or_else(|| {
                    AppError::conflict(
                        "dataset_exists",
                        format!(
                            "lab {slug} has a dataset named {} already: remove it first, or \
                             choose another name",
                            req.name
                        ),
                    )
                })?;
                let target = format!("dataset {slug}/{}", req.name);
                db::audit::record(
                    c,
                    &actor.user,
                    Some(lab.id),
                    "add_dataset",
                    &target,
                    "none",
                    &req.source,
                )?;
                let offers = q::node_offers(c)?;
                Ok(view(&row, &slug, &offers))
            })
        })
        .await
}

/// Removes a dataset of lab `slug` (its admins).
pub async fn remove(ctx: &Ctx, actor: &Actor, slug: &str, name: &str) -> Result<(), AppError> {
    let (actor, slug, name) = (actor.clone(), slug.to_string(), name.to_string());
    ctx.db
        .run(move |c| {
            crate::db::transaction(c, |c| {
                let admin = super::lab_admin(c, &actor, &slug)?;
                let lab = admin.lab().id;
                let row = q::find(c, &slug, &name)?.ok_or(AppError::NotFound("dataset"))?;
                q::delete(c, lab, &name)?;
                let target = format!("dataset {slug}/{name}");
                db::audit::record(
                    c,
                    &actor.user,
                    Some(lab),
                    "remove_dataset",
                    &target,
                    &row.source,
                    "none",
                )
                .map_err(AppError::from)
            })
        })
        .await
}

/// The datasets `actor` may use (operators: all), optionally of one lab only.
pub async fn list(
    ctx: &Ctx,
    actor: &Actor,
    lab: Option<String>,
) -> Result<Vec<DatasetView>, AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            if let Some(l) = &lab {
                db::users::find_lab(c, l)?.ok_or(AppError::NotFound("lab"))?;
            }
            let mine = slugs(&actor);
            let offers = q::node_offers(c)?;
            Ok(q::all(c)?
                .into_iter()
                .filter(|(_, s)| lab.as_ref().is_none_or(|l| l == s))
                .filter(|(r, s)| actor.user.is_operator || r.visibility().allows(s, &mine))
                .map(|(r, s)| view(&r, &s, &offers))
                .collect())
        })
        .await
}

fn view(
    r: &q::DatasetRow,
    slug: &str,
    offers: &[(i64, String, bool, NodeDatasets)],
) -> DatasetView {
    let key = format!("{slug}/{}", r.name);
    let exported_by = match parse_source(&r.source) {
        Ok(Source::Node { name }) => exporters(offers, r.lab_id, &name),
        _ => Vec::new(),
    };
    let cached_on = offers
        .iter()
        .filter(|(.., d)| d.cached.iter().any(|h| h.key == key))
        .count() as u32;
    DatasetView {
        lab: slug.to_string(),
        name: r.name.clone(),
        source: r.source.clone(),
        description: r.description.clone(),
        visibility: r.visibility(),
        exported_by,
        cached_on,
        created_by: r.created_by.clone(),
        created_at: r.created_at,
    }
}

/// The names of lab `lab`'s servers whose agents export `name`.
fn exporters(offers: &[(i64, String, bool, NodeDatasets)], lab: i64, name: &str) -> Vec<String> {
    offers
        .iter()
        .filter(|(l, _, _, d)| *l == lab && d.exports.iter().any(|e| e == name))
        .map(|(_, n, ..)| n.clone())
        .collect()
}

/// Checks a submission's datasets: each registered and usable by `actor`.
pub fn check_for_submit(c: &mut DbConn, actor: &Actor, ds: &[JobDataset]) -> Result<(), AppError> {
    commons_api::datasets::check_job_datasets(ds)?;
    let mine = slugs(actor);
    for d in ds {
        usable(c, d, &mine).map_err(|why| AppError::invalid("datasets", why))?;
    }
    Ok(())
}

/// The dataset `d` names, if a member of the labs `member_of` may use it; else why not.
fn usable(c: &mut DbConn, d: &JobDataset, member_of: &[String]) -> Result<q::DatasetRow, String> {
    let found = q::find(c, &d.lab, &d.name).map_err(|e| e.to_string())?;
    match found {
        Some(r) if r.visibility().allows(&d.lab, member_of) => Ok(r),
        // Not told apart from a missing one: a dataset's name is the lab's business.
        _ => Err(format!(
            "dataset {}: no such dataset, or lab {} does not share it with your labs",
            d.key(),
            d.lab
        )),
    }
}

/// The dataset `d` of a job of `user`, if the user may still use it (422 otherwise).
pub fn usable_row(c: &mut DbConn, user: i64, d: &JobDataset) -> Result<q::DatasetRow, AppError> {
    let member_of: Vec<String> = db::users::labs_of(c, user)?
        .into_iter()
        .map(|(l, _)| l.slug)
        .collect();
    usable(c, d, &member_of).map_err(|why| AppError::invalid("datasets", why))
}

/// A `lab:` dataset's folder in its lab's space (empty: all of it).
pub fn prefix_of(row: &q::DatasetRow) -> String {
    match parse_source(&row.source) {
        Ok(Source::Lab { prefix }) => prefix,
        _ => String::new(),
    }
}

/// A lab's files under `prefix` (all with an empty one), as (path in the dataset, row).
fn lab_files(
    c: &mut DbConn,
    lab: i64,
    slug: &str,
    prefix: &str,
) -> Result<Vec<(String, rows::FileRow)>, AppError> {
    let space = super::files::Space::of_lab(lab, slug);
    let folder = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    Ok(rows::list(c, &space.key, &folder)?
        .into_iter()
        .map(|r| (r.path[folder.len()..].to_string(), r))
        .collect())
}

/// The content version of a listing: SHA-256 over each file's path and checksum.
fn version_of(files: &[InputFile]) -> String {
    let mut h = Sha256::new();
    for f in files {
        h.update(f.path.as_bytes());
        h.update([0]);
        h.update(f.sha256.as_bytes());
        h.update([b'\n']);
    }
    hex::encode(h.finalize())
}

/// A `lab:` dataset's files now, and its version.
pub fn listing(c: &mut DbConn, row: &q::DatasetRow) -> Result<(Vec<InputFile>, String), AppError> {
    let (files, v) = listing_with_objects(c, row)?;
    Ok((files.into_iter().map(|f| f.0).collect(), v))
}

/// [`listing`], each file with its object in the store.
pub fn listing_with_objects(
    c: &mut DbConn,
    row: &q::DatasetRow,
) -> Result<(Vec<(InputFile, String)>, String), AppError> {
    let Ok(Source::Lab { prefix }) = parse_source(&row.source) else {
        return Err(AppError::NotFound("dataset"));
    };
    let slug = db::users::lab_by_id(c, row.lab_id)?.slug;
    let mut files: Vec<(InputFile, String)> = lab_files(c, row.lab_id, &slug, &prefix)?
        .into_iter()
        .map(|(path, r)| {
            let f = InputFile {
                path,
                size: r.bytes.max(0) as u64,
                sha256: r.sha256,
                url: None,
                url_valid_s: None,
            };
            (f, r.object)
        })
        .collect();
    files.sort_by(|a, b| a.0.path.cmp(&b.0.path));
    let only: Vec<InputFile> = files.iter().map(|f| f.0.clone()).collect();
    let v = version_of(&only);
    Ok((files, v))
}

/// The `Start`'s mounts for a job of `user` naming `ds`: each dataset checked again (it
/// is still there and the owner may still use it). `Err`: why the job cannot start.
pub fn mounts_for_start(
    c: &mut DbConn,
    user: i64,
    ds: &[JobDataset],
) -> Result<Vec<DatasetMount>, AppError> {
    if ds.is_empty() {
        return Ok(Vec::new());
    }
    let member_of: Vec<String> = db::users::labs_of(c, user)?
        .into_iter()
        .map(|(l, _)| l.slug)
        .collect();
    let mut out = Vec::new();
    for d in ds {
        let row = usable(c, d, &member_of).map_err(|why| AppError::invalid("datasets", why))?;
        let source = match parse_source(&row.source)? {
            Source::Lab { .. } => DatasetSource::Lab {
                version: listing(c, &row)?.1,
            },
            Source::Https { url, sha256 } => DatasetSource::Https { url, sha256 },
            Source::Node { name } => DatasetSource::Node { name },
        };
        out.push(DatasetMount {
            key: d.key(),
            mount: d.mount_or_default(),
            source,
        });
    }
    Ok(out)
}
