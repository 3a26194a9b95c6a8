//! Fake GPUs from a fixed list; `commons-agent fake` flips local use and utilisation by
//! writing the state dir's `fake-gpus.json`, which is re-read on every heartbeat.

use super::{GpuError, GpuSource, Ours};
use crate::config::FakeGpuModel;
use crate::state::load_fake_overrides;
use commons_proto::{GpuInfo, GpuStat};
use std::path::PathBuf;

pub struct FakeGpus {
    models: Vec<FakeGpuModel>,
    state_dir: PathBuf,
}

impl FakeGpus {
    pub fn new(models: Vec<FakeGpuModel>, state_dir: PathBuf) -> Self {
        Self { models, state_dir }
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

    fn stats(&self, _ours: &Ours) -> Result<Vec<GpuStat>, GpuError> {
        let overrides = load_fake_overrides(&self.state_dir);
        Ok(self
            .inventory()?
            .into_iter()
            .map(|g| {
                let o = overrides.get(&g.index).cloned().unwrap_or_default();
                GpuStat {
                    uuid: g.uuid,
                    utilization_pct: o.util_pct.min(100),
                    memory_used_mb: if o.local_use { g.memory_mb / 4 } else { 0 },
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
}
