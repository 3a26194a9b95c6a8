//! The executor's `/inputs` work (see `inputs` for the journey): a starting attempt whose
//! job names inputs has them staged into its volume before its container is created; the
//! job's log says what was staged, or which file failed and why (and the attempt then
//! fails with that reason).
//!
//! Invariant: staging stops as soon as the attempt is no longer wanted here (stopped,
//! cancelled, forgotten) or the agent is going away.

use super::checkpoints::{job_log, size};
use super::{upgrade, Inner};
use crate::checkpoint::CheckpointClient;
use crate::inputs;
use crate::outbox::Outbox;
use crate::reconcile::Key;
use crate::runtime::ContainerRuntime;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Instant;

/// Stages the job's inputs into the attempt's inputs directory, within `cap` bytes.
/// `Ok(None)`: the job names none. `Err`: the reason the attempt fails.
pub(super) async fn prepare<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    client: Option<&CheckpointClient>,
    events: &Outbox,
    key: Key,
    attempt_dir: &Path,
    cap: u64,
    named: usize,
) -> Result<Option<PathBuf>, String> {
    if named == 0 {
        return Ok(None);
    }
    let Some(client) = client else {
        return Err(
            "this server has no connection to the portal's files: cannot stage /inputs".into(),
        );
    };
    let dir = inputs::host_dir(attempt_dir);
    let d = dir.clone();
    tokio::task::spawn_blocking(move || std::fs::create_dir_all(&d))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|e| format!("cannot make the inputs directory {}: {e}", dir.display()))?;
    let keep_going = || {
        upgrade(weak).is_some_and(|e| e.table().want.get(&key).is_some_and(|w| w.stop.is_none()))
    };
    let began = Instant::now();
    job_log(events, key, "staging the job's inputs into /inputs");
    match inputs::stage(client, key, &dir, cap, &keep_going).await {
        Ok(s) => {
            let secs = began.elapsed().as_secs_f64();
            let text = format!(
                "staged {} input files ({}) into /inputs in {secs:.1} s; the time limit counts \
                 from now",
                s.files,
                size(s.bytes)
            );
            job_log(events, key, &text);
            Ok(Some(dir))
        }
        Err(f) => {
            let text = format!("staging failed: {f}");
            job_log(events, key, &text);
            Err(text)
        }
    }
}
