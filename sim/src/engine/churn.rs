//! What the churn knobs need from the simulation: when owner work left each GPU
//! (`Gpu::idle_since`, for the re-lending hysteresis), and each node's owner take-back
//! rate by hour of the week (`Node::owner_return_rate`), learned from the replay so far.
//!
//! The rate of a node for hour `h` of the week is the number of guests the scheduler
//! stopped on it for its owner in that hour of the week so far, divided by the weeks
//! elapsed (at least one). It is what the portal would keep in its ledger; here it is
//! recomputed at most once per simulated hour and after every take-back.

use super::{Engine, Ev, GPU_STRIDE};
use commons_sched as sched;

const WEEK_S: i64 = 7 * 86_400;

impl Engine<'_> {
    /// The GPUs `gpus` of `node` were just released by `job`.
    pub(super) fn released(&mut self, job: usize, node: usize, gpus: &[sched::GpuId]) {
        self.book_fair_share(job, gpus.len());
        let owner = self.campus.nodes[node].lab == self.work.jobs[job].lab;
        if !owner || !self.opts.policy.uses_sched() {
            return;
        }
        for &g in gpus {
            let k = (g % GPU_STRIDE) as usize;
            if let Some(gpu) = self.snap.nodes[node].gpus.get_mut(k) {
                gpu.idle_since = self.now;
            }
        }
        if self.knobs.hysteresis {
            let at = self.now + self.policy.relend_delay_s + 1;
            self.push(at, Ev::Wake);
        }
    }

    /// Plan again at `at` (once, however often it is asked for).
    pub(super) fn wake_at(&mut self, at: i64) {
        if self.wakes.insert(at) {
            self.push(at, Ev::Wake);
        }
    }

    /// The scheduler stopped a guest on `node` for its owner.
    pub(super) fn took_back(&mut self, node: usize) {
        self.takebacks[node][sched::hour_of_week(self.now, self.policy.utc_offset_s)] += 1;
        self.rates_hour = None;
    }

    /// Bring the snapshot's owner return rates up to date (policies that use them).
    ///
    /// Each node's counts are smoothed with [`sched::smooth_return_rate`] (per week
    /// elapsed) and averaged with its lab's mean per node (the owner is the lab, whose
    /// jobs may land on any of its nodes).
    pub(super) fn refresh_rates(&mut self) {
        if !(self.knobs.place || self.knobs.hysteresis || self.knobs.elsewhere) {
            return;
        }
        let hour = (self.now - self.work.span.0).div_euclid(3600);
        if self.rates_hour == Some(hour) {
            return;
        }
        self.rates_hour = Some(hour);
        let weeks = ((self.now - self.work.span.0) as f64 / WEEK_S as f64).max(1.0);
        let hours = sched::WEEK_HOURS;
        let smooth = |counts: &[f64]| sched::smooth_return_rate(counts, weeks);
        for nodes in &self.lab_nodes {
            let mut lab = vec![0.0; hours];
            for &n in nodes {
                for (l, &c) in lab.iter_mut().zip(&self.takebacks[n]) {
                    *l += f64::from(c) / nodes.len() as f64;
                }
            }
            let lab = smooth(&lab);
            for &n in nodes {
                let own: Vec<f64> = self.takebacks[n].iter().map(|&c| f64::from(c)).collect();
                self.snap.nodes[n].owner_return_rate = smooth(&own)
                    .into_iter()
                    .zip(&lab)
                    .map(|(o, l)| 0.5 * (o + l))
                    .collect();
            }
        }
    }
}
