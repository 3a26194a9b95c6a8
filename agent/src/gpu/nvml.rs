//! GPUs from the NVIDIA driver through NVML (loaded at run time: a machine without the
//! driver gets a clear error, never a panic).
//!
//! This module only reads: [`NvmlGpus::read`] fills an [`NvmlReading`] with what NVML and
//! `/proc` say, and [`reading::map`] (pure, tested over recorded readings) decides the
//! rest: MIG instances as GPUs of their own size, whose each process is, which faults
//! withdraw a GPU.
//!
//! Invariants:
//! - A GPU that answers "GPU is lost" keeps the UUID (and MIG instances) it had at its last
//!   good reading, so the portal can tell which GPU fell off the bus.
//! - Critical Xid events are collected from an NVML event set at every reading and stay
//!   with their GPU for the agent's lifetime: such a GPU needs a reset (and then an agent
//!   restart) before it is lent again.

use super::reading::{self, DeviceReading, MigReading, NvmlReading, ProcessReading};
use super::{GpuError, GpuSource, Ours};
use commons_proto::{GpuInfo, GpuStat};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};
use std::collections::BTreeMap;
use std::sync::Mutex;

pub struct NvmlGpus {
    /// NVML lives as long as the process (the event set borrows it).
    nvml: &'static Nvml,
    /// Critical Xid events; `None` where the driver offers none (then no Xid is seen).
    events: Option<Mutex<EventSet<'static>>>,
    /// Xids seen so far, by GPU UUID.
    xids: Mutex<BTreeMap<String, Vec<u64>>>,
    /// Each device's last good reading, by NVML index.
    last: Mutex<BTreeMap<u32, DeviceReading>>,
}

/// MIG instances a GPU can hold at most (A100/H100/H200: 7).
const MAX_MIG: u32 = 7;
/// Xid events taken from the event set in one reading, at most.
const MAX_EVENTS: usize = 256;
const MIB: u64 = 1024 * 1024;

impl NvmlGpus {
    pub fn init() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| GpuError::NoNvml(e.to_string()))?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let events = register_xid_events(nvml).map(Mutex::new);
        Ok(Self {
            nvml,
            events,
            xids: Mutex::new(BTreeMap::new()),
            last: Mutex::new(BTreeMap::new()),
        })
    }

    /// Everything NVML (and `/proc`) says now.
    pub fn read(&self) -> Result<NvmlReading, GpuError> {
        self.take_events();
        let count = self.nvml.device_count().map_err(nvml_err)?;
        let xids = lock(&self.xids).clone();
        let mut last = lock(&self.last);
        let mut reading = NvmlReading::default();
        for i in 0..count {
            let dev = match self
                .nvml
                .device_by_index(i)
                .and_then(|d| read_device(i, &d))
            {
                Ok(d) => {
                    last.insert(i, d.clone());
                    d
                }
                Err(NvmlError::GpuLost) => {
                    let mut d = last.get(&i).cloned().unwrap_or_else(|| DeviceReading {
                        index: i,
                        uuid: format!("GPU-lost-index-{i}"),
                        name: "unknown GPU".into(),
                        ..DeviceReading::default()
                    });
                    d.lost = true;
                    d.processes.clear();
                    for m in &mut d.mig {
                        m.processes.clear();
                    }
                    d
                }
                Err(e) => return Err(nvml_err(e)),
            };
            reading.devices.push(dev);
        }
        drop(last);
        for d in &mut reading.devices {
            d.xids = xids.get(&d.uuid).cloned().unwrap_or_default();
        }
        let pids = reading.devices.iter().flat_map(|d| {
            d.processes
                .iter()
                .chain(d.mig.iter().flat_map(|m| m.processes.iter()))
                .map(|p| p.pid)
        });
        for pid in pids.collect::<Vec<_>>() {
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                reading.cgroups.insert(pid, text);
            }
        }
        Ok(reading)
    }

    /// Moves the Xid events that arrived since the last reading into `xids`.
    fn take_events(&self) {
        let Some(set) = &self.events else { return };
        let set = lock(set);
        let mut xids = lock(&self.xids);
        for _ in 0..MAX_EVENTS {
            match set.wait(0) {
                Ok(ev) => {
                    let xid = match ev.event_data {
                        Some(XidError::Value(x)) => x,
                        _ => continue,
                    };
                    let uuid = ev.device.uuid().unwrap_or_default();
                    tracing::error!(gpu = %uuid, xid, "critical Xid error on a GPU");
                    let seen = xids.entry(uuid).or_default();
                    if !seen.contains(&xid) {
                        seen.push(xid);
                    }
                }
                // Nothing more (Timeout), or a GPU lost (its other readings say so).
                Err(_) => return,
            }
        }
    }
}

/// An event set for critical Xid errors on every GPU that supports them.
fn register_xid_events(nvml: &'static Nvml) -> Option<EventSet<'static>> {
    let count = nvml.device_count().ok()?;
    let mut set = nvml.create_event_set().ok();
    let mut registered = 0;
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let Some(s) = set.take().or_else(|| nvml.create_event_set().ok()) else {
            break;
        };
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
            Ok(s) => {
                registered += 1;
                set = Some(s);
            }
            // The set was released; the next device starts a fresh one.
            Err(e) => tracing::warn!(gpu = i, "no Xid events from this GPU: {e}"),
        }
    }
    if registered == 0 {
        return None;
    }
    set
}

fn read_device(index: u32, dev: &Device<'_>) -> Result<DeviceReading, NvmlError> {
    let mem = dev.memory_info()?;
    let mig_enabled = match dev.mig_mode() {
        Ok(m) => m.current == 1,
        Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost),
        // Not supported: a GPU without MIG.
        Err(_) => false,
    };
    let mut mig = Vec::new();
    if mig_enabled {
        let max = dev.mig_device_count().unwrap_or(MAX_MIG);
        for m in 0..max {
            match dev.mig_device_by_index(m) {
                Ok(md) => {
                    let mm = md.memory_info()?;
                    mig.push(MigReading {
                        uuid: md.uuid()?,
                        name: md.name()?,
                        memory_total_mb: mm.total / MIB,
                        memory_used_mb: mm.used / MIB,
                        processes: processes(&md)?,
                    });
                }
                Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost),
                // No instance at this index.
                Err(_) => {}
            }
        }
    }
    Ok(DeviceReading {
        index,
        uuid: dev.uuid()?,
        name: dev.name()?,
        memory_total_mb: mem.total / MIB,
        memory_used_mb: mem.used / MIB,
        mig_enabled,
        processes: if mig_enabled {
            Vec::new()
        } else {
            processes(dev)?
        },
        mig,
        utilization_pct: dev.utilization_rates().ok().map(|u| u.gpu),
        temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
        power_mw: dev.power_usage().ok(),
        ecc_corrected: dev
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .ok(),
        ecc_uncorrected: dev
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok(),
        xids: Vec::new(),
        lost: false,
    })
}

/// Compute and graphics processes on a GPU or MIG instance (each PID once).
fn processes(dev: &Device<'_>) -> Result<Vec<ProcessReading>, NvmlError> {
    let mut out: Vec<ProcessReading> = Vec::new();
    for list in [
        dev.running_compute_processes(),
        dev.running_graphics_processes(),
    ] {
        let list = match list {
            Ok(l) => l,
            Err(NvmlError::GpuLost) => return Err(NvmlError::GpuLost),
            Err(_) => Vec::new(),
        };
        for p in list {
            if out.iter().any(|o| o.pid == p.pid) {
                continue;
            }
            out.push(ProcessReading {
                pid: p.pid,
                used_memory_mb: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b / MIB),
                    UsedGpuMemory::Unavailable => None,
                },
            });
        }
    }
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn nvml_err(e: NvmlError) -> GpuError {
    GpuError::Nvml(e.to_string())
}

impl GpuSource for NvmlGpus {
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let views = reading::map(&self.read()?, &Ours::default());
        Ok(views.into_iter().map(|v| v.info).collect())
    }

    fn stats(&self, ours: &Ours) -> Result<Vec<GpuStat>, GpuError> {
        let views = reading::map(&self.read()?, ours);
        crate::metrics::METRICS.gpu_sensors(&views);
        Ok(views.into_iter().map(|v| v.stat).collect())
    }

    fn processes(&self) -> Result<Vec<crate::share::GpuProcess>, GpuError> {
        Ok(reading::processes(&self.read()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_without_driver_is_an_error_not_a_panic() {
        // On machines with a driver this succeeds; either way it must not panic.
        let _ = NvmlGpus::init();
    }
}
