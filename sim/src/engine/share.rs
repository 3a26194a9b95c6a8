//! The baselines' side of the engine: `isolated` and `share-fifo` (strict FCFS, see
//! [`crate::policy::fcfs`]), `share-backfill` and `share-fairshare` (EASY backfill,
//! see [`crate::backfill`]).

use super::Engine;
use crate::backfill::{easy_backfill, fair_order, PoolNode, QueueEntry};
use crate::policy::fcfs;
use commons_sched as sched;

impl Engine<'_> {
    pub(super) fn run_isolated(&mut self) {
        for lab in 0..self.dirty.len() {
            if self.dirty[lab] && !self.lab_nodes[lab].is_empty() {
                let pool = self.lab_nodes[lab].clone();
                let lab_jobs = self.lab_queue[lab].iter().map(|&(_, _, j)| j);
                let queue = self.queue_head(&pool, lab_jobs);
                self.run_fcfs(&pool, &queue);
            }
        }
    }

    pub(super) fn run_share_fifo(&mut self) {
        let pool: Vec<usize> = (0..self.campus.nodes.len()).collect();
        let queue = self.queue_head(&pool, self.queue.iter().map(|&(_, j)| j));
        self.run_fcfs(&pool, &queue);
    }

    /// EASY backfill over every node, in submission order or (`fair`) in fair-share
    /// order of the labs.
    pub(super) fn run_backfill(&mut self, fair: bool) {
        let nodes: Vec<PoolNode> = (0..self.campus.nodes.len())
            .map(|n| PoolNode {
                free: self.free[n].len() as u32,
                size: self.campus.nodes[n].gpus,
                up: self.down[n] == 0,
                ends: self.on_node[n]
                    .iter()
                    .map(|&j| (self.jobs[j].limit_end, self.jobs[j].gpus.len() as u32))
                    .collect(),
            })
            .collect();
        let entry = |j: usize| -> QueueEntry {
            let limit = self.limits[j] - self.jobs[j].saved;
            (j, self.work.jobs[j].gpus, limit)
        };
        let starts = if fair {
            let usage = self.fair_usage();
            let order = fair_order(&usage);
            let queue = order
                .into_iter()
                .flat_map(|lab| self.lab_queue[lab].iter().map(|&(_, _, j)| j));
            easy_backfill(queue.map(entry), &nodes, self.now)
        } else {
            let queue = self.queue.iter().map(|&(_, j)| j);
            easy_backfill(queue.map(entry), &nodes, self.now)
        };
        for (job, node) in starts {
            let take = self.work.jobs[job].gpus as usize;
            let gpus = self.free[node][..take].to_vec();
            self.start(job, node, gpus);
        }
    }

    /// Each lab's decayed GPU-hours (finished attempts, plus running ones so far).
    fn fair_usage(&self) -> Vec<f64> {
        let half_life = self.policy.half_life_s;
        let mut usage: Vec<f64> = self
            .fs_usage
            .iter()
            .map(|&(u, at)| sched::decay(u, at, self.now, half_life))
            .collect();
        for r in &self.snap.running {
            let rt = &self.jobs[r.id as usize];
            usage[r.lab as usize] += r.gpus.len() as f64 * (self.now - rt.start) as f64 / 3600.0;
        }
        usage
    }

    /// Book a finished or stopped attempt into its lab's fair-share usage.
    pub(super) fn book_fair_share(&mut self, job: usize, gpus: usize) {
        let lab = self.work.jobs[job].lab;
        let gpu_h = gpus as f64 * (self.now - self.jobs[job].start) as f64 / 3600.0;
        let half_life = self.policy.half_life_s;
        let u = &mut self.fs_usage[lab];
        u.0 = sched::decay(u.0, u.1, self.now, half_life) + gpu_h;
        u.1 = self.now;
    }

    /// The part of a queue that strict FCFS over `pool` can reach now: each start takes
    /// at least one free GPU, so no more jobs than free GPUs (plus the one that waits)
    /// matter; jobs wider than every node of the pool are skipped and do not count.
    fn queue_head(&self, pool: &[usize], queue: impl Iterator<Item = usize>) -> Vec<usize> {
        let widest = pool
            .iter()
            .map(|&n| self.campus.nodes[n].gpus)
            .max()
            .unwrap_or(0);
        let free: usize = pool.iter().map(|&n| self.free[n].len()).sum();
        let mut out = Vec::new();
        let mut fitting = 0;
        for job in queue {
            if fitting > free {
                break;
            }
            if self.work.jobs[job].gpus <= widest {
                fitting += 1;
            }
            out.push(job);
        }
        out
    }

    fn run_fcfs(&mut self, pool: &[usize], queue: &[usize]) {
        let free: Vec<u32> = pool.iter().map(|&n| self.free[n].len() as u32).collect();
        let size: Vec<u32> = pool.iter().map(|&n| self.campus.nodes[n].gpus).collect();
        let up: Vec<bool> = pool.iter().map(|&n| self.down[n] == 0).collect();
        let jobs = queue.iter().map(|&j| (j, self.work.jobs[j].gpus));
        for (job, i) in fcfs(jobs, &free, &size, &up) {
            let node = pool[i];
            let take = self.work.jobs[job].gpus as usize;
            let gpus = self.free[node][..take].to_vec();
            self.start(job, node, gpus);
        }
    }
}
