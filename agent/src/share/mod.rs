//! Shares of one GPU between attempts (issue 32): how this agent is configured to enforce
//! them ([`ShareConfig`]), the bookkeeping that admits or refuses a `Start` ([`admit`]),
//! the sum of each share attempt's GPU memory from the GPU's processes ([`usage`]), and the
//! words of a stop for using too much ([`over_memory`]). All pure; the executor
//! (`executor/shares.rs`) does the I/O and [`mps`] supervises MPS control daemons.
//!
//! Invariants [`admit`] keeps, over every attempt that still holds its GPUs:
//! - an agent without a share mode takes no share; a share names exactly one GPU;
//! - a GPU carries either one whole attempt or shares, never both;
//! - the shares of one GPU sum to at most 1000 milli-GPU of compute and at most the GPU's
//!   memory.

pub mod mps;

use commons_proto::{GpuShare, ShareMode};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The MPS control daemon's command unless `--mps-control` says otherwise: in the
/// foreground, so that the agent sees it end and starts it again.
pub const DEFAULT_MPS_CONTROL: &str = "nvidia-cuda-mps-control -f";
/// How often each share attempt's GPU memory is read unless told otherwise.
pub const DEFAULT_WATCH_EVERY: Duration = Duration::from_secs(5);

/// How this agent takes shares of its GPUs (`--share-mode`, `--mps-control`,
/// `--share-watch-ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareConfig {
    /// `None`: the agent takes no shares (a `Start` with one fails, saying why).
    pub mode: Option<ShareMode>,
    /// The MPS control daemon's program and arguments (`mps` mode), run once per shared
    /// GPU with `CUDA_VISIBLE_DEVICES`, `CUDA_MPS_PIPE_DIRECTORY` and
    /// `CUDA_MPS_LOG_DIRECTORY` set; it must stay in the foreground.
    pub mps_control: Vec<String>,
    /// How often share attempts' GPU memory is read (and, in `timeslice` mode, enforced).
    pub watch_every: Duration,
    /// Where the MPS daemons' pipe and log directories go, one per GPU; `None`: under the
    /// state dir (`<state-dir>/mps/<gpu uuid>/`).
    pub mps_dir: Option<PathBuf>,
}

impl Default for ShareConfig {
    fn default() -> Self {
        Self {
            mode: None,
            mps_control: DEFAULT_MPS_CONTROL
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            watch_every: DEFAULT_WATCH_EVERY,
            mps_dir: None,
        }
    }
}

/// Parses `--share-mode`: `mps`, `timeslice` or `none`.
pub fn parse_mode(s: &str) -> Result<Option<ShareMode>, String> {
    match s {
        "none" | "off" => Ok(None),
        "mps" => Ok(Some(ShareMode::Mps)),
        "timeslice" => Ok(Some(ShareMode::Timeslice)),
        other => Err(format!(
            "--share-mode: expected mps, timeslice or none, got {other:?}"
        )),
    }
}

/// What an attempt holds of this server's GPUs while it has not ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// UUIDs of its GPUs.
    pub gpus: Vec<String>,
    /// Its share of its one GPU; `None`: it holds its GPUs whole.
    pub share: Option<GpuShare>,
}

/// Whether an attempt that asks for `want` may start beside the attempts that hold
/// `held`; `Err` says why not, in words for the job's owner. `memory_of` gives a GPU's
/// memory in MiB (`None`: unknown here, and then only compute is checked).
pub fn admit<'a>(
    mode: Option<ShareMode>,
    held: impl IntoIterator<Item = &'a Hold>,
    want: &Hold,
    memory_of: impl Fn(&str) -> Option<u64>,
) -> Result<(), String> {
    let held: Vec<&Hold> = held.into_iter().collect();
    let Some(share) = want.share else {
        for gpu in &want.gpus {
            let shares = held
                .iter()
                .filter(|h| h.share.is_some() && h.gpus.contains(gpu))
                .count();
            if shares > 0 {
                return Err(format!(
                    "not started: GPU {gpu} carries {shares} share(s) of other jobs, so it \
                     cannot be given whole"
                ));
            }
        }
        return Ok(());
    };
    if mode.is_none() {
        return Err(
            "not started: this server takes no shares of a GPU (its agent runs \
                    without --share-mode)"
                .into(),
        );
    }
    let [gpu] = want.gpus.as_slice() else {
        return Err(format!(
            "not started: a share names exactly one GPU, this one names {}",
            want.gpus.len()
        ));
    };
    if share.milli == 0 || share.milli > 1000 || share.memory_mb == 0 {
        return Err(format!(
            "not started: a share needs 1 to 1000 thousandths of a GPU and some memory, \
             this one has {} and {} MiB",
            share.milli, share.memory_mb
        ));
    }
    let on_gpu: Vec<&&Hold> = held.iter().filter(|h| h.gpus.contains(gpu)).collect();
    if on_gpu.iter().any(|h| h.share.is_none()) {
        return Err(format!(
            "not started: GPU {gpu} is held whole by another job"
        ));
    }
    let milli: u32 = on_gpu.iter().filter_map(|h| h.share).map(|s| s.milli).sum();
    if milli + share.milli > 1000 {
        return Err(format!(
            "not started: GPU {gpu} has {} of its compute free, this share needs {}",
            fraction(1000u32.saturating_sub(milli)),
            fraction(share.milli)
        ));
    }
    if let Some(total) = memory_of(gpu) {
        let memory: u64 = on_gpu
            .iter()
            .filter_map(|h| h.share)
            .map(|s| s.memory_mb)
            .sum();
        if memory + share.memory_mb > total {
            return Err(format!(
                "not started: GPU {gpu} has {} of its memory free, this share needs {}",
                gb(total.saturating_sub(memory)),
                gb(share.memory_mb)
            ));
        }
    }
    Ok(())
}

fn fraction(milli: u32) -> String {
    GpuShare {
        milli,
        memory_mb: 1,
    }
    .fraction()
}

/// MiB as people read GPU memory: whole GB from 10 GB up (rounded to the nearest), one
/// decimal below (`1.5 GB`), and no decimal when it is whole.
pub fn gb(mib: u64) -> String {
    gb_with(mib, mib < 10 * 1024)
}

fn gb_with(mib: u64, decimal: bool) -> String {
    if mib.is_multiple_of(1024) {
        return format!("{} GB", mib / 1024);
    }
    if decimal {
        let tenths = (mib * 10 + 512) / 1024;
        if tenths.is_multiple_of(10) {
            return format!("{} GB", tenths / 10);
        }
        return format!("{}.{} GB", tenths / 10, tenths % 10);
    }
    format!("{} GB", (mib + 512) / 1024)
}

/// The words of a stop for using more GPU memory than the share holds: "used 23 GB of
/// its 20 GB GPU memory". When the two figures would read the same, they get a decimal
/// (and, should that not tell them apart either, are given in MiB).
pub fn over_memory(used_mb: u64, cap_mb: u64) -> String {
    let (mut used, mut cap) = (gb(used_mb), gb(cap_mb));
    if used == cap {
        (used, cap) = (gb_with(used_mb, true), gb_with(cap_mb, true));
    }
    if used == cap {
        (used, cap) = (format!("{used_mb} MiB"), format!("{cap_mb} MiB"));
    }
    format!("used {used} of its {cap} GPU memory")
}

/// A process on a GPU, as the GPU source lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// The GPU's (or MIG instance's) UUID.
    pub gpu: String,
    /// Host pid.
    pub pid: u32,
    /// GPU memory it holds, in MiB.
    pub used_memory_mb: u64,
    /// Its `/proc/PID/cgroup`, read right after it was listed; `None`: it had ended.
    pub cgroup: Option<String>,
}

/// A share attempt as [`usage`] needs it: its container's full id, the host pids the
/// runtime lists in it, and its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharer<K> {
    pub key: K,
    pub container: String,
    pub pids: std::collections::BTreeSet<u32>,
    pub gpu: String,
}

/// Each share attempt's GPU memory in MiB: the sum over the processes on its GPU that
/// sit in its container (by the container id in their cgroup, or, failing that, by the
/// pids the runtime lists in it). Every sharer is in the result, with 0 when it has no
/// process on the GPU.
pub fn usage<K: Ord + Clone>(procs: &[GpuProcess], sharers: &[Sharer<K>]) -> BTreeMap<K, u64> {
    let mut out: BTreeMap<K, u64> = sharers.iter().map(|s| (s.key.clone(), 0)).collect();
    for p in procs {
        let container = p
            .cgroup
            .as_deref()
            .and_then(crate::gpu::cgroup::container_id);
        let owner = sharers.iter().find(|s| {
            s.gpu == p.gpu
                && (container.as_deref() == Some(s.container.as_str()) || s.pids.contains(&p.pid))
        });
        if let Some(s) = owner {
            *out.entry(s.key.clone()).or_default() += p.used_memory_mb;
        }
    }
    out
}

#[cfg(test)]
mod tests;
