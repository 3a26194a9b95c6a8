//! The agents' side of `lab:` datasets (`commons_proto::DATASETS_PATH`): the node a
//! starting attempt is placed on lists the dataset's files, each with a short-lived URL
//! of its object ([`super::signed`]), and reads each from it (an older agent: through
//! the portal), as for inputs. The job's owner must still be allowed the dataset then.

use super::download::{download_from, Download};
use super::outputs::held;
use super::Space;
use crate::db::{self, DbConn};
use crate::domain::AttemptStatus;
use crate::error::AppError;
use crate::service::datasets::{listing, listing_with_objects, usable_row};
use crate::service::Ctx;
use commons_proto::DatasetListing;

const STARTING: [AttemptStatus; 1] = [AttemptStatus::Starting];

/// The `index`th dataset of the job, if it is a `lab:` one its owner may still use.
fn dataset_of(
    c: &mut DbConn,
    job: i64,
    index: usize,
) -> Result<db::datasets::DatasetRow, AppError> {
    let j = db::jobs::get(c, job)?;
    let d = j
        .datasets
        .0
        .get(index)
        .ok_or(AppError::NotFound("dataset"))?;
    usable_row(c, j.user_id, d)
}

/// The files of a starting attempt's `index`th dataset (each with its URL) and its
/// version, for `node`.
pub async fn listing_for_node(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    index: usize,
) -> Result<DatasetListing, AppError> {
    let (mut files, version) = ctx
        .db
        .run(move |c| {
            held(c, node, job, attempt, &STARTING)?;
            let row = dataset_of(c, job, index)?;
            listing_with_objects(c, &row)
        })
        .await?;
    super::signed::sign_all(ctx, node, job, attempt, &mut files).await?;
    let files = files.into_iter().map(|f| f.0).collect();
    Ok(DatasetListing { version, files })
}

/// One file (`path` in the dataset) of a starting attempt's `index`th dataset.
pub async fn get_for_node(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    index: usize,
    path: &str,
) -> Result<Download, AppError> {
    super::check_path(path)?;
    let want = path.to_string();
    let (space, in_space) = ctx
        .db
        .run(move |c| {
            held(c, node, job, attempt, &STARTING)?;
            let row = dataset_of(c, job, index)?;
            let (files, _) = listing(c, &row)?;
            if !files.iter().any(|f| f.path == want) {
                return Err(AppError::NotFound("file"));
            }
            let slug = db::users::lab_by_id(c, row.lab_id)?.slug;
            let prefix = crate::service::datasets::prefix_of(&row);
            let in_space = if prefix.is_empty() {
                want
            } else {
                format!("{prefix}/{want}")
            };
            Ok::<_, AppError>((Space::of_lab(row.lab_id, &slug), in_space))
        })
        .await?;
    download_from(ctx, space, in_space, None).await
}
