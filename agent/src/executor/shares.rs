//! Shares of one GPU, as the executor keeps them (issue 32; the rules are in `share`).
//!
//! 1. A `Start` is admitted against what the attempts that have not ended hold
//!    ([`Executor::share_refusal`]); one that does not fit never starts, and its result
//!    (failed) says why. What an admitted attempt holds is kept in the table and in its
//!    `gpus.json`, so a restarted agent counts it too.
//! 2. A share attempt's container gets `share_env` (and, in `mps` mode, its GPU's MPS
//!    pipe directory, the daemon started first): [`mount`].
//! 3. Every [`ShareConfig::watch_every`], the share watch: keeps one MPS daemon per GPU
//!    that carries a share and stops the others (`mps`), sums each share attempt's GPU
//!    memory from the GPU's processes (what heartbeats report), and, in `timeslice` mode,
//!    stops an attempt over its share's memory, as failed, with the words of
//!    `share::over_memory`.
//!
//! Invariant: an attempt holds its GPUs from its admission until its container has ended
//! (or it never started); only attempts that hold them count against a new one.

use super::checkpoints::job_log;
use super::{container_of, upgrade, Executor, Inner, Table};
use crate::gpu::GpuSource;
use crate::reconcile::{ContainerObs, Key, Launch, Phase, StopOrder, Why, ENFORCE_GRACE};
use crate::runtime::{ContainerRuntime, ShareMount};
use crate::share::{self, mps::Mps, Hold, ShareConfig, Sharer};
use crate::store::HoldFile;
use commons_proto::{GpuInfo, ShareMode};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The share settings the session gave the executor.
pub(super) struct Shares {
    config: ShareConfig,
    /// Each GPU's memory in MiB, from the inventory.
    memory: BTreeMap<String, u64>,
    /// The MPS daemons (`mps` mode).
    mps: Option<Mps>,
}

impl<R: ContainerRuntime> Executor<R> {
    /// Takes shares as `config` says (once; later calls change nothing), for the GPUs of
    /// `inventory`, reading their processes from `gpus`; starts the share watch. MPS
    /// daemons' directories go under `config.mps_dir`, else `<state_dir>/mps`. Call it
    /// inside a Tokio runtime, before the first `Start`.
    pub fn set_shares(
        &self,
        config: ShareConfig,
        inventory: &[GpuInfo],
        gpus: Arc<dyn GpuSource>,
        state_dir: &Path,
    ) {
        let mps = (config.mode == Some(ShareMode::Mps)).then(|| {
            let dir = config
                .mps_dir
                .clone()
                .unwrap_or_else(|| state_dir.join("mps"));
            Mps::new(config.mps_control.clone(), dir)
        });
        let every = config.watch_every.max(Duration::from_millis(100));
        let shares = Shares {
            memory: inventory
                .iter()
                .map(|g| (g.uuid.clone(), g.memory_mb))
                .collect(),
            config,
            mps,
        };
        if self.inner.shares.set(shares).is_err() || self.share_mode().is_none() {
            return;
        }
        tokio::spawn(watch_loop(self.weak(), gpus, every));
    }

    /// How this agent takes shares (what `Hello` says); `None`: it takes none.
    pub fn share_mode(&self) -> Option<ShareMode> {
        self.inner.shares.get().and_then(|s| s.config.mode)
    }

    /// The GPUs whose MPS control daemon the agent supervises now.
    pub fn mps_daemons(&self) -> BTreeSet<String> {
        self.inner
            .shares
            .get()
            .and_then(|s| s.mps.as_ref())
            .map(Mps::supervised)
            .unwrap_or_default()
    }

    /// The pipe directory of a GPU's MPS daemon on the host (`mps` mode).
    pub fn mps_pipe_dir(&self, gpu: &str) -> Option<std::path::PathBuf> {
        let shares = self.inner.shares.get()?;
        Some(shares.mps.as_ref()?.pipe_dir(gpu))
    }

    /// Why `launch` may not start beside what the attempts here hold, as a stop order
    /// that ends it failed before it starts; `None`: it may.
    pub(super) fn share_refusal(&self, t: &Table, launch: &Launch) -> Option<StopOrder> {
        let shares = self.inner.shares.get();
        let mode = shares.and_then(|s| s.config.mode);
        let want = hold_of(launch);
        let held = holding(t);
        let memory_of = |gpu: &str| shares.and_then(|s| s.memory.get(gpu).copied());
        let why = share::admit(mode, held.values().copied(), &want, memory_of).err()?;
        tracing::warn!("a start turned back: {why}");
        Some(StopOrder {
            grace: Duration::ZERO,
            why: Why::failed(why),
        })
    }

    /// Keeps what an admitted attempt holds, in the table and in its `gpus.json`.
    pub(super) fn keep_hold(&self, t: &mut Table, key: Key, launch: &Launch) {
        let hold = hold_of(launch);
        let file = HoldFile {
            gpus: hold.gpus.clone(),
            share: hold.share,
        };
        if let Err(e) = self.inner.store.write_hold(key, &file) {
            tracing::error!(
                job = key.0,
                attempt = key.1,
                "{e}; a restarted agent will not count this attempt's GPUs"
            );
        }
        t.holds.insert(key, hold);
    }

    /// One pass of the share watch (see the module's list), at once; the watch runs it
    /// every `watch_every`. Returns each share attempt's GPU memory in MiB.
    pub async fn watch_shares(&self, gpus: &dyn GpuSource) -> BTreeMap<Key, u64> {
        let Some(shares) = self.inner.shares.get() else {
            return BTreeMap::new();
        };
        let (shared_gpus, running) = {
            let t = self.table();
            let held = holding(&t);
            let shared: BTreeSet<String> = held
                .values()
                .filter(|h| h.share.is_some())
                .flat_map(|h| h.gpus.iter().cloned())
                .collect();
            let running: Vec<(Key, String, String)> = held
                .iter()
                .filter(|(_, h)| h.share.is_some())
                .filter_map(|(key, h)| {
                    let container = running_container(t.have.get(key)?)?;
                    Some((*key, container, h.gpus.first()?.clone()))
                })
                .collect();
            (shared, running)
        };
        if let Some(mps) = &shares.mps {
            for gpu in &shared_gpus {
                if let Err(e) = mps.ensure(gpu) {
                    tracing::error!(gpu = %gpu, "cannot make the MPS daemon's directories: {e}");
                }
            }
            mps.retain(&shared_gpus);
        }
        let mut sharers = Vec::new();
        for (key, container, gpu) in running {
            let pids = self.inner.runtime.pids(&container).await;
            sharers.push(Sharer {
                key,
                container,
                pids,
                gpu,
            });
        }
        let procs = match gpus.processes() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("cannot read the GPUs' processes for the shares' memory: {e}");
                return BTreeMap::new();
            }
        };
        let used = share::usage(&procs, &sharers);
        let over: Vec<(Key, String)> = {
            let mut t = self.table();
            t.used.clone_from(&used);
            if shares.config.mode != Some(ShareMode::Timeslice) {
                Vec::new()
            } else {
                used.iter()
                    .filter_map(|(key, mb)| {
                        let cap = t.holds.get(key)?.share?.memory_mb;
                        let stopping = t.want.get(key).is_some_and(|w| w.stop.is_some());
                        (*mb > cap && !stopping).then(|| (*key, share::over_memory(*mb, cap)))
                    })
                    .collect()
            }
        };
        for (key, text) in over {
            job_log(&self.inner.events, key, &format!("stopped: {text}"));
            self.stop_with(key, ENFORCE_GRACE, Why::failed(text));
        }
        used
    }
}

/// What the attempts on disk hold (their `gpus.json`), for a restarted agent.
pub(super) fn holds_on_disk(disk: &BTreeMap<Key, crate::store::OnDisk>) -> BTreeMap<Key, Hold> {
    disk.iter()
        .filter_map(|(key, d)| {
            let h = d.hold.clone()?;
            Some((
                *key,
                Hold {
                    gpus: h.gpus,
                    share: h.share,
                },
            ))
        })
        .collect()
}

/// What `launch` holds of the server's GPUs.
fn hold_of(launch: &Launch) -> Hold {
    Hold {
        gpus: launch.gpus.iter().map(|g| g.uuid.clone()).collect(),
        share: launch.spec.gpu_share,
    }
}

/// What the attempts that still hold their GPUs hold, by attempt.
fn holding(t: &Table) -> BTreeMap<Key, &Hold> {
    t.holds
        .iter()
        .filter(|(key, _)| match t.have.get(key) {
            Some(h) => !ended(h),
            // Not started yet: it holds them unless it will never start.
            None => t.want.get(key).is_some_and(|w| w.stop.is_none()),
        })
        .map(|(key, h)| (*key, h))
        .collect()
}

/// Its container has ended, or it never had one: it holds no GPU any more.
pub(super) fn ended(h: &ContainerObs) -> bool {
    h.result.is_some()
        || matches!(
            h.phase,
            Phase::Ended { .. }
                | Phase::Removed
                | Phase::Removing { .. }
                | Phase::Lost { .. }
                | Phase::NotCreated { .. }
        )
}

fn running_container(h: &ContainerObs) -> Option<String> {
    match &h.phase {
        Phase::Running { .. } | Phase::Found { running: true, .. } => {
            container_of(&h.phase).map(str::to_string)
        }
        _ => None,
    }
}

/// What a share attempt's container gets (`None` for a whole-GPU attempt): `share_env`,
/// and in `mps` mode its GPU's pipe directory, its daemon started first. `Err`: the
/// attempt cannot start, and why.
pub(super) fn mount<R: ContainerRuntime>(
    weak: &Weak<Inner<R>>,
    launch: &Launch,
) -> Result<Option<ShareMount>, String> {
    let Some(share) = launch.spec.gpu_share else {
        return Ok(None);
    };
    let exec = upgrade(weak).ok_or("the agent is stopping")?;
    let shares = exec.inner.shares.get();
    let mode = shares
        .and_then(|s| s.config.mode)
        .ok_or("this server takes no shares of a GPU")?;
    let mps_pipe = match shares.and_then(|s| s.mps.as_ref()) {
        Some(mps) => {
            let gpu = launch.gpus.first().ok_or("a share names no GPU")?;
            Some(mps.ensure(&gpu.uuid).map_err(|e| {
                format!(
                    "cannot make the MPS daemon's directories for GPU {}: {e}",
                    gpu.uuid
                )
            })?)
        }
        None => None,
    };
    Ok(Some(ShareMount {
        env: commons_proto::share_env(&share, mode),
        mps_pipe,
    }))
}

/// Runs the share watch every `every` while the executor lives.
async fn watch_loop<R: ContainerRuntime>(
    weak: Weak<Inner<R>>,
    gpus: Arc<dyn GpuSource>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(exec) = upgrade(&weak) else { break };
        exec.watch_shares(&*gpus).await;
    }
}
