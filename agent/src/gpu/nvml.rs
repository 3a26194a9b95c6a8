//! GPUs from the NVIDIA driver through NVML (loaded at run time: a machine without the
//! driver gets a clear error, never a panic).
//!
//! With MIG enabled on a GPU, its MIG instances are reported as GPUs of their own size and
//! the parent is not lendable by itself.

use super::{GpuError, GpuSource};
use commons_proto::{GpuInfo, GpuStat};
use nvml_wrapper::{enum_wrappers::device::Brand, Device, Nvml};
use std::collections::BTreeSet;

pub struct NvmlGpus {
    nvml: Nvml,
}

/// MIG instances a GPU can hold at most (A100/H100/H200: 7).
const MAX_MIG: u32 = 7;

impl NvmlGpus {
    pub fn init() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| GpuError::NoNvml(e.to_string()))?;
        Ok(Self { nvml })
    }

    /// The lendable devices: each GPU, or its MIG instances when MIG is on.
    fn devices(&self) -> Result<Vec<(u32, Device<'_>)>, GpuError> {
        let count = self.nvml.device_count().map_err(nvml_err)?;
        let mut out = Vec::new();
        for i in 0..count {
            let dev = self.nvml.device_by_index(i).map_err(nvml_err)?;
            let mig_on = dev.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            if mig_on {
                for m in 0..MAX_MIG {
                    if let Ok(mig) = dev.mig_device_by_index(m) {
                        out.push((i, mig));
                    }
                }
            } else {
                out.push((i, dev));
            }
        }
        Ok(out)
    }
}

fn nvml_err(e: nvml_wrapper::error::NvmlError) -> GpuError {
    GpuError::Nvml(e.to_string())
}

/// "NVIDIA H200" with 141 GB -> "H200-141GB": the model names users ask for.
fn model_name(name: &str, memory_mb: u64, _brand: Option<Brand>) -> String {
    let short = name
        .trim_start_matches("NVIDIA ")
        .trim_start_matches("GeForce ")
        .replace(' ', "-");
    let gb = (memory_mb + 512) / 1024;
    if short.ends_with("GB") {
        short
    } else {
        format!("{short}-{gb}GB")
    }
}

impl GpuSource for NvmlGpus {
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let mut out = Vec::new();
        for (n, (_parent, dev)) in self.devices()?.into_iter().enumerate() {
            let memory_mb = dev.memory_info().map_err(nvml_err)?.total / (1024 * 1024);
            let name = dev.name().map_err(nvml_err)?;
            out.push(GpuInfo {
                uuid: dev.uuid().map_err(nvml_err)?,
                index: n as u32,
                model: model_name(&name, memory_mb, dev.brand().ok()),
                memory_mb,
                fake: false,
            });
        }
        Ok(out)
    }

    fn stats(&self, our_pids: &BTreeSet<u32>) -> Result<Vec<GpuStat>, GpuError> {
        let mut out = Vec::new();
        for (_parent, dev) in self.devices()? {
            let mem = dev.memory_info().map_err(nvml_err)?;
            let mut pids: Vec<u32> = Vec::new();
            for list in [
                dev.running_compute_processes(),
                dev.running_graphics_processes(),
            ] {
                pids.extend(list.unwrap_or_default().into_iter().map(|p| p.pid));
            }
            out.push(GpuStat {
                uuid: dev.uuid().map_err(nvml_err)?,
                // MIG instances report no utilisation; that is not an error.
                utilization_pct: dev.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                memory_used_mb: mem.used / (1024 * 1024),
                local_use: pids.iter().any(|p| !our_pids.contains(p)),
                fault: None,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_short() {
        assert_eq!(model_name("NVIDIA H200", 143771, None), "H200-140GB");
        assert_eq!(
            model_name("NVIDIA A100-SXM4-80GB", 81920, None),
            "A100-SXM4-80GB"
        );
        assert_eq!(
            model_name("NVIDIA GeForce RTX 4090", 24564, None),
            "RTX-4090-24GB"
        );
    }

    #[test]
    fn init_without_driver_is_an_error_not_a_panic() {
        // On machines with a driver this succeeds; either way it must not panic.
        let _ = NvmlGpus::init();
    }
}
