//! Fake GPUs from a fixed list; `commons-agent fake` flips local use and utilisation by
//! writing the state dir's `fake-gpus.json`, which is re-read on every heartbeat.
//!
//! A fake GPU that one of our running containers holds reports the busy utilisation
//! (`--fake-busy-util`, 0 unless set: an idle-looking guest, as the idle-guest rule's
//! tests want) and that share of its memory used, unless `commons-agent fake --util`
//! set a higher one; jobs' utilisation charts then have something to show.
//!
//! Fake GPUs have processes too, for share attempts' memory (`share`): the state dir's
//! [`FAKE_PROCESSES_FILE`] (`fake-gpu-processes.json`), re-read at every look, maps a fake
//! GPU's UUID to its processes, each a host pid and the MiB it holds:
//!
//! ```json
//! { "GPU-fake-00-A100-80GB": [ { "pid": 4242, "used_memory_mb": 6144 } ] }
//! ```
//!
//! Tests write it with the pid of a real process in a job's container; the agent then
//! reads that pid's real `/proc/PID/cgroup`, exactly as with NVML. A missing or unreadable
//! file is no process at all.

use super::{GpuError, GpuSource, Ours};
use crate::config::FakeGpuModel;
use crate::state::load_fake_overrides;
use commons_proto::{GpuInfo, GpuStat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The fake GPUs' processes, in the state dir (see the module's docs).
pub const FAKE_PROCESSES_FILE: &str = "fake-gpu-processes.json";

/// One process on a fake GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeProcess {
    /// A host pid (its `/proc/PID/cgroup` is read as NVML's would be).
    pub pid: u32,
    /// The GPU memory it holds, in MiB.
    pub used_memory_mb: u64,
}

/// The fake GPUs' processes by GPU UUID, as `dir`'s [`FAKE_PROCESSES_FILE`] has them.
pub fn load_fake_processes(dir: &Path) -> BTreeMap<String, Vec<FakeProcess>> {
    std::fs::read(dir.join(FAKE_PROCESSES_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the fake GPUs' processes whole (`atomic`): the agent reads them any time.
pub fn save_fake_processes(
    dir: &Path,
    procs: &BTreeMap<String, Vec<FakeProcess>>,
) -> Result<(), crate::state::StateError> {
    crate::store::write_json(&dir.join(FAKE_PROCESSES_FILE), procs)
}

pub struct FakeGpus {
    models: Vec<FakeGpuModel>,
    state_dir: PathBuf,
    /// Utilisation (percent) of a GPU our containers hold.
    busy_util: u32,
}

impl FakeGpus {
    pub fn new(models: Vec<FakeGpuModel>, state_dir: PathBuf) -> Self {
        Self {
            models,
            state_dir,
            busy_util: 0,
        }
    }

    /// GPUs our running containers hold report `pct` percent busy.
    pub fn busy_at(self, pct: u32) -> Self {
        Self {
            busy_util: pct.min(100),
            ..self
        }
    }
}

impl GpuSource for FakeGpus {
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(self
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| GpuInfo {
                uuid: format!("GPU-fake-{i:02}-{}", m.model),
                index: i as u32,
                model: m.model.clone(),
                memory_mb: m.memory_mb,
                fake: true,
            })
            .collect())
    }

    fn stats(&self, ours: &Ours) -> Result<Vec<GpuStat>, GpuError> {
        let overrides = load_fake_overrides(&self.state_dir);
        Ok(self
            .inventory()?
            .into_iter()
            .map(|g| {
                let o = overrides.get(&g.index).cloned().unwrap_or_default();
                let busy = if ours.gpus.contains(&g.uuid) {
                    self.busy_util
                } else {
                    0
                };
                let ours_mb = g.memory_mb * u64::from(busy) / 100;
                let local_mb = if o.local_use { g.memory_mb / 4 } else { 0 };
                GpuStat {
                    uuid: g.uuid,
                    utilization_pct: o.util_pct.max(busy).min(100),
                    memory_used_mb: (ours_mb + local_mb).min(g.memory_mb),
                    local_use: o.local_use,
                    fault: o.fault.clone(),
                }
            })
            .collect())
    }

    fn processes(&self) -> Result<Vec<crate::share::GpuProcess>, GpuError> {
        let known: Vec<String> = self.inventory()?.into_iter().map(|g| g.uuid).collect();
        let mut out = Vec::new();
        for (gpu, procs) in load_fake_processes(&self.state_dir) {
            if !known.contains(&gpu) {
                continue;
            }
            for p in procs {
                out.push(crate::share::GpuProcess {
                    gpu: gpu.clone(),
                    pid: p.pid,
                    used_memory_mb: p.used_memory_mb,
                    cgroup: std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).ok(),
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{save_fake_overrides, FakeOverride};

    #[test]
    fn overrides_show_up_in_stats() {
        let dir = tempfile::tempdir().unwrap();
        let gpus = FakeGpus::new(
            vec![
                FakeGpuModel {
                    model: "A100-80GB".into(),
                    memory_mb: 81920,
                };
                2
            ],
            dir.path().into(),
        );
        let inv = gpus.inventory().unwrap();
        assert_eq!(inv[1].uuid, "GPU-fake-01-A100-80GB");
        assert!(inv.iter().all(|g| g.fake));
        let before = gpus.stats(&Ours::default()).unwrap();
        assert!(!before[1].local_use);
        let mut o = std::collections::BTreeMap::new();
        o.insert(
            1,
            FakeOverride {
                local_use: true,
                util_pct: 90,
                fault: None,
            },
        );
        save_fake_overrides(dir.path(), &o).unwrap();
        let after = gpus.stats(&Ours::default()).unwrap();
        assert!(after[1].local_use);
        assert_eq!(after[1].utilization_pct, 90);
        assert!(!after[0].local_use);
    }

    #[test]
    fn fake_processes_come_from_the_file_with_their_real_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let model = FakeGpuModel {
            model: "A100-80GB".into(),
            memory_mb: 81920,
        };
        let gpus = FakeGpus::new(vec![model; 1], dir.path().into());
        assert!(gpus.processes().unwrap().is_empty());
        let me = std::process::id();
        let procs = BTreeMap::from([
            (
                "GPU-fake-00-A100-80GB".to_string(),
                vec![FakeProcess {
                    pid: me,
                    used_memory_mb: 1234,
                }],
            ),
            ("GPU-not-here".to_string(), vec![]),
        ]);
        save_fake_processes(dir.path(), &procs).unwrap();
        let listed = gpus.processes().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].pid, listed[0].used_memory_mb), (me, 1234));
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(listed[0].cgroup.as_deref(), Some(own.as_str()));
    }

    #[test]
    fn gpus_our_containers_hold_report_the_busy_utilisation() {
        let dir = tempfile::tempdir().unwrap();
        let model = FakeGpuModel {
            model: "A100-80GB".into(),
            memory_mb: 81920,
        };
        let idle = FakeGpus::new(vec![model.clone(); 2], dir.path().into());
        let busy = FakeGpus::new(vec![model; 2], dir.path().into()).busy_at(75);
        let ours = Ours {
            gpus: ["GPU-fake-01-A100-80GB".to_string()].into(),
            ..Ours::default()
        };
        // Unless told, a fake GPU sits at 0% even when a job holds it.
        assert_eq!(idle.stats(&ours).unwrap()[1].utilization_pct, 0);
        let s = busy.stats(&ours).unwrap();
        assert_eq!((s[0].utilization_pct, s[0].memory_used_mb), (0, 0));
        assert_eq!((s[1].utilization_pct, s[1].memory_used_mb), (75, 61440));
        assert!(!s[1].local_use, "our own use is no local use");
    }
}
