//! The executor's `/outputs` work (see `outputs` for the journeys): the starting attempt's
//! directory, with what earlier attempts kept put back into it; the upload after the
//! attempt ended. Each tells the job what became of its outputs in the job's own log.
//!
//! Invariant: the directory exists, owned by the job's user, before the container is
//! created (Docker would make a missing bind source itself, owned by root).

use super::checkpoints::job_log;
use super::checkpoints::size;
use crate::checkpoint::{prepare_dir, CheckpointClient};
use crate::outbox::Outbox;
use crate::outputs::{self, Kept};
use crate::reconcile::Key;
use std::path::Path;

/// Makes the attempt's `/outputs` directory, and (attempt 2 on) puts back what earlier
/// attempts kept. A restore that fails starts with what arrived, and says so.
pub(super) async fn prepare(
    client: Option<&CheckpointClient>,
    events: &Outbox,
    key: Key,
    attempt_dir: &Path,
) -> Result<(), String> {
    let host = outputs::host_dir(attempt_dir);
    let h = host.clone();
    tokio::task::spawn_blocking(move || prepare_dir(&h))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|e| format!("cannot make the outputs directory {}: {e}", host.display()))?;
    let (Some(client), true) = (client, key.1 > 1) else {
        return Ok(());
    };
    match outputs::restore(client, key, &host).await {
        Ok(got) if got.files == 0 => {}
        Ok(got) => job_log(
            events,
            key,
            &format!(
                "restored /outputs as earlier attempts left it ({} files, {})",
                got.files,
                size(got.bytes)
            ),
        ),
        Err(e) => job_log(
            events,
            key,
            &format!("could not restore /outputs ({e}): it holds only what arrived"),
        ),
    }
    Ok(())
}

/// Sends the ended attempt's `/outputs` to the portal, saying in the job's log where they
/// are kept or why not.
pub(super) async fn send(client: &CheckpointClient, events: &Outbox, key: Key, attempt_dir: &Path) {
    let host = outputs::host_dir(attempt_dir);
    let (job, _) = key;
    let log = |text: String| job_log(events, key, &text);
    let skipped = |s: &outputs::Sent| {
        if !s.skipped.is_empty() {
            log(format!(
                "left out of /outputs (not regular files): {}",
                s.skipped.join(", ")
            ));
        }
    };
    match outputs::upload(client, key, &host).await {
        Kept::All(s) if s.files == 0 => skipped(&s),
        Kept::All(s) => {
            log(format!(
                "/outputs kept in your files under jobs/{job}/ ({} files, {})",
                s.files,
                size(s.bytes)
            ));
            skipped(&s);
        }
        Kept::Refused { sent, file, error } => log(format!(
            "/outputs NOT all kept: {file} was refused ({error}); {} files before it were kept",
            sent.files
        )),
        Kept::Failed { sent, file, error } => log(format!(
            "/outputs NOT all kept: gave up on {file} after failures ({error}); {} files before it were kept",
            sent.files
        )),
    }
}
