//! The executor's checkpoint work (see `checkpoint` for the journeys themselves): the
//! `/checkpoint` of a starting attempt, restored when the portal says so; periodic
//! snapshots while it runs; the upload after it stopped. Each tells the job what became
//! of its checkpoint in the job's own log (`Logs` lines that start with [`LOG_PREFIX`]).
//!
//! Invariants: one journey per attempt at a time (reconcile issues `Snapshot` only while
//! none is busy, and `Upload` only once no snapshot is); the final upload's outcome is
//! written to `checkpoint.json` before the attempt may be reported, so a restarted agent
//! does not try it again; an upload the agent abandoned (it went away) is left for the
//! next agent, which resumes it.

use super::{upgrade, volumes, Executor, Inner, Table};
use crate::checkpoint::upload::{self, Budget, Outcome, Restore};
use crate::checkpoint::{
    self, prepare_dir, ApiError, CheckpointClient, CheckpointFile, FinalUpload,
};
use crate::clock;
use crate::outbox::Outbox;
use crate::reconcile::{uploads_checkpoint, Key, Launch, UploadStage};
use crate::runtime::{CheckpointMount, ContainerRuntime};
use crate::store::Store;
use commons_proto::AgentMsg;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How the agent's lines in a job's log begin.
pub const LOG_PREFIX: &str = "[GPU Commons]";

/// Tells the job's owner, in the job's log.
pub(super) fn job_log(events: &Outbox, (job, attempt): Key, text: &str) {
    tracing::info!(job, attempt, "{text}");
    events.send(AgentMsg::Logs {
        job,
        attempt,
        chunk: format!("{LOG_PREFIX} {text}\n"),
    });
}

/// Bytes in words: "812 B", "3.4 MB", "12.0 GB".
pub(super) fn size(bytes: u64) -> String {
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", bytes as f64 / 1e6),
        _ => format!("{:.1} GB", bytes as f64 / 1e9),
    }
}

/// A refusal in words for the job's owner.
fn refusal(e: &ApiError) -> String {
    match (e.code(), e) {
        (Some("checkpoint_cap"), ApiError::Status { message, .. }) => {
            format!("the lab's checkpoint storage is full ({message})")
        }
        (Some("checkpoint_attempt_cap"), ApiError::Status { message, .. }) => {
            format!("/checkpoint is larger than an attempt may store ({message})")
        }
        _ => e.to_string(),
    }
}

/// Cancels the attempt's snapshot in flight, if any.
pub(super) fn cancel_snapshot(t: &mut Table, key: Key) {
    if let Some(c) = t.cancels.remove(&key) {
        c.store(true, Ordering::Relaxed);
    }
}

impl<R: ContainerRuntime> Executor<R> {
    pub(super) fn begin_snapshot(&self, t: &mut Table, key: Key, next: Duration) {
        let Some(s) = t.have.get_mut(&key).and_then(|h| h.snapshots.as_mut()) else {
            return;
        };
        s.busy = true;
        s.next = next;
        let cancel = Arc::new(AtomicBool::new(false));
        t.cancels.insert(key, cancel.clone());
        tokio::spawn(snapshot_task(self.weak(), key, cancel));
    }

    pub(super) fn begin_upload(&self, t: &mut Table, key: Key) {
        if let Some(h) = t.have.get_mut(&key) {
            h.upload = UploadStage::Busy;
        }
        tokio::spawn(upload_task(self.weak(), key));
    }
}

/// What a journey needs from the executor: the client, the events, the attempt's dir
/// and its disk cap in bytes.
type Parts = (Option<CheckpointClient>, Outbox, PathBuf, u64);

fn parts<R: ContainerRuntime>(weak: &Weak<Inner<R>>, key: Key) -> Option<Parts> {
    let exec = upgrade(weak)?;
    let cap = exec.cap_of(&exec.table(), key);
    let inner = &exec.inner;
    Some((
        inner.checkpoints.clone(),
        inner.events.clone(),
        inner.store.dir(key),
        cap,
    ))
}

/// Makes the starting attempt's volume (`volumes.rs`) and its checkpoint directory in
/// it, restoring the job's checkpoint into it first when `launch.resume` (a failed
/// restore, or one over the job's disk cap, starts it empty and says why in the job's
/// log), and writes `checkpoint.json`. `None`: the executor went away meanwhile.
pub(super) async fn prepare<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    store: &Store,
    key: Key,
    launch: &Launch,
) -> Option<Result<CheckpointMount, String>> {
    let (job, attempt) = key;
    let (client, events, _, _) = parts(weak, key)?;
    let dir = store.dir(key);
    let alive = || weak.strong_count() > 0;
    let mut file = CheckpointFile {
        interval_s: launch.spec.checkpoint_interval_s,
        ..Default::default()
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::error!(job, attempt, "cannot create {}: {e}", dir.display());
    }
    let cap = match volumes::prepare(weak, &dir, key, &launch.spec).await? {
        Ok(cap) => cap,
        Err(e) => return Some(Err(e)),
    };
    if launch.resume {
        match upload::restore(client.as_ref(), job, &dir, cap, &alive).await {
            Restore::Restored {
                bytes,
                entries,
                from_attempt,
                fingerprint,
            } => {
                file.resumed = true;
                file.stored = fingerprint;
                let of = from_attempt.map_or_else(String::new, |a| format!(" of attempt {a}"));
                let text = format!(
                    "restored the checkpoint{of} into /checkpoint ({}, {entries} entries); \
                     COMMONS_RESUME=1",
                    size(bytes)
                );
                job_log(&events, key, &text);
            }
            Restore::Fresh(why) => {
                let text = format!(
                    "could not restore the job's checkpoint ({why}): starting with an empty \
                     /checkpoint, without COMMONS_RESUME"
                );
                job_log(&events, key, &text);
            }
        }
    }
    if !alive() {
        return None;
    }
    let host = checkpoint::host_dir(&dir);
    let h = host.clone();
    let made = tokio::task::spawn_blocking(move || prepare_dir(&h))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    if let Err(e) = made {
        return Some(Err(format!(
            "cannot make the checkpoint directory {}: {e}",
            host.display()
        )));
    }
    let inputs_dir = match beside(weak, client.as_ref(), &events, key, &dir, cap, launch).await? {
        Ok(d) => d,
        Err(e) => return Some(Err(e)),
    };
    let datasets =
        match super::datasets::prepare(weak, client.as_ref(), &events, key, &dir, launch).await? {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
    if let Err(e) = file.write(&dir) {
        tracing::error!(
            job,
            attempt,
            "{e}; a restarted agent will take no periodic checkpoints of this attempt"
        );
    }
    Some(Ok(CheckpointMount {
        host_dir: host,
        resumed: file.resumed,
        outputs_dir: crate::outputs::host_dir(&dir),
        inputs_dir,
        datasets,
        share: None,
    }))
}

/// The directories beside `/checkpoint`: `/outputs` (with what earlier attempts kept)
/// and, when the job names inputs, `/inputs` staged (its directory). `None`: the
/// executor went away meanwhile.
async fn beside<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    client: Option<&CheckpointClient>,
    events: &Outbox,
    key: Key,
    dir: &std::path::Path,
    cap: u64,
    launch: &Launch,
) -> Option<Result<Option<PathBuf>, String>> {
    if let Err(e) = super::outputs::prepare(client, events, key, dir).await {
        return Some(Err(e));
    }
    let named = launch.spec.inputs.len();
    let staged = super::inputs::prepare(weak, client, events, key, dir, cap, named).await;
    (weak.strong_count() > 0).then_some(staged)
}

async fn snapshot_task<R: ContainerRuntime>(
    weak: Weak<Inner<R>>,
    key: Key,
    cancel: Arc<AtomicBool>,
) {
    let Some((client, events, dir, cap)) = parts(&weak, key) else {
        return;
    };
    let mut refused = false;
    if let Some(client) = client {
        let alive = || weak.strong_count() > 0;
        let budget = Budget::Rounds(client.policy().snapshot_tries);
        match upload::upload(&client, key, &dir, cap, budget, cancel, &alive).await {
            Outcome::Stored { bytes, skipped } => {
                job_log(
                    &events,
                    key,
                    &format!("periodic checkpoint stored ({})", size(bytes)),
                );
                left_out(&events, key, &skipped);
            }
            Outcome::Nothing(_) | Outcome::Abandoned => {}
            Outcome::Refused(e) => {
                refused = true;
                let text = format!(
                    "periodic checkpoint not stored: {}; no more periodic checkpoints for \
                     this attempt (the one after it stops is still tried)",
                    refusal(&e)
                );
                job_log(&events, key, &text);
            }
            Outcome::Unarchivable(e) => {
                let text = format!("periodic checkpoint failed: cannot archive /checkpoint ({e})");
                job_log(&events, key, &text);
            }
            Outcome::Failed(e) => {
                let text =
                    format!("periodic checkpoint not stored ({e}); trying again at the next one");
                job_log(&events, key, &text);
            }
        }
    }
    let Some(exec) = upgrade(&weak) else { return };
    {
        let mut t = exec.table();
        t.cancels.remove(&key);
        if let Some(h) = t.have.get_mut(&key) {
            match h.snapshots.as_mut() {
                Some(_) if refused => h.snapshots = None,
                Some(s) => s.busy = false,
                None => {}
            }
        }
    }
    exec.step(clock::now());
}

fn left_out(events: &Outbox, key: Key, skipped: &[String]) {
    if !skipped.is_empty() {
        let text = format!("left out of the checkpoint: {}", skipped.join(", "));
        job_log(events, key, &text);
    }
}

async fn upload_task<R: ContainerRuntime>(weak: Weak<Inner<R>>, key: Key) {
    let (job, attempt) = key;
    let Some((client, events, dir, cap)) = parts(&weak, key) else {
        return;
    };
    let Some(result) = upgrade(&weak).and_then(|e| e.table().have.get(&key)?.result.clone()) else {
        return;
    };
    if let Some(c) = &client {
        super::outputs::send(c, &events, key, &dir).await;
    }
    let fin = if uploads_checkpoint(&result) {
        match checkpoint_upload(&weak, client.as_ref(), &events, key, &dir, cap).await {
            Some(fin) => fin,
            // The agent went away: the next one resumes this upload.
            None => return,
        }
    } else {
        FinalUpload::Nothing
    };
    if let Err(e) = CheckpointFile::update(&dir, |f| f.final_upload = Some(fin)) {
        tracing::error!(job, attempt, "{e}; a restarted agent would upload again");
    }
    let Some(exec) = upgrade(&weak) else { return };
    if let Some(h) = exec.table().have.get_mut(&key) {
        h.upload = UploadStage::Done;
    }
    exec.step(clock::now());
}

/// The checkpoint upload after the attempt stopped; `None` when the agent went away.
async fn checkpoint_upload<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    client: Option<&CheckpointClient>,
    events: &Outbox,
    key: Key,
    dir: &std::path::Path,
    cap: u64,
) -> Option<FinalUpload> {
    let (job, attempt) = key;
    let fin = match client {
        None => {
            tracing::info!(
                job,
                attempt,
                "no checkpoint store: the checkpoint stays here"
            );
            FinalUpload::Nothing
        }
        Some(c) => {
            let alive = || weak.strong_count() > 0;
            let give_up = c.policy().give_up_after;
            let budget = Budget::NoProgressFor(give_up);
            let never = Arc::new(AtomicBool::new(false));
            let log = |text: &str| job_log(events, key, text);
            match upload::upload(c, key, dir, cap, budget, never, &alive).await {
                // The agent went away: the next one resumes this upload.
                Outcome::Abandoned => return None,
                Outcome::Stored { bytes, skipped } => {
                    log(&format!(
                        "checkpoint stored ({}): the next attempt resumes from it",
                        size(bytes)
                    ));
                    left_out(events, key, &skipped);
                    FinalUpload::Stored
                }
                Outcome::Nothing(why) => {
                    log(&format!("no new checkpoint stored: {why}"));
                    FinalUpload::Nothing
                }
                Outcome::Refused(e) => {
                    log(&format!("checkpoint NOT stored: {}", refusal(&e)));
                    FinalUpload::GivenUp
                }
                Outcome::Unarchivable(e) => {
                    log(&format!(
                        "checkpoint NOT stored: cannot archive /checkpoint ({e})"
                    ));
                    FinalUpload::GivenUp
                }
                Outcome::Failed(e) => {
                    log(&format!(
                        "checkpoint NOT stored: gave up after {} s of failures ({e})",
                        give_up.as_secs()
                    ));
                    FinalUpload::GivenUp
                }
            }
        }
    };
    Some(fin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_refusals_read_well() {
        let over = |code: &str| ApiError::Status {
            status: 409,
            code: Some(code.into()),
            message: "m".into(),
        };
        assert_eq!(
            refusal(&over("checkpoint_attempt_cap")),
            "/checkpoint is larger than an attempt may store (m)"
        );
        assert_eq!(
            refusal(&over("checkpoint_cap")),
            "the lab's checkpoint storage is full (m)"
        );
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(812), "812 B");
        assert_eq!(size(3_400_000), "3.4 MB");
        assert_eq!(size(12_000_000_000), "12.0 GB");
    }
}
