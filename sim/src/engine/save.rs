//! Stopping a running job: the grace period, the checkpoint it may write in it, and
//! the work it keeps, under the older model or the checkpoint model with failures
//! ([`crate::checkpoint`]).
//!
//! Invariant: without the model every figure is what it was before the model existed
//! (the same events at the same times), so runs without its flags are unchanged.

use super::{Engine, Ev, St};
use crate::checkpoint::CheckpointModel;
use crate::trace::Workload;

/// Each job's draws under the model (empty without it): never checkpoints, fill.
pub(super) fn draws(work: &Workload, model: Option<&CheckpointModel>) -> Vec<(bool, f64)> {
    let Some(m) = model else {
        return Vec::new();
    };
    work.jobs
        .iter()
        .map(|j| (m.never_checkpoints(j.trace_id), m.fill(j.trace_id)))
        .collect()
}

impl Engine<'_> {
    /// The periodic checkpoint interval of a job: the policy's, unless the model says
    /// the job never checkpoints.
    pub(super) fn interval_of(&self, job: usize) -> Option<i64> {
        match self.saves.get(job) {
            Some(&(true, _)) => None,
            _ => self.ckpt,
        }
    }

    /// Seconds the job's checkpoint takes on the node it runs on (the model only).
    pub(super) fn write_time(&self, job: usize) -> i64 {
        let (Some(m), Some(&(_, fill))) = (self.opts.checkpoints.as_ref(), self.saves.get(job))
        else {
            return 0;
        };
        let rt = &self.jobs[job];
        let memory = self.campus.nodes[rt.node].memory_mb;
        m.write_s(fill, rt.gpus.len(), memory)
    }

    /// What the portal knows of a running job's checkpoints under the model: the write
    /// time of its latest one, in this attempt or an earlier one.
    pub(super) fn known_write_s(&self, job: usize) -> Option<i64> {
        self.opts.checkpoints?;
        let rt = &self.jobs[job];
        match self.interval_of(job) {
            Some(i) if rt.st == St::Running && self.now - rt.start >= i => {
                Some(self.write_time(job))
            }
            _ => rt.write_s,
        }
    }

    /// Tell a running job to stop within `grace` seconds. Under the model a job that
    /// never checkpoints leaves at once, one whose write fits the grace period leaves
    /// when it is written, and the others at the end of the grace period.
    pub(super) fn begin_stop(&mut self, job: usize, grace: i64) {
        let mut hold = grace;
        let mut save_ok = false;
        if self.opts.checkpoints.is_some() {
            let write = self.write_time(job);
            (hold, save_ok) = match self.interval_of(job) {
                None => (0, false),
                Some(_) if write <= grace => (write, true),
                Some(_) => (grace, false),
            };
        }
        let now = self.now;
        let rt = &mut self.jobs[job];
        rt.preempting = true;
        rt.signal_at = now;
        rt.save_ok = save_ok;
        let attempt = rt.out.attempts;
        self.snap.running[self.run_pos[job]].preempting = true;
        self.push(now + hold, Ev::GraceEnd { job, attempt });
    }

    /// Stop a running job now and queue it again. `graceful`: it had its grace period
    /// (and may have checkpointed in it); otherwise its node vanished.
    pub(super) fn stop(&mut self, job: usize, graceful: bool) {
        let (until, saved, progress) = self.kept_work(job, graceful);
        let rt = &self.jobs[job];
        let lost = progress - saved;
        self.acct.lose(until, lost, rt.gpus.len() as u64);
        if rt.displaced {
            if lost <= self.campus.checkpoint_interval_s.unwrap_or(0) {
                self.migrations_ok += 1;
            } else {
                self.migrations_failed += 1;
            }
        } else {
            self.preemptions += 1;
        }
        let taken_back = !rt.displaced;
        let write_s = self.stopped_write_s(job, graceful, until);
        self.release(job);
        let rt = &mut self.jobs[job];
        if taken_back {
            rt.take_backs += 1;
            rt.taken_back_at = self.now;
        }
        rt.write_s = write_s;
        rt.saved = saved;
        rt.displaced = false;
        rt.preempting = false;
        rt.st = St::Queued;
        let j = &self.work.jobs[job];
        self.queue.insert((j.submit, job));
        let key = self.lab_key(job);
        self.lab_queue[j.lab].insert(key);
        self.touch(j.lab);
    }

    /// When the job stopped working, the work it keeps, and the work it had done (both
    /// in seconds since its first attempt began).
    fn kept_work(&self, job: usize, graceful: bool) -> (i64, i64, i64) {
        let rt = &self.jobs[job];
        if self.opts.checkpoints.is_none() {
            let elapsed = self.now - rt.start;
            let progress = rt.saved + elapsed;
            let saved = match self.ckpt {
                None => 0,
                Some(_) if graceful && self.ckpt_on_stop => progress,
                Some(i) => rt.saved + elapsed / i * i,
            };
            return (self.now, saved, progress);
        }
        // A job told to stop stops working then: it writes, or waits to be killed.
        let until = if rt.preempting {
            rt.signal_at
        } else {
            self.now
        };
        let elapsed = until - rt.start;
        let progress = rt.saved + elapsed;
        let saved = match self.interval_of(job) {
            None => 0,
            Some(_) if graceful && rt.preempting && rt.save_ok => progress,
            Some(i) => rt.saved + elapsed / i * i,
        };
        (until, saved, progress)
    }

    /// The write time the portal knows after this stop (the model only): the save's,
    /// else the last periodic snapshot's, else an earlier attempt's.
    fn stopped_write_s(&self, job: usize, graceful: bool, until: i64) -> Option<i64> {
        self.opts.checkpoints?;
        let rt = &self.jobs[job];
        match self.interval_of(job) {
            Some(_) if graceful && rt.preempting && rt.save_ok => Some(self.write_time(job)),
            Some(i) if until - rt.start >= i => Some(self.write_time(job)),
            _ => rt.write_s,
        }
    }
}
