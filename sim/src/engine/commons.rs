//! The `commons` policies' side of the engine: the [`sched::Snapshot`] kept in step
//! with the simulation, the window of the queue the scheduler sees, the labs' ledgers,
//! and the check that every plan is applicable before it is applied.
//!
//! Invariant: the snapshot's `running` list holds exactly the running jobs, with the
//! GPUs they hold; everything the scheduler reads that depends on `now` (ledgers,
//! latest checkpoints) is refreshed right before each call.

use super::{Engine, Planner, SimError, St, GPU_STRIDE};
use crate::campus::{Campus, Lend};
use commons_sched as sched;

impl Engine<'_> {
    /// Add GPU-hours to a lab's borrowing and lending ledgers (as the portal does).
    pub(super) fn book(&mut self, lab: usize, used: f64, lent: f64) {
        let half_life = self.policy.half_life_s;
        let l = &mut self.ledgers[lab];
        l.0 = sched::decay(l.0, l.2, self.now, half_life) + used;
        l.1 = sched::decay(l.1, l.2, self.now, half_life) + lent;
        l.2 = self.now;
    }

    /// Bring the parts of the snapshot that depend on `now` up to date: the labs'
    /// ledgers (including running guests' use so far) and each running job's latest
    /// periodic checkpoint.
    #[allow(clippy::needless_update)]
    pub(super) fn refresh_snapshot(&mut self) {
        let now = self.now;
        let half_life = self.policy.half_life_s;
        let mut labs: Vec<sched::LabInfo> = self
            .ledgers
            .iter()
            .enumerate()
            .map(|(i, l)| sched::LabInfo {
                id: i as i64,
                used_gpu_hours: sched::decay(l.0, l.2, now, half_life),
                lent_gpu_hours: sched::decay(l.1, l.2, now, half_life),
                ledger_at: now,
                interactive_boost: self.opts.policy.boosts_interactive(),
                quota: sched::Quota {
                    max_gpus: self.campus.labs[i].max_borrowed_gpus,
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
        for k in 0..self.snap.running.len() {
            let job = self.snap.running[k].id as usize;
            let rt = &self.jobs[job];
            let elapsed = now - rt.start;
            let last_checkpoint_at = match self.interval_of(job) {
                Some(i) if elapsed >= i => Some(rt.start + elapsed / i * i),
                _ => None,
            };
            let write_s = self.known_write_s(job);
            let owner = self.campus.nodes[rt.node].lab;
            let r = &mut self.snap.running[k];
            r.last_checkpoint_at = last_checkpoint_at;
            r.checkpoint_write_s = write_s;
            if owner != r.lab as usize {
                let gpu_h = r.gpus.len() as f64 * elapsed as f64 / 3600.0;
                labs[r.lab as usize].used_gpu_hours += gpu_h;
                labs[owner].lent_gpu_hours += gpu_h;
            }
        }
        self.snap.labs = labs;
    }

    /// Ask the real scheduler, apply its plan, and ask again while the window of
    /// queued jobs it saw was cut short and it still started something.
    ///
    /// Skipped when it provably has nothing to do. The last plan was a fixed point, and
    /// with every GPU held nothing can start; only guests can be preempted, and only
    /// for their node's owner (DESIGN "Policy"). So it is skipped when no job waits;
    /// when every GPU is held and no guest runs; and when every GPU is held, only jobs
    /// arrived, and no guest that is not already stopping runs on a node of their labs.
    pub(super) fn run_sched(&mut self, planner: &mut Planner<'_>) -> Result<(), SimError> {
        let policy = self.policy.clone();
        for round in 0..1_000 {
            let any_free =
                (0..self.free.len()).any(|n| self.down[n] == 0 && !self.free[n].is_empty());
            if self.queue.is_empty() || (!any_free && self.guests == 0) {
                return Ok(());
            }
            if round == 0 && !any_free && !self.other_change && !self.reclaim_possible() {
                return Ok(());
            }
            let mut queue = self.window();
            queue.sort_unstable();
            queue.dedup();
            let truncated = queue.len() < self.queue.len();
            self.snap.queue = queue
                .into_iter()
                .map(|(_, job)| {
                    let limit = self.limits[job] - self.jobs[job].saved;
                    let rt = &self.jobs[job];
                    sched::QueuedJob {
                        take_backs: rt.take_backs,
                        taken_back_at: rt.taken_back_at,
                        ..queued_job(&self.work.jobs[job], limit)
                    }
                })
                .collect();
            self.refresh_snapshot();
            self.refresh_rates();
            let plan = planner(&self.snap, &policy, self.now);
            self.plan_calls += 1;
            for s in &plan.start {
                self.check_start(s)?;
                self.start(s.job as usize, s.node as usize, s.gpus.clone());
            }
            for p in &plan.preempt {
                let job = usize::try_from(p.job).ok().filter(|&j| j < self.jobs.len());
                let job = job.ok_or_else(|| self.bad(format!("preempts unknown job {}", p.job)))?;
                if self.jobs[job].st != St::Running {
                    return Err(self.bad(format!("preempts job {job}, which is not running")));
                }
                if !self.jobs[job].preempting {
                    self.begin_stop(job, i64::from(p.grace_s));
                    self.took_back(self.jobs[job].node);
                }
            }
            for w in &plan.pending {
                if let sched::Reason::SparingGuests { wait_s, .. } = w.reason {
                    // Plan again when the owner job stops sparing the guests.
                    self.wake_at(self.now + wait_s.max(1));
                }
                let Some(at) = w.estimated_start else {
                    continue;
                };
                let out = usize::try_from(w.job)
                    .ok()
                    .and_then(|j| self.jobs.get_mut(j))
                    .map(|rt| &mut rt.out);
                if let Some(o) = out.filter(|o| o.first_start.is_none()) {
                    o.first_estimate.get_or_insert((self.now, at));
                }
            }
            if !truncated || plan.start.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// A guest that is not already stopping runs on a node of a lab that just got a job.
    pub(super) fn reclaim_possible(&self) -> bool {
        self.snap.running.iter().any(|r| {
            let owner = self.campus.nodes[r.node as usize].lab;
            !r.preempting && owner != r.lab as usize && self.arrived[owner]
        })
    }

    /// The queued jobs the scheduler sees in one call, as `(submitted, job)`, unsorted:
    /// the head of the campus-wide queue up to one more job than there are free GPUs
    /// (a first-come-first-served pass can start no more, as each start takes a GPU),
    /// plus the first `window_per_lab` jobs of every lab's queue (what owner priority
    /// and fair share among labs look at; boosted interactive jobs first).
    pub(super) fn window(&self) -> Vec<(i64, usize)> {
        let free: usize = (0..self.free.len())
            .filter(|&n| self.down[n] == 0)
            .map(|n| self.free[n].len())
            .sum();
        let widest = self.campus.max_node_gpus();
        let mut out = Vec::new();
        let mut fitting = 0;
        for &q in &self.queue {
            if fitting > free {
                break;
            }
            if self.work.jobs[q.1].gpus <= widest {
                fitting += 1;
            }
            out.push(q);
        }
        for lab_queue in &self.lab_queue {
            let head = lab_queue.iter().take(self.opts.window_per_lab);
            out.extend(head.map(|&(_, submit, job)| (submit, job)));
        }
        out
    }

    pub(super) fn bad(&self, message: String) -> SimError {
        SimError::BadPlan {
            now: self.now,
            message,
        }
    }

    pub(super) fn check_start(&self, s: &sched::Start) -> Result<(), SimError> {
        let job = usize::try_from(s.job).ok().filter(|&j| j < self.jobs.len());
        let Some(job) = job else {
            return Err(self.bad(format!("starts unknown job {}", s.job)));
        };
        if self.jobs[job].st != St::Queued {
            return Err(self.bad(format!("starts job {job}, which is not queued")));
        }
        let node = usize::try_from(s.node)
            .ok()
            .filter(|&n| n < self.free.len());
        let Some(node) = node else {
            return Err(self.bad(format!("starts job {job} on unknown node {}", s.node)));
        };
        if self.down[node] > 0 {
            return Err(self.bad(format!("starts job {job} on node {node}, which is away")));
        }
        if s.gpus.len() != self.work.jobs[job].gpus as usize {
            return Err(self.bad(format!(
                "gives job {job} {} GPUs, it asked for {}",
                s.gpus.len(),
                self.work.jobs[job].gpus
            )));
        }
        let mut seen = s.gpus.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != s.gpus.len() || s.gpus.iter().any(|g| !self.free[node].contains(g)) {
            return Err(self.bad(format!(
                "gives job {job} GPUs {:?} of node {node}, which are not all free",
                s.gpus
            )));
        }
        Ok(())
    }
}

/// The scheduler's policy knobs for this campus and policy: the defaults, with the
/// campus' grace, the policy's churn knobs and their tuning.
pub(super) fn sched_policy(
    campus: &Campus,
    kind: crate::PolicyKind,
    tuning: &super::Tuning,
) -> sched::Policy {
    let knobs = kind.knobs();
    let default = sched::Policy::default();
    let on = sched::Policy {
        relend_delay_s: tuning.relend_delay_s.unwrap_or(default.relend_delay_s),
        relend_min_rate: tuning.relend_min_rate.unwrap_or(default.relend_min_rate),
        return_risk_step: tuning.return_risk_step.unwrap_or(default.return_risk_step),
        taken_back_max_risk: tuning
            .taken_back_max_risk
            .unwrap_or(default.taken_back_max_risk),
        taken_back_patience_s: tuning
            .taken_back_patience_s
            .unwrap_or(default.taken_back_patience_s),
        grace_covers_checkpoint_s: tuning
            .grace_covers_checkpoint_s
            .unwrap_or(default.grace_covers_checkpoint_s),
        spare_costly_guests_gpu_hours: tuning
            .spare_costly_guests_gpu_hours
            .unwrap_or(default.spare_costly_guests_gpu_hours),
        spare_costly_guests_s: tuning
            .spare_costly_guests_s
            .unwrap_or(default.spare_costly_guests_s),
        owner_delay_share: tuning
            .owner_delay_share
            .unwrap_or(default.owner_delay_share),
        relend_adaptive: tuning.relend_adaptive.unwrap_or(default.relend_adaptive),
        relend_full_rate: tuning.relend_full_rate.unwrap_or(default.relend_full_rate),
        relend_pressure_weight: tuning
            .relend_pressure_weight
            .unwrap_or(default.relend_pressure_weight),
        taken_back_pressure_weight: tuning
            .taken_back_pressure_weight
            .unwrap_or(default.taken_back_pressure_weight),
        ..default
    };
    sched::Policy {
        default_grace_s: u32::try_from(campus.grace_s).unwrap_or(u32::MAX),
        return_risk_placement: knobs.place,
        victims_over_share_first: knobs.victims,
        relend_delay_s: if knobs.hysteresis {
            on.relend_delay_s
        } else {
            0
        },
        owner_borrows_before_preempting: knobs.elsewhere,
        // Patience is off by default; the knob turns it on at 10 minutes.
        owner_patience_s: if knobs.patience { 600 } else { 0 },
        // The take-back rule belongs to `commons` (all knobs), not to the one-knob
        // variants `old+...`.
        taken_back_max_risk: if knobs.place && knobs.hysteresis {
            on.taken_back_max_risk
        } else {
            0.0
        },
        victims_save_aware: knobs.saves,
        grace_covers_checkpoint_s: if knobs.saves {
            on.grace_covers_checkpoint_s
        } else {
            0
        },
        spare_costly_guests_gpu_hours: if knobs.saves {
            on.spare_costly_guests_gpu_hours
        } else {
            0.0
        },
        ..on
    }
}

/// The lending rules of a lab's nodes.
fn lending(lab: &crate::campus::Lab) -> sched::Lending {
    sched::Lending {
        mode: match lab.lend {
            Lend::Always => sched::LendMode::Always,
            Lend::Never => sched::LendMode::Never,
        },
        max_lent_gpus: lab.max_lent_gpus_per_node,
        ..Default::default()
    }
}

// The `..Default::default()` below keep these constructors compiling while `sched`
// adds fields to its structs; clippy finds them needless whenever no field is new.
#[allow(clippy::needless_update)]
pub(super) fn initial_snapshot(campus: &Campus) -> sched::Snapshot {
    let nodes = campus
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| sched::Node {
            id: i as i64,
            name: n.name.clone(),
            lab: n.lab as i64,
            schedulable: true,
            lending: lending(&campus.labs[n.lab]),
            gpus: (0..i64::from(n.gpus))
                .map(|k| sched::Gpu {
                    id: i as i64 * GPU_STRIDE + k,
                    model: n.model.clone(),
                    memory_mb: n.memory_mb,
                    local_use: false,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    sched::Snapshot {
        nodes,
        ..Default::default()
    }
}

#[allow(clippy::needless_update)]
pub(super) fn queued_job(j: &crate::trace::Job, limit: i64) -> sched::QueuedJob {
    sched::QueuedJob {
        id: j.idx as i64,
        user: j.lab as i64,
        lab: j.lab as i64,
        gpus: j.gpus,
        time_limit_s: limit,
        submitted_at: j.submit,
        interactive: j.interactive,
        ..Default::default()
    }
}

#[allow(clippy::needless_update)]
pub(super) fn running_job(
    j: &crate::trace::Job,
    node: usize,
    gpus: Vec<sched::GpuId>,
    now: i64,
    limit: i64,
) -> sched::RunningJob {
    sched::RunningJob {
        id: j.idx as i64,
        user: j.lab as i64,
        lab: j.lab as i64,
        node: node as i64,
        gpus,
        started_at: now,
        time_limit_s: limit,
        preempting: false,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Tuning;
    use crate::PolicyKind;

    #[test]
    fn tuning_applies_only_where_the_knob_is_on() {
        let campus = crate::CampusFile::parse(
            "grace_seconds = 60\n[[lab]]\nname = \"a\"\ntenants = [\"va\"]\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A100-80GB\"\n",
        )
        .unwrap()
        .build()
        .unwrap();
        let tuning = Tuning {
            relend_delay_s: Some(5400),
            relend_min_rate: Some(0.0),
            return_risk_step: Some(1.0),
            taken_back_max_risk: Some(0.3),
            taken_back_patience_s: Some(7200),
            ..Tuning::default()
        };
        let on = sched_policy(&campus, PolicyKind::Commons, &tuning);
        assert_eq!(on.relend_delay_s, 5400);
        assert_eq!(on.relend_min_rate, 0.0);
        assert_eq!(on.return_risk_step_tenths(), 10);
        assert_eq!(on.default_grace_s, 60);
        assert_eq!(on.taken_back_max_risk, 0.3);
        assert_eq!(on.taken_back_patience_s, 7200);
        // Without tuning: sched's defaults.
        let plain = sched_policy(&campus, PolicyKind::Commons, &Tuning::default());
        let defaults = sched::Policy::default();
        assert_eq!(plain.relend_delay_s, defaults.relend_delay_s);
        assert_eq!(plain.return_risk_step, defaults.return_risk_step);
        assert_eq!(plain.taken_back_max_risk, defaults.taken_back_max_risk);
        assert_eq!(plain.taken_back_max_risk, 0.1);
        assert_eq!(plain.taken_back_patience_s, 12 * 3600);
        // A policy without the hysteresis keeps it off, tuned or not.
        let old = sched_policy(&campus, PolicyKind::CommonsOld, &tuning);
        assert_eq!(old.relend_delay_s, 0);
        assert_eq!(old.taken_back_max_risk, 0.0);
        assert!(!old.return_risk_placement);
        let hyst = sched_policy(&campus, PolicyKind::OldHysteresis, &tuning);
        assert_eq!(hyst.relend_delay_s, 5400);
    }
}
