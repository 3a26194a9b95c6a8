//! What the owner's side of the agent sees of the executor: the attempts that hold GPUs
//! here (for `commons-agent status` and the owner's watch), and which GPU processes are
//! ours (so the owner's own use is told apart).

use super::{container_of, Executor};
use crate::gpu::{GpuError, GpuSource, Ours};
use crate::reconcile::Phase;
use crate::runtime::ContainerRuntime;
use commons_proto::{Attempt, GpuStat, JobId, JobSpec};
use std::collections::BTreeSet;
use std::time::Duration;

impl<R: ContainerRuntime> Executor<R> {
    /// The attempts that hold GPUs here (not yet ended), for the owner's controls and
    /// `commons-agent status`, in (job, attempt) order.
    pub fn active(&self) -> Vec<ActiveAttempt> {
        let t = self.table();
        t.want
            .iter()
            .filter_map(|(key, w)| {
                let h = t.have.get(key);
                if h.is_some_and(super::shares::ended) || (h.is_none() && w.stop.is_some()) {
                    return None;
                }
                let launch = w.launch.as_deref();
                let started = h.and_then(|h| Some(h.deadline? - h.time_limit?));
                Some(ActiveAttempt {
                    job: key.0,
                    attempt: key.1,
                    spec: launch.map(|l| l.spec.clone()),
                    gpus: launch
                        .map(|l| l.gpus.iter().map(|g| g.uuid.clone()).collect())
                        .unwrap_or_default(),
                    started,
                    stopping: w.stop.is_some() || h.is_some_and(|h| h.stopping.is_some()),
                })
            })
            .collect()
    }

    /// Our containers, by id, the host pids inside them, and the GPUs of those running.
    pub async fn ours(&self) -> Ours {
        let (ids, gpus) = {
            let t = self.table();
            let ids: BTreeSet<String> = t
                .have
                .values()
                .filter_map(|h| container_of(&h.phase).map(str::to_string))
                .collect();
            let gpus: BTreeSet<String> = t
                .have
                .iter()
                .filter(|(_, h)| {
                    matches!(
                        h.phase,
                        Phase::Running { .. }
                            | Phase::Draining { .. }
                            | Phase::Found { running: true, .. }
                    )
                })
                .filter_map(|(key, _)| t.want.get(key)?.launch.clone())
                .flat_map(|l| l.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>())
                .collect();
            (ids, gpus)
        };
        let mut pids = BTreeSet::new();
        for id in &ids {
            pids.extend(self.inner.runtime.pids(id).await);
        }
        Ours {
            containers: ids,
            pids,
            gpus,
        }
    }

    /// The GPUs' live numbers, with a GPU process outside our containers counted as the
    /// owner's local use.
    pub async fn gpu_stats(&self, gpus: &dyn GpuSource) -> Result<Vec<GpuStat>, GpuError> {
        let ours = self.ours().await;
        gpus.stats(&ours)
    }
}

/// An attempt that holds GPUs here, as [`Executor::active`] lists it.
#[derive(Debug, Clone)]
pub struct ActiveAttempt {
    pub job: JobId,
    pub attempt: Attempt,
    /// What the portal sent; `None` for an attempt re-adopted after an agent restart
    /// (then it counts as the owner's: the portal still preempts guests itself).
    pub spec: Option<JobSpec>,
    /// UUIDs of its GPUs.
    pub gpus: Vec<String>,
    /// When its container started (boot clock), once known.
    pub started: Option<Duration>,
    /// A stop is under way.
    pub stopping: bool,
}

impl ActiveAttempt {
    /// A guest here (charged to another lab than the server's).
    pub fn guest(&self) -> bool {
        self.spec.as_ref().is_some_and(|s| s.guest)
    }
}
