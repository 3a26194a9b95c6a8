//! Shares of one GPU between attempts (issue 32): how an agent enforces them, what an
//! attempt holds, and the variables its processes get.
//!
//! An agent that enforces shares says how in `Hello.share_mode`; the portal places shares
//! only on such servers (and only where the lab's lending rule turns sharing on), and a
//! share attempt's `Start` carries [`GpuShare`] in `JobSpec::gpu_share`. An agent without a
//! share mode never gets one.
//!
//! Invariants: a share holds `1..=999` milli-GPU of compute and a positive amount of GPU
//! memory; the agent gives every process of the attempt (its command, `exec`, SSH
//! sessions) the same [`share_env`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How an agent enforces shares of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareMode {
    /// NVIDIA MPS: one control daemon per shared GPU, supervised by the agent; each
    /// attempt's compute and memory are capped by MPS itself.
    Mps,
    /// Time slicing: no compute limit; the agent watches each attempt's GPU memory (per
    /// process, through NVML) and stops one that uses more than its share.
    Timeslice,
}

impl ShareMode {
    /// The mode's name on the command line and in the portal (`mps`, `timeslice`).
    pub fn name(self) -> &'static str {
        match self {
            ShareMode::Mps => "mps",
            ShareMode::Timeslice => "timeslice",
        }
    }
}

/// The share of one GPU an attempt holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuShare {
    /// Compute, in thousandths of the GPU (250: a quarter).
    pub milli: u32,
    /// GPU memory, in MiB.
    pub memory_mb: u64,
}

/// The variable holding an attempt's GPU memory cap in MiB (both modes).
pub const GPU_MEMORY_LIMIT_ENV: &str = "COMMONS_GPU_MEMORY_LIMIT_MB";
/// The variable holding an attempt's compute share as a fraction (`0.25`; both modes).
pub const GPU_FRACTION_ENV: &str = "COMMONS_GPU_FRACTION";
/// Where the MPS control daemon's pipes are mounted in a container (`mps` mode).
pub const MPS_PIPE_DIR: &str = "/run/commons-mps";

impl GpuShare {
    /// The compute share as MPS takes it: a whole percentage, rounded up, at least 1.
    pub fn thread_percentage(&self) -> u32 {
        self.milli.div_ceil(10).clamp(1, 100)
    }

    /// The compute share as a fraction of the GPU, as users wrote it (`0.25`).
    pub fn fraction(&self) -> String {
        let s = format!("{:.3}", f64::from(self.milli) / 1000.0);
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The variables every process of an attempt holding `share` gets under `mode` (the
/// GPU is the container's device 0).
pub fn share_env(share: &GpuShare, mode: ShareMode) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(GPU_MEMORY_LIMIT_ENV.into(), share.memory_mb.to_string());
    env.insert(GPU_FRACTION_ENV.into(), share.fraction());
    if mode == ShareMode::Mps {
        env.insert("CUDA_MPS_PIPE_DIRECTORY".into(), MPS_PIPE_DIR.into());
        env.insert(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
            share.thread_percentage().to_string(),
        );
        env.insert(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
            format!("0={}M", share.memory_mb),
        );
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_with_ten_gigabytes_becomes_these_variables() {
        let share = GpuShare {
            milli: 250,
            memory_mb: 10 * 1024,
        };
        let mps = share_env(&share, ShareMode::Mps);
        assert_eq!(mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=10240M");
        assert_eq!(mps["CUDA_MPS_PIPE_DIRECTORY"], MPS_PIPE_DIR);
        assert_eq!(mps[GPU_FRACTION_ENV], "0.25");
        assert_eq!(mps[GPU_MEMORY_LIMIT_ENV], "10240");
        let slice = share_env(&share, ShareMode::Timeslice);
        assert!(!slice.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        assert_eq!(slice[GPU_MEMORY_LIMIT_ENV], "10240");
    }

    #[test]
    fn thread_percentages_round_up_and_stay_in_range() {
        let p = |milli| {
            GpuShare {
                milli,
                memory_mb: 1,
            }
            .thread_percentage()
        };
        assert_eq!((p(50), p(55), p(999), p(1), p(0)), (5, 6, 100, 1, 1));
        let f = |milli| {
            GpuShare {
                milli,
                memory_mb: 1,
            }
            .fraction()
        };
        assert_eq!(
            (f(500), f(50), f(1000)),
            ("0.5".to_string(), "0.05".to_string(), "1".to_string())
        );
    }

    #[test]
    fn modes_travel_by_name() {
        assert_eq!(
            serde_json::to_string(&ShareMode::Timeslice).unwrap(),
            "\"timeslice\""
        );
        assert_eq!(ShareMode::Mps.name(), "mps");
    }
}
