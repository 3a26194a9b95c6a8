//! How many bytes a queued job's start will fetch: its inputs and its `lab:` datasets,
//! as the file spaces hold them now. The snapshot passes it to the scheduler, whose
//! start estimates add the time to fetch them (`commons_sched::QueuedJob::stage_bytes`).
//!
//! Only jobs that name inputs or datasets cost queries (one per input or dataset);
//! `https:` datasets count nothing (their size is known only once fetched), `node:`
//! ones nothing (read in place).

use super::files;
use super::{DbConn, DbError};
use commons_api::datasets::JobDataset;
use commons_api::files::{parse_input, Space};
use std::collections::BTreeMap;

/// The bytes of the files under `prefix` (a folder ending in `/`), or of the file `path`.
fn bytes_of(c: &mut DbConn, space: &str, path: &str, folder: bool) -> Result<u64, DbError> {
    let rows = if folder {
        files::list(c, space, path)?
    } else {
        files::get(c, space, path)?.into_iter().collect()
    };
    Ok(rows.iter().map(|r| r.bytes.max(0) as u64).sum())
}

/// A job's inputs (as written) and datasets (JSON), for owner `user`; `labs` maps slugs
/// to ids, `lab_sources` `LAB/NAME` to `(lab id, PREFIX)` for `lab:` datasets.
pub fn stage_bytes(
    c: &mut DbConn,
    user: i64,
    inputs: &[String],
    datasets: &[JobDataset],
    labs: &BTreeMap<String, i64>,
    lab_sources: &BTreeMap<String, (i64, String)>,
) -> Result<u64, DbError> {
    let mut total = 0;
    for written in inputs {
        let Ok(input) = parse_input(written) else {
            continue;
        };
        let space = match &input.space {
            Space::Mine => format!("user:{user}"),
            Space::Lab(slug) => match labs.get(slug) {
                Some(id) => format!("lab:{id}"),
                None => continue,
            },
        };
        total += bytes_of(c, &space, &input.prefix(), input.folder)?;
    }
    for d in datasets {
        if let Some((lab, prefix)) = lab_sources.get(&d.key()) {
            let folder = if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            };
            total += bytes_of(c, &format!("lab:{lab}"), &folder, true)?;
        }
    }
    Ok(total)
}
