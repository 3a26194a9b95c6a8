//! Shares of one GPU: a request for a fraction of a GPU's compute (in milli-GPU) and/or
//! of its memory, next to requests for whole GPUs, and where to place them.
//!
//! This module is the pure model; [`place`] picks a node and GPUs for one request under
//! a [`SharePolicy`], and [`ShareNode::take`] books it. The simulator replays the
//! Alibaba GPU-sharing trace through exactly these functions.
//!
//! Invariants kept (and property-tested):
//! - a GPU's compute share (0..=[`FULL_MILLI`]) and memory are never over-allocated:
//!   [`ShareNode::take`] refuses what does not fit and changes nothing then;
//! - a whole-GPU request only lands on a GPU with nothing on it (all of its share and
//!   memory free), and a share never lands on a GPU held whole;
//! - the node's CPU and memory are never over-allocated either;
//! - placement is deterministic: nodes and GPUs are compared in index order on ties.

mod frag;
mod place;
mod reserve;
#[cfg(test)]
mod tests;

pub use frag::{node_fragment, FragmentRule, ShapeMix};
pub use place::{place, Placement, SharePolicy, ShareTuning};

use serde::{Deserialize, Serialize};

/// A whole GPU in milli-GPU.
pub const FULL_MILLI: u32 = 1000;
/// The step of a requested fraction (0.05 of a GPU).
pub const STEP_MILLI: u32 = 50;

/// Why a request for a share is not valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShareError {
    /// `gpu_fraction` outside 0.05..=1.0.
    #[error("gpu_fraction must be between 0.05 and 1.0, not {0}")]
    FractionRange(f64),
    /// `gpu_fraction` not a multiple of 0.05.
    #[error("gpu_fraction must be a multiple of 0.05, not {0}")]
    FractionStep(f64),
    /// `gpu_memory_gb` not positive or not finite.
    #[error("gpu_memory_gb must be a positive number of GB, not {0}")]
    Memory(f64),
    /// A booking that does not fit the node (the caller's bug: place first).
    #[error("the request does not fit GPU {gpu} of the node")]
    DoesNotFit {
        /// Index of the GPU in the node.
        gpu: usize,
    },
}

/// One GPU as the share model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareGpu {
    /// GPU model, matched against a request's models.
    pub model: String,
    /// Memory of the GPU in MiB.
    pub memory_mb: u64,
    /// Compute share not yet given out, 0..=[`FULL_MILLI`].
    pub free_milli: u32,
    /// Memory not yet given out, in MiB.
    pub free_memory_mb: u64,
}

impl ShareGpu {
    /// A GPU with nothing on it.
    pub fn new(model: impl Into<String>, memory_mb: u64) -> ShareGpu {
        ShareGpu {
            model: model.into(),
            memory_mb,
            free_milli: FULL_MILLI,
            free_memory_mb: memory_mb,
        }
    }

    /// Nothing is on this GPU: a whole-GPU request may take it.
    pub fn is_empty(&self) -> bool {
        self.free_milli == FULL_MILLI && self.free_memory_mb == self.memory_mb
    }

    /// The share and memory `ask` would take on this GPU, if it fits now.
    pub fn fits(&self, ask: &GpuAsk) -> Option<(u32, u64)> {
        let (milli, memory) = ask.amounts_on(self)?;
        (milli <= self.free_milli && memory <= self.free_memory_mb && milli > 0)
            .then_some((milli, memory))
    }
}

/// A server as the share model sees it: CPU, memory and its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareNode {
    /// Host name, for reasons and reports.
    pub name: String,
    /// CPU not yet given out, in milli-CPU.
    pub free_cpu_milli: u64,
    /// Memory not yet given out, in MiB.
    pub free_memory_mib: u64,
    /// The GPUs, in index order.
    pub gpus: Vec<ShareGpu>,
}

impl ShareNode {
    /// Free compute share of all GPUs together, in milli-GPU.
    pub fn free_gpu_milli(&self) -> u64 {
        self.gpus.iter().map(|g| u64::from(g.free_milli)).sum()
    }

    /// GPUs with nothing on them.
    pub fn empty_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.is_empty()).count()
    }

    /// Whether the node's CPU, memory and GPU models suit `req` (not yet its GPUs).
    pub fn hosts(&self, req: &ShareRequest) -> bool {
        req.cpu_milli <= self.free_cpu_milli
            && req.memory_mib <= self.free_memory_mib
            && (req.models.is_empty()
                || matches!(req.gpu, GpuAsk::None)
                || self.gpus.iter().any(|g| req.models.contains(&g.model)))
    }

    /// Books `req` on the GPUs of `placement` (`(gpu, milli, memory)` as
    /// [`place`] returns them). Checks everything first and changes nothing when any
    /// part does not fit.
    pub fn take(
        &mut self,
        req: &ShareRequest,
        gpus: &[(usize, u32, u64)],
    ) -> Result<(), ShareError> {
        if !self.hosts(req) {
            return Err(ShareError::DoesNotFit { gpu: usize::MAX });
        }
        let mut seen = Vec::new();
        for &(i, milli, memory) in gpus {
            let gpu = self.gpus.get(i).ok_or(ShareError::DoesNotFit { gpu: i })?;
            let ok = match req.gpu {
                GpuAsk::None => false,
                GpuAsk::Whole { .. } => {
                    gpu.is_empty() && (milli, memory) == (FULL_MILLI, gpu.memory_mb)
                }
                GpuAsk::Share { .. } => gpu.fits(&req.gpu) == Some((milli, memory)),
            };
            if !ok || seen.contains(&i) || !req.model_ok(gpu) {
                return Err(ShareError::DoesNotFit { gpu: i });
            }
            seen.push(i);
        }
        if seen.len() != req.gpu.gpu_count() as usize {
            return Err(ShareError::DoesNotFit { gpu: usize::MAX });
        }
        self.free_cpu_milli -= req.cpu_milli;
        self.free_memory_mib -= req.memory_mib;
        for &(i, milli, memory) in gpus {
            self.gpus[i].free_milli -= milli;
            self.gpus[i].free_memory_mb -= memory;
        }
        Ok(())
    }

    /// Gives back what [`ShareNode::take`] booked (a job that ended).
    pub fn release(&mut self, req: &ShareRequest, gpus: &[(usize, u32, u64)]) {
        self.free_cpu_milli += req.cpu_milli;
        self.free_memory_mib += req.memory_mib;
        for &(i, milli, memory) in gpus {
            if let Some(g) = self.gpus.get_mut(i) {
                g.free_milli = (g.free_milli + milli).min(FULL_MILLI);
                g.free_memory_mb = (g.free_memory_mb + memory).min(g.memory_mb);
            }
        }
    }
}

/// What a request asks of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuAsk {
    /// No GPU (a CPU-only task).
    None,
    /// A share of one GPU: `milli` of its compute (0: as much as its memory is of the
    /// GPU's, rounded up to [`STEP_MILLI`]) and `memory_mb` of its memory (0: as much as
    /// its compute share is of the GPU's).
    Share {
        /// Compute share in milli-GPU, below [`FULL_MILLI`].
        milli: u32,
        /// GPU memory in MiB.
        memory_mb: u64,
    },
    /// Whole GPUs, each with nothing else on it.
    Whole {
        /// How many.
        count: u32,
    },
}

impl GpuAsk {
    /// A share from the job fields `gpu_fraction` and `gpu_memory_gb` (with `gpus: 1`):
    /// a fraction of 0.05 to 1.0 in steps of 0.05, a positive memory, or both; a whole
    /// fraction without memory is one whole GPU; neither asks for no GPU.
    pub fn from_fields(
        fraction: Option<f64>,
        memory_gb: Option<f64>,
    ) -> Result<GpuAsk, ShareError> {
        let milli = match fraction {
            None => 0,
            Some(f) if !(0.05 - 1e-9..=1.0 + 1e-9).contains(&f) || !f.is_finite() => {
                return Err(ShareError::FractionRange(f))
            }
            Some(f) => {
                let steps = f * f64::from(FULL_MILLI / STEP_MILLI);
                if (steps - steps.round()).abs() > 1e-6 {
                    return Err(ShareError::FractionStep(f));
                }
                steps.round() as u32 * STEP_MILLI
            }
        };
        let memory_mb = match memory_gb {
            None => 0,
            Some(g) if !(g.is_finite() && g > 0.0) => return Err(ShareError::Memory(g)),
            Some(g) => (g * 1024.0).ceil() as u64,
        };
        Ok(match (milli, memory_mb) {
            (0, 0) => GpuAsk::None,
            (FULL_MILLI, 0) => GpuAsk::Whole { count: 1 },
            _ => GpuAsk::Share { milli, memory_mb },
        })
    }

    /// GPUs the request touches.
    pub fn gpu_count(&self) -> u32 {
        match *self {
            GpuAsk::None => 0,
            GpuAsk::Share { .. } => 1,
            GpuAsk::Whole { count } => count,
        }
    }

    /// GPU demand in milli-GPU as the trace counts it (a memory-only share, whose
    /// compute share depends on the GPU it lands on, counts 0).
    pub fn demand_milli(&self) -> u64 {
        match *self {
            GpuAsk::None => 0,
            GpuAsk::Share { milli, .. } => u64::from(milli),
            GpuAsk::Whole { count } => u64::from(count) * u64::from(FULL_MILLI),
        }
    }

    /// The compute share and memory this ask takes on `gpu` (for a share; whole GPUs
    /// take all of it), or `None` when it can never fit there.
    fn amounts_on(&self, gpu: &ShareGpu) -> Option<(u32, u64)> {
        match *self {
            GpuAsk::None => None,
            GpuAsk::Whole { .. } => Some((FULL_MILLI, gpu.memory_mb)),
            GpuAsk::Share { milli, memory_mb } => {
                if gpu.memory_mb == 0 || memory_mb > gpu.memory_mb {
                    return None;
                }
                let milli = if milli > 0 {
                    milli
                } else {
                    let m = (memory_mb * u64::from(FULL_MILLI)).div_ceil(gpu.memory_mb);
                    let m = m.div_ceil(u64::from(STEP_MILLI)) * u64::from(STEP_MILLI);
                    u32::try_from(m).ok()?.min(FULL_MILLI)
                };
                let memory = if memory_mb > 0 {
                    memory_mb
                } else {
                    u64::from(milli) * gpu.memory_mb / u64::from(FULL_MILLI)
                };
                Some((milli, memory))
            }
        }
    }
}

/// What one task or job asks for, as share placement compares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShareRequest {
    /// CPU in milli-CPU.
    pub cpu_milli: u64,
    /// Host memory in MiB.
    pub memory_mib: u64,
    /// GPUs or a share of one.
    pub gpu: GpuAsk,
    /// Acceptable GPU models; empty means any.
    pub models: Vec<String>,
}

impl ShareRequest {
    fn model_ok(&self, gpu: &ShareGpu) -> bool {
        self.models.is_empty() || self.models.contains(&gpu.model)
    }
}

/// "waiting for 0.5 of a GPU with 20 GB free": why a share waits, in a researcher's
/// words (whole GPUs and CPU-only requests get a plain wording too).
pub fn waiting_reason(ask: &GpuAsk) -> String {
    match *ask {
        GpuAsk::None => "waiting for CPU and memory on a server".into(),
        GpuAsk::Whole { count: 1 } => "waiting for a whole free GPU".into(),
        GpuAsk::Whole { count } => format!("waiting for {count} whole free GPUs on one server"),
        GpuAsk::Share { milli, memory_mb } => {
            let share = if milli > 0 {
                let s = format!("{:.2}", f64::from(milli) / f64::from(FULL_MILLI));
                let s = s.trim_end_matches('0').trim_end_matches('.').to_string();
                format!("{s} of a GPU")
            } else {
                "a share of a GPU".into()
            };
            if memory_mb > 0 {
                format!(
                    "waiting for {share} with {} GB free",
                    memory_mb.div_ceil(1024)
                )
            } else {
                format!("waiting for {share}")
            }
        }
    }
}
