//! Fake GPUs from a fixed list; `commons-agent fake` flips local use and utilisation by
//! writing the state dir's `fake-gpus.json`, which is re-read on every heartbeat.
//!
//! A fake GPU that one of our running containers holds reports the busy utilisation
//! (`--fake-busy-util`, 0 unless set: an idle-looking guest, as the idle-guest rule's
//! tests want) and that share of its memory used, unless `commons-agent fake --util`
//! set a higher one; jobs' utilisation charts then have something to show.

use super::{GpuError, GpuSource, Ours};
use crate::config::FakeGpuModel;
use crate::state::load_fake_overrides;
use commons_proto::{GpuInfo, GpuStat};
use std::path::PathBuf;

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
