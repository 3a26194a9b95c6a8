//! The executor's side of jobs' disks (see `disk`): each starting attempt's volume, made
//! with its cap before anything is restored into it; the watch over volumes while their
//! containers run; and the floor, below which a guest's `Start` is turned back.
//!
//! Invariants: an attempt's volume exists, and its cap is in the table and in
//! `disk.json`, before its checkpoint is restored or its container created; a watched
//! volume over its cap has its container stopped (once, with the reason in the job's
//! log); a guest refused at the floor never gets a container and goes back to the queue
//! (its result says why).

use super::checkpoints::job_log;
use super::{upgrade, Executor, Inner, Table};
use crate::checkpoint::archive::binary;
use crate::disk::{self, DiskFile, Enforcement};
use crate::reconcile::{Key, Phase, StopOrder, Why};
use crate::runtime::ContainerRuntime;
use commons_proto::{JobSpec, StopReason};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;

/// What the executor keeps of an attempt's volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Volume {
    pub cap: u64,
    pub how: Enforcement,
    /// The job was told its volume is full (image mode), once.
    pub noted_full: bool,
}

impl Volume {
    fn of(file: DiskFile) -> Self {
        Self {
            cap: file.cap_bytes,
            how: file.enforced_by,
            noted_full: false,
        }
    }
}

/// Below this much free space an image volume counts as full (ext4 keeps a little back).
const FULL_BELOW: u64 = 16 << 20;

impl<R: ContainerRuntime> Executor<R> {
    /// The attempt's cap in bytes: its volume's, or (an attempt from before volumes) the
    /// node's largest.
    pub(super) fn cap_of(&self, t: &Table, key: Key) -> u64 {
        t.volumes
            .get(&key)
            .map(|v| v.cap)
            .or_else(|| DiskFile::read(&self.inner.store.dir(key)).map(|f| f.cap_bytes))
            .unwrap_or_else(|| self.inner.disk.cap_for(None).0)
    }

    /// Why a guest's `Start` is turned back now (the server is under its free-space
    /// floor), if it is.
    pub(super) fn floor_refusal(&self, spec: &JobSpec) -> Option<StopOrder> {
        if !spec.guest {
            return None;
        }
        let why = disk::floor::below(&self.inner.disk, self.inner.store.state_dir())?;
        tracing::warn!("a guest's start turned back: {why}");
        Some(StopOrder {
            grace: Duration::ZERO,
            why: Why {
                reason: StopReason::Preempted,
                text: format!("not started: {why}"),
                fails: false,
            },
        })
    }

    /// Takes back the volumes of attempts restored after a restart: mounts again the
    /// images a reboot unmounted, and keeps their caps.
    pub(super) fn reattach(&self, keys: &[Key]) {
        for key in keys {
            let dir = self.inner.store.dir(*key);
            match disk::reattach(&dir) {
                Ok(Some(file)) => {
                    self.table().volumes.insert(*key, Volume::of(file));
                }
                Ok(None) => {}
                Err(e) => tracing::error!(
                    job = key.0,
                    attempt = key.1,
                    "cannot mount the attempt's volume again: {e}"
                ),
            }
        }
    }
}

/// Makes the starting attempt's volume with the cap its spec asks for (at most the
/// node's largest, which is said in the job's log when it asked for more); returns the
/// cap. `None`: the executor went away meanwhile.
pub(super) async fn prepare<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    dir: &Path,
    key: Key,
    spec: &JobSpec,
) -> Option<Result<u64, String>> {
    let (policy, events) = {
        let exec = upgrade(weak)?;
        (exec.inner.disk, exec.inner.events.clone())
    };
    let (cap, cut) = policy.cap_for(spec.disk_gb);
    if cut {
        let text = format!(
            "the job asks for {} GiB of disk (disk_gb); this server gives a job at most {} \
             GiB, so its volume holds {}",
            spec.disk_gb.unwrap_or_default(),
            policy.max_job_gb,
            binary(cap)
        );
        job_log(&events, key, &text);
    }
    let how = policy.enforcement();
    let d = dir.to_path_buf();
    let made = tokio::task::spawn_blocking(move || disk::prepare(&d, cap, how))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    if let Err(e) = made {
        return Some(Err(format!("cannot make the job's disk volume: {e}")));
    }
    let exec = upgrade(weak)?;
    exec.table().volumes.insert(
        key,
        Volume::of(DiskFile {
            cap_bytes: cap,
            enforced_by: how,
        }),
    );
    Some(Ok(cap))
}

/// Looks at every running attempt's volume every [`disk::WATCH_EVERY`], for as long as
/// the executor lives: a watched one over its cap is stopped, a full image is said once
/// in the job's log.
pub(super) fn spawn_watch<R: ContainerRuntime>(weak: Weak<Inner<R>>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(disk::WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(exec) = upgrade(&weak) else { break };
            for (key, dir, v) in running_volumes(&exec) {
                let looked = tokio::task::spawn_blocking(move || look(&dir, v)).await;
                match looked {
                    Ok(Some(Seen::Over(used))) => exec.over_cap(key, used, v.cap),
                    Ok(Some(Seen::Full)) => exec.full(key, v.cap),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("measuring a volume: {e}"),
                }
            }
        }
    });
}

fn running_volumes<R: ContainerRuntime>(exec: &Executor<R>) -> Vec<(Key, PathBuf, Volume)> {
    let t = exec.table();
    t.volumes
        .iter()
        .filter(|(key, _)| {
            t.have.get(key).is_some_and(|h| {
                h.result.is_none()
                    && h.stopping.is_none()
                    && matches!(
                        h.phase,
                        Phase::Running { .. } | Phase::Found { running: true, .. }
                    )
            }) && t.want.get(key).is_some_and(|w| w.stop.is_none())
        })
        .filter(|(_, v)| v.how == Enforcement::Watch || !v.noted_full)
        .map(|(key, v)| (*key, disk::volume_dir(&exec.inner.store.dir(*key)), *v))
        .collect()
}

enum Seen {
    /// A watched volume holds this much, over its cap.
    Over(u64),
    /// An image volume has no room left.
    Full,
}

fn look(dir: &Path, v: Volume) -> Option<Seen> {
    match v.how {
        Enforcement::Watch => match crate::checkpoint::walk::usage(dir) {
            Ok(u) if u.charged > v.cap => Some(Seen::Over(u.charged)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("measuring {}: {e}", dir.display());
                None
            }
        },
        Enforcement::Image => match disk::free_space(dir) {
            Ok((free, _)) if free < FULL_BELOW => Some(Seen::Full),
            _ => None,
        },
    }
}

impl<R: ContainerRuntime> Executor<R> {
    /// Stops a watched attempt over its cap at once (more grace is more writing): the
    /// job ends, with the reason, rather than going back to the queue to fill it again.
    fn over_cap(&self, key: Key, used: u64, cap: u64) {
        let text = format!(
            "stopped: /checkpoint holds {} (files at their apparent size), over the job's \
             disk cap of {} (disk_gb)",
            binary(used),
            binary(cap)
        );
        job_log(&self.inner.events, key, &text);
        let why = Why {
            reason: StopReason::Cancelled,
            text,
            fails: false,
        };
        self.stop_with(key, Duration::ZERO, why);
    }

    fn full(&self, key: Key, cap: u64) {
        if let Some(v) = self.table().volumes.get_mut(&key) {
            v.noted_full = true;
        }
        let text = format!(
            "/checkpoint is full: the job's disk cap is {} (disk_gb), and writes past it \
             fail with 'No space left on device'",
            binary(cap)
        );
        job_log(&self.inner.events, key, &text);
    }
}
