//! Where the agent's GPUs come from.
//!
//! [`GpuSource`] has two implementations: [`nvml::NvmlGpus`] on servers with an NVIDIA
//! driver and [`fake::FakeGpus`], a list from `--gpus fake:...` whose local use and
//! utilisation `commons-agent fake` can change at run time. Tests and demos use the fake
//! one; the rest of the agent cannot tell them apart, except that fake GPUs get no NVIDIA
//! device request (there is no NVIDIA runtime to honour one).

pub mod cgroup;
pub mod fake;
pub mod nvml;
pub mod reading;
#[cfg(test)]
mod reading_tests;

use commons_proto::{GpuInfo, GpuStat};
use std::collections::BTreeSet;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    #[error("NVML is not available ({0}); is the NVIDIA driver installed? For a machine without GPUs use --gpus fake:1xA100-80GB")]
    NoNvml(String),
    #[error("NVML call failed: {0}")]
    Nvml(String),
}

pub trait GpuSource: Send + Sync {
    /// The GPUs (and MIG instances) this server has, in index order.
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Live numbers. A GPU process in none of `ours` is the owner using the GPU directly.
    fn stats(&self, ours: &Ours) -> Result<Vec<GpuStat>, GpuError>;
    /// Every compute process on the GPUs (a MIG instance's under the instance's UUID),
    /// with the GPU memory it holds and its `/proc/PID/cgroup`: what share attempts'
    /// memory is summed from (`share::usage`). A source that cannot list processes lists
    /// none.
    fn processes(&self) -> Result<Vec<crate::share::GpuProcess>, GpuError> {
        Ok(Vec::new())
    }
}

/// What the agent runs: a GPU process in none of these is the owner's local use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ours {
    /// Full ids of the agent's containers (as a process's cgroup names them).
    pub containers: BTreeSet<String>,
    /// Host PIDs the container runtime lists inside them (processes that a cgroup
    /// reading would miss, e.g. on a runtime whose cgroup layout is not recognised).
    pub pids: BTreeSet<u32>,
    /// UUIDs of the GPUs our running containers hold (what a fake GPU counts as busy).
    pub gpus: BTreeSet<String>,
}

/// Builds the source that `--gpus` asks for; fake GPUs that our containers hold report
/// `fake_busy_util` percent busy (`--fake-busy-util`).
pub fn from_mode(
    mode: &crate::GpuMode,
    state_dir: &std::path::Path,
    fake_busy_util: u32,
) -> Result<Box<dyn GpuSource>, GpuError> {
    match mode {
        crate::GpuMode::Auto | crate::GpuMode::Nvml => Ok(Box::new(nvml::NvmlGpus::init()?)),
        crate::GpuMode::Fake(models) => Ok(Box::new(
            fake::FakeGpus::new(models.clone(), state_dir.to_path_buf()).busy_at(fake_busy_util),
        )),
    }
}
