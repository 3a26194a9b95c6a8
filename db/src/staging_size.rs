//! How many bytes a queued job's start will fetch: its inputs and its `lab:` datasets,
//! as the file spaces hold them now. The snapshot passes it to the scheduler, whose
//! start estimates add the time to fetch them (`commons_sched::QueuedJob::stage_bytes`).
//!
//! Only jobs that name inputs or datasets cost queries, one per distinct file or folder
//! in a snapshot ([`Sizes`] remembers each: an array's tasks, or many jobs mounting one
//! dataset, cost one query between them); `https:` datasets count nothing (their size is known only once fetched), `node:`
//! ones nothing (read in place).

use super::files;
use super::{DbConn, DbError};
use commons_api::datasets::JobDataset;
use commons_api::files::{parse_input, Space};
use std::collections::BTreeMap;

/// The sizes read so far in one snapshot, by (space, path, folder).
#[derive(Default)]
pub struct Sizes(BTreeMap<(String, String, bool), u64>);

impl Sizes {
    /// The bytes of the files under `path` (a folder ending in `/`), or of the file
    /// `path`; read once per snapshot.
    fn bytes_of(
        &mut self,
        c: &mut DbConn,
        space: String,
        path: String,
        folder: bool,
    ) -> Result<u64, DbError> {
        let key = (space, path, folder);
        if let Some(&n) = self.0.get(&key) {
            return Ok(n);
        }
        let (space, path, _) = &key;
        let rows = if folder {
            files::list(c, space, path)?
        } else {
            files::get(c, space, path)?.into_iter().collect()
        };
        let n = rows.iter().map(|r| r.bytes.max(0) as u64).sum();
        self.0.insert(key, n);
        Ok(n)
    }
}

/// A job's inputs (as written) and datasets (JSON), for owner `user`; `labs` maps slugs
/// to ids, `lab_sources` `LAB/NAME` to `(lab id, PREFIX)` for `lab:` datasets.
pub fn stage_bytes(
    c: &mut DbConn,
    sizes: &mut Sizes,
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
        total += sizes.bytes_of(c, space, input.prefix(), input.folder)?;
    }
    for d in datasets {
        if let Some((lab, prefix)) = lab_sources.get(&d.key()) {
            let folder = if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            };
            total += sizes.bytes_of(c, format!("lab:{lab}"), folder, true)?;
        }
    }
    Ok(total)
}
