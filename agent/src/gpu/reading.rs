//! What NVML said, as plain values, and the one pure function that turns it into the
//! agent's GPUs: [`map`].
//!
//! The NVML backend ([`super::nvml`]) only reads: it fills an [`NvmlReading`] (each
//! device's figures, its MIG instances, its compute processes with their PIDs, the Xid
//! events seen, and each GPU process's `/proc/PID/cgroup` text) and hands it to [`map`].
//! Tests feed [`map`] recorded readings (`gpu/testdata/*.json`), so everything the agent
//! decides about real GPUs is tested on machines without one.
//!
//! [`map`]:
//! 1. Lists the lendable GPUs in device order: a GPU, or, when MIG is on, each of its MIG
//!    instances as a GPU of its own size (model `<parent model>-MIG-<profile>`); the parent
//!    of MIG instances is never lendable itself. Indexes count the lendable GPUs.
//! 2. Attributes each process on a GPU: a PID the agent knows as its own, or a process
//!    whose cgroup names one of the agent's containers, is ours; a process whose cgroup
//!    cannot be read has ended; any other process (another container, a login session, a
//!    systemd unit) is the owner's local use.
//! 3. Names a fault that withdraws the GPU: fallen off the bus (NVML's "GPU is lost", or
//!    Xid 79), uncorrected ECC errors, or another Xid that means the GPU needs a reset.
//!    A MIG instance shares its parent's faults. Xids that a program's own bug causes
//!    (13, 31, 43, 45, ...) withdraw nothing.

use super::cgroup;
use super::Ours;
use commons_proto::{GpuInfo, GpuStat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One reading of every GPU on the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmlReading {
    pub devices: Vec<DeviceReading>,
    /// `/proc/PID/cgroup` of each GPU process, read right after NVML listed it; a PID
    /// missing here had ended.
    #[serde(default)]
    pub cgroups: BTreeMap<u32, String>,
}

/// One physical GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceReading {
    /// NVML's index of the device.
    pub index: u32,
    pub uuid: String,
    /// As NVML names it, e.g. "NVIDIA A100-SXM4-80GB".
    pub name: String,
    pub memory_total_mb: u64,
    #[serde(default)]
    pub memory_used_mb: u64,
    /// MIG mode is on (current, not pending): the instances are the lendable GPUs.
    #[serde(default)]
    pub mig_enabled: bool,
    #[serde(default)]
    pub mig: Vec<MigReading>,
    /// None where NVML does not report it (MIG mode, older GPUs).
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    #[serde(default)]
    pub temperature_c: Option<u32>,
    #[serde(default)]
    pub power_mw: Option<u32>,
    /// Volatile ECC error counts (since the driver loaded); None without ECC.
    #[serde(default)]
    pub ecc_corrected: Option<u64>,
    #[serde(default)]
    pub ecc_uncorrected: Option<u64>,
    /// Critical Xid errors the agent has seen on this GPU since it started.
    #[serde(default)]
    pub xids: Vec<u64>,
    /// NVML answers "GPU is lost": it fell off the bus.
    #[serde(default)]
    pub lost: bool,
    /// Compute and graphics processes on the whole GPU (MIG off).
    #[serde(default)]
    pub processes: Vec<ProcessReading>,
}

/// One MIG instance of a GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigReading {
    pub uuid: String,
    /// As NVML names it, e.g. "NVIDIA A100-SXM4-80GB MIG 1g.10gb".
    pub name: String,
    pub memory_total_mb: u64,
    #[serde(default)]
    pub memory_used_mb: u64,
    #[serde(default)]
    pub processes: Vec<ProcessReading>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessReading {
    /// Host PID, as NVML reports it.
    pub pid: u32,
    #[serde(default)]
    pub used_memory_mb: Option<u64>,
}

/// Every process of `reading` on a lendable GPU (a MIG instance's under the instance's
/// UUID), with its memory (0 where NVML did not say) and its cgroup text.
pub fn processes(reading: &NvmlReading) -> Vec<crate::share::GpuProcess> {
    let mut out = Vec::new();
    let mut add = |gpu: &str, procs: &[ProcessReading]| {
        for p in procs {
            out.push(crate::share::GpuProcess {
                gpu: gpu.to_string(),
                pid: p.pid,
                used_memory_mb: p.used_memory_mb.unwrap_or(0),
                cgroup: reading.cgroups.get(&p.pid).cloned(),
            });
        }
    };
    for dev in &reading.devices {
        if dev.mig_enabled {
            for m in &dev.mig {
                add(&m.uuid, &m.processes);
            }
        } else {
            add(&dev.uuid, &dev.processes);
        }
    }
    out
}

/// Whose a GPU process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessOwner {
    /// In one of the agent's containers.
    Ours,
    /// The owner's own use: in no container (a login session, a systemd unit), or in a
    /// container that GPU Commons did not start (named here).
    Local { container: Option<String> },
    /// It ended before its cgroup could be read.
    Gone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUse {
    pub pid: u32,
    pub owner: ProcessOwner,
}

/// One lendable GPU as the agent reports it, with the figures only the agent shows
/// (temperature, power, ECC, whose processes).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuView {
    pub info: GpuInfo,
    pub stat: GpuStat,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub processes: Vec<ProcessUse>,
}

/// The lendable GPUs of `reading`, their processes attributed against `ours`; see the
/// module's numbered list.
pub fn map(reading: &NvmlReading, ours: &Ours) -> Vec<GpuView> {
    let mut out = Vec::new();
    for dev in &reading.devices {
        let fault = fault_of(dev);
        let parent_model = model_name(&dev.name, dev.memory_total_mb);
        let common = |uuid: &str, model: String, total, used, util, procs: &[ProcessReading]| {
            let processes: Vec<ProcessUse> = procs
                .iter()
                .map(|p| ProcessUse {
                    pid: p.pid,
                    owner: owner_of(p.pid, &reading.cgroups, ours),
                })
                .collect();
            GpuView {
                info: GpuInfo {
                    uuid: uuid.to_string(),
                    index: 0,
                    model,
                    memory_mb: total,
                    fake: false,
                },
                stat: GpuStat {
                    uuid: uuid.to_string(),
                    utilization_pct: util,
                    memory_used_mb: used,
                    local_use: processes
                        .iter()
                        .any(|p| matches!(p.owner, ProcessOwner::Local { .. })),
                    fault: fault.clone(),
                },
                temperature_c: dev.temperature_c,
                power_w: dev.power_mw.map(|mw| f64::from(mw) / 1000.0),
                ecc_corrected: dev.ecc_corrected,
                ecc_uncorrected: dev.ecc_uncorrected,
                processes,
            }
        };
        if dev.mig_enabled {
            for m in &dev.mig {
                let model = format!("{parent_model}-MIG-{}", mig_profile(&m.name));
                // NVML reports no utilisation for a MIG instance: a process on it counts
                // as busy, so an idle-guest check never stops a guest that computes there.
                let util = if m.processes.is_empty() { 0 } else { 100 };
                out.push(common(
                    &m.uuid,
                    model,
                    m.memory_total_mb,
                    m.memory_used_mb,
                    util,
                    &m.processes,
                ));
            }
        } else {
            out.push(common(
                &dev.uuid,
                parent_model,
                dev.memory_total_mb,
                dev.memory_used_mb,
                dev.utilization_pct.unwrap_or(0).min(100),
                &dev.processes,
            ));
        }
    }
    for (n, g) in out.iter_mut().enumerate() {
        g.info.index = n as u32;
    }
    out
}

/// Step 2 of [`map`].
fn owner_of(pid: u32, cgroups: &BTreeMap<u32, String>, ours: &Ours) -> ProcessOwner {
    if ours.pids.contains(&pid) {
        return ProcessOwner::Ours;
    }
    let Some(text) = cgroups.get(&pid) else {
        return ProcessOwner::Gone;
    };
    match cgroup::container_id(text) {
        Some(id) if ours.containers.iter().any(|c| c.eq_ignore_ascii_case(&id)) => {
            ProcessOwner::Ours
        }
        container => ProcessOwner::Local { container },
    }
}

/// Xids that leave the GPU unusable until it is reset, in words for the lab admin.
/// (NVIDIA's Xid catalogue; application errors such as 13, 31, 43 and 45 are not here.)
const FATAL_XIDS: [(u64, &str); 9] = [
    (48, "a double-bit ECC error"),
    (64, "an ECC row remapping failure"),
    (74, "an NVLink error"),
    (79, "fallen off the bus"),
    (92, "a high single-bit ECC error rate"),
    (94, "a contained ECC error"),
    (95, "an uncontained ECC error"),
    (119, "a GSP RPC timeout"),
    (120, "a GSP error"),
];

/// Step 3 of [`map`].
fn fault_of(dev: &DeviceReading) -> Option<String> {
    let mut faults = Vec::new();
    if dev.lost {
        faults.push("fallen off the bus (NVML: GPU is lost)".to_string());
    }
    let mut xids = dev.xids.clone();
    xids.sort_unstable();
    xids.dedup();
    for x in xids {
        if let Some((_, what)) = FATAL_XIDS.iter().find(|(n, _)| *n == x) {
            if !(x == 79 && dev.lost) {
                faults.push(format!("{what} (Xid {x})"));
            }
        }
    }
    if let Some(n) = dev.ecc_uncorrected.filter(|n| *n > 0) {
        faults.push(format!(
            "{n} uncorrected ECC error{} since the driver loaded",
            if n == 1 { "" } else { "s" }
        ));
    }
    (!faults.is_empty()).then(|| faults.join("; "))
}

/// "NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> "1g.10gb".
fn mig_profile(name: &str) -> String {
    name.rsplit_once("MIG ")
        .map(|(_, p)| p.trim())
        .filter(|p| !p.is_empty())
        .unwrap_or(name)
        .replace(' ', "-")
}

/// "NVIDIA H200" with 143,771 MiB -> "H200-140GB": the model names users ask for (a name
/// that gives its memory, "NVIDIA H100 80GB HBM3", keeps it: "H100-80GB-HBM3").
pub fn model_name(name: &str, memory_mb: u64) -> String {
    let short = name
        .trim_start_matches("NVIDIA ")
        .trim_start_matches("GeForce ")
        .replace(' ', "-");
    let gb = (memory_mb + 512) / 1024;
    let sized = short.split('-').any(|t| {
        t.strip_suffix("GB")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if sized {
        short
    } else {
        format!("{short}-{gb}GB")
    }
}
