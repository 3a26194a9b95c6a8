//! The executor's datasets work (see `datasets::here` for the journey): a starting
//! attempt whose job names datasets gets each one's host directory (an export, or the
//! cache's copy, fetched first when the cache lacks it) before its container is
//! created; the job's log says where each came from, or which failed and why (the
//! attempt then fails with that reason).

use super::checkpoints::job_log;
use super::{upgrade, Inner, Launch};
use crate::checkpoint::CheckpointClient;
use crate::outbox::Outbox;
use crate::reconcile::Key;
use crate::runtime::ContainerRuntime;
use std::path::{Path, PathBuf};
use std::sync::Weak;

/// The datasets' (mount, host directory) pairs; `None`: the executor went away.
pub(super) async fn prepare<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    client: Option<&CheckpointClient>,
    events: &Outbox,
    key: Key,
    attempt_dir: &Path,
    launch: &Launch,
) -> Option<Result<Vec<(String, PathBuf)>, String>> {
    let mounts = &launch.spec.datasets;
    if mounts.is_empty() {
        return Some(Ok(Vec::new()));
    }
    let here = upgrade(weak)?.inner.datasets.get().cloned();
    let Some(here) = here else {
        return Some(Err(
            "this server takes no datasets (its agent keeps no cache)".into(),
        ));
    };
    job_log(events, key, "preparing the job's datasets");
    let log = |line: &str| job_log(events, key, line);
    let got = here.prepare(client, key, attempt_dir, mounts, &log).await;
    if let Err(e) = &got {
        job_log(events, key, &format!("datasets failed: {e}"));
    }
    (weak.strong_count() > 0).then_some(got)
}
