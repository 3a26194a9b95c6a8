//! GPU shares in the plan: booking shares on the working copy's GPUs, and where a
//! guest's share goes.
//!
//! A GPU is held whole by one job, or carries any number of shares, never both. The
//! share model in [`crate::share`] decides among the GPUs a share may use; this module
//! decides which GPUs those are and books the result.
//!
//! Invariants:
//! - The shares on a GPU never hold more than its compute (1000 milli) or its memory:
//!   a start takes only what [`crate::share::ShareGpu::fits`] grants on the GPU's free
//!   amounts now.
//! - A share goes only to a node whose lending has `share_gpus`, on a whole GPU (not a
//!   MIG instance) that matches the job, is not in local use, not held whole, not
//!   claimed by a waiting owner job, idle long enough for the lending rules (guests),
//!   and unreserved or the job ends before the reservation starts.
//! - A GPU that carries any share counts as taken for whole-GPU jobs (`NodeW::free`),
//!   and as one lent GPU for `max_lent_gpus` while any of its shares is a guest's.
//! - The choice is deterministic: the share model's `commons` rule (fragmentation
//!   against the recent mix of waiting GPU requests, best fit on ties) among the nodes
//!   of the lowest (return-risk class, datasets to fetch), nodes and GPUs in index
//!   order on ties.

use crate::lending::{guest_block, LendBlock};
use crate::model::*;
use crate::placement::{end_of, Verdict};
use crate::risk::too_risky_after_take_back;
use crate::share::{
    place, GpuAsk, ShapeMix, ShareGpu, ShareNode, SharePolicy, ShareRequest, ShareTuning,
};
use crate::state::{gpu_matches, RunW, World};

/// The share model's view of a request for `job`: the share it asks for, or its whole
/// GPUs; its CPUs and memory; its models.
pub(crate) fn share_request(job: &QueuedJob) -> ShareRequest {
    let gpu = match job.share {
        Some(s) => GpuAsk::Share {
            milli: s.milli,
            memory_mb: s.memory_mb,
        },
        None => GpuAsk::Whole { count: job.gpus },
    };
    ShareRequest {
        cpu_milli: (job.cpus.max(0.0) * 1000.0).ceil() as u64,
        memory_mib: job.memory_mb,
        gpu,
        models: job.models.clone(),
    }
}

/// The amounts a share takes on a GPU of `memory_mb` with nothing on it (what a request
/// that names only one of them resolves to), or `None` if it never fits there.
pub(crate) fn resolve(share: GpuShare, memory_mb: u64) -> Option<(u32, u64)> {
    ShareGpu::new("", memory_mb).fits(&GpuAsk::Share {
        milli: share.milli,
        memory_mb: share.memory_mb,
    })
}

/// The recent mix of waiting GPU requests that `commons` measures fragmentation
/// against: the latest [`ShareTuning::mix_window`] by job id (MIG requests, which never
/// meet a share, left out). Empty when no job asks for a share: nothing reads it then.
pub(crate) fn waiting_mix(queue: &[&QueuedJob]) -> ShapeMix {
    let window = ShareTuning::default().mix_window;
    let mut mix = ShapeMix::new(window);
    if !queue.iter().any(|j| j.share.is_some()) {
        return mix;
    }
    let mut latest: Vec<&QueuedJob> = queue
        .iter()
        .copied()
        .filter(|j| j.mig_profile.is_none() && j.gpus > 0)
        .collect();
    latest.sort_unstable_by_key(|j| j.id);
    let skip = latest.len().saturating_sub(window);
    for j in &latest[skip..] {
        mix.observe(&share_request(j));
    }
    mix
}

/// Whether every share on GPU `g` is a guest's that this plan did not start (stopping
/// them all gives the owner the GPU).
pub(crate) fn guest_shares_only(world: &World, g: usize) -> bool {
    world.gpus[g].shares().iter().all(|&r| {
        let run = &world.running[r];
        run.guest && !run.new
    })
}

/// A share placed: node, GPU (indices) and the amounts it takes there.
pub(crate) type ShareFit = (usize, usize, u32, u64);

impl World<'_> {
    /// Book running job `idx`'s share on its GPU (called by `add_running`).
    pub(crate) fn book_share(&mut self, idx: usize, run: &RunW, share: GpuShare) {
        let Some(&g) = run.gpus.first() else { return };
        let gw = &mut self.gpus[g];
        let n = gw.node;
        let s = gw.shared.get_or_insert_with(Box::default);
        s.runs.push(idx);
        s.milli = s.milli.saturating_add(share.milli);
        s.memory_mb = s.memory_mb.saturating_add(share.memory_mb);
        if run.guest {
            if s.guests == 0 {
                self.nodes[n].guest_gpus += 1;
            }
            s.guests += 1;
        }
    }

    /// Start queued share job `j` on GPU `g` of `node`, taking `milli` and `memory_mb`.
    pub(crate) fn start_share(&mut self, j: usize, (node, g, milli, memory_mb): ShareFit) -> Start {
        let job = self.queue[j];
        let gw = &self.gpus[g];
        if gw.is_empty() && !gw.gpu.local_use {
            if gw.claim.is_none() && self.nodes[node].node.schedulable {
                self.free_total -= 1;
            }
            self.nodes[node].free -= 1;
        }
        self.nodes[node].changes = self.nodes[node].changes.wrapping_add(1);
        let share = GpuShare { milli, memory_mb };
        let id = self.gpus[g].gpu.id;
        self.add_running(RunW {
            job: job.id,
            lab: self.meta[j].lab,
            member: self.meta[j].member,
            node: Some(node),
            gpus: vec![g],
            gpu_count: 1,
            milli: u64::from(milli),
            share: Some(share),
            started_at: self.now,
            time_limit_s: job.time_limit_s,
            last_checkpoint_at: None,
            checkpoint_write_s: None,
            preempting: false,
            new: true,
            guest: self.nodes[node].node.lab != job.lab,
            cpus: job.cpus,
            memory_mb: job.memory_mb,
        });
        Start {
            job: job.id,
            node: self.nodes[node].node.id,
            gpus: vec![id],
            share: Some(share),
        }
    }

    /// GPU `g` as the share model sees it: its free compute and memory, or nothing free
    /// when `usable` is false.
    pub(crate) fn share_gpu(&self, g: usize, usable: bool) -> ShareGpu {
        let gw = &self.gpus[g];
        let mut out = ShareGpu::new(gw.gpu.model.clone(), gw.gpu.memory_mb);
        if usable {
            let (milli, memory_mb) = gw.share_used();
            out.free_milli = out.free_milli.saturating_sub(milli);
            out.free_memory_mb = out.free_memory_mb.saturating_sub(memory_mb);
        } else {
            out.free_milli = 0;
            out.free_memory_mb = 0;
        }
        out
    }

    /// Node `n` as the share model sees it, only the GPUs in `usable` free.
    pub(crate) fn share_node(&self, n: usize, usable: &[usize]) -> ShareNode {
        let nw = &self.nodes[n];
        let cpu = if nw.cpus_free.is_finite() {
            (nw.cpus_free * 1000.0).floor() as u64
        } else {
            u64::MAX / 4
        };
        ShareNode {
            name: nw.node.name.clone(),
            free_cpu_milli: cpu,
            free_memory_mib: nw.memory_free_mb.min(u64::MAX / 4),
            gpus: nw
                .gpus
                .clone()
                .map(|g| self.share_gpu(g, usable.contains(&g)))
                .collect(),
        }
    }

    /// The `commons` choice for `job` among `nodes` (node index, usable GPUs).
    pub(crate) fn choose_share(
        &self,
        job: &QueuedJob,
        nodes: &[(usize, Vec<usize>)],
    ) -> Option<ShareFit> {
        let views: Vec<ShareNode> = nodes.iter().map(|(n, u)| self.share_node(*n, u)).collect();
        let req = share_request(job);
        let tuning = ShareTuning::default();
        let p = place(&views, &req, SharePolicy::Commons, &self.share_mix, &tuning)?;
        let (i, milli, memory) = *p.gpus.first()?;
        let n = nodes[p.node].0;
        Some((n, self.nodes[n].gpus.start + i, milli, memory))
    }
}

/// What one node offers a guest's share: the GPUs it may use, or why none.
pub(crate) fn share_fit(world: &World, job: &QueuedJob, n: usize) -> Result<Vec<usize>, Verdict> {
    let nw = &world.nodes[n];
    let node = nw.node;
    if node.lab == job.lab {
        // The owner phase places shares on its own sharing nodes; here only say why not.
        return Err(if !node.schedulable {
            Verdict::Offline
        } else if nw.can_hold(job) && !node.lending.share_gpus {
            Verdict::NotLent(LendBlock::NoSharing)
        } else {
            Verdict::NoHardware
        });
    }
    if !nw.can_hold(job) {
        return Err(Verdict::NoHardware);
    }
    if !node.schedulable {
        return Err(Verdict::Offline);
    }
    if !node.lending.share_gpus {
        return Err(Verdict::NotLent(LendBlock::NoSharing));
    }
    if let Some(block) = guest_block(node, nw.lend_until, job, world.now) {
        return Err(Verdict::NotLent(block));
    }
    let (w, now, p) = (world, world.now, world.policy);
    if too_risky_after_take_back(nw.returns.as_ref(), job, now, p, w.pressure) {
        return Err(Verdict::ReturnRisk);
    }
    if !nw.capacity_free_for(job) {
        return Err(Verdict::Busy);
    }
    let ends = end_of(now, job);
    let idle_before = now.saturating_sub(nw.min_idle_s);
    // At the limit, a share may still join guests' shares on a GPU already lent (the
    // count stays); over it (the owner lowered the limit), nothing new is lent.
    let max = node.lending.max_lent_gpus;
    let lent_full = max.is_some_and(|max| nw.guest_gpus >= max);
    let over = max.is_some_and(|max| nw.guest_gpus > max);
    let (mut usable, mut claimed, mut idle, mut limit) = (Vec::new(), 0, 0, 0);
    let mut behind = None;
    for g in nw.gpus.clone() {
        let gw = &world.gpus[g];
        if gw.holder.is_some() || gw.gpu.local_use || !gpu_matches(job, gw.gpu) {
            continue;
        }
        if world.share_gpu(g, true).fits(&share_ask(job)).is_none() {
            continue;
        }
        if gw.claim.is_some() {
            claimed += 1;
        } else if gw.gpu.idle_since > idle_before {
            idle += 1;
        } else if over || (lent_full && gw.guest_shares() == 0) {
            limit += 1;
        } else if let Some(r) = gw.reserved.filter(|r| ends.is_none_or(|e| e > r.at)) {
            behind = behind.or(Some(r.job));
        } else {
            usable.push(g);
        }
    }
    if !usable.is_empty() {
        return Ok(usable);
    }
    Err(match behind {
        Some(j) => Verdict::Behind(j),
        None if claimed > 0 => Verdict::OwnerClaimed,
        None if idle > 0 => Verdict::IdleWait,
        None if limit > 0 => Verdict::LendLimit,
        None => Verdict::Busy,
    })
}

/// The share a job asks for, as the share model reads it.
pub(crate) fn share_ask(job: &QueuedJob) -> GpuAsk {
    let s = job.share.unwrap_or_default();
    GpuAsk::Share {
        milli: s.milli,
        memory_mb: s.memory_mb,
    }
}

/// The outcome of looking at every node for a guest's share.
pub(crate) struct ShareSearch {
    /// Where it goes, if it can start now.
    pub fit: Option<ShareFit>,
    /// The most hopeful refusal, with the node.
    pub best: Option<(Verdict, usize)>,
}

/// Look at every node for a guest's share.
///
/// 1. Every node offers the GPUs the share may use now ([`share_fit`]), or a verdict.
/// 2. The offering nodes are ranked as whole-GPU guests are ranked (return-risk class,
///    then datasets it would fetch); those of the lowest rank go to the `commons` rule.
/// 3. Refusals keep the most hopeful verdict, for the job's reason.
pub(crate) fn share_search(world: &World, job: &QueuedJob) -> ShareSearch {
    let mut offers: Vec<((u32, u32), usize, Vec<usize>)> = Vec::new();
    let mut best: Option<(Verdict, usize)> = None;
    for n in 0..world.nodes.len() {
        match share_fit(world, job, n) {
            Ok(gpus) => {
                offers.push((crate::placement::guest_class(world, n, job), n, gpus));
            }
            Err(v) => {
                if best.is_none_or(|(b, _)| v < b) {
                    best = Some((v, n));
                }
            }
        }
    }
    let Some(top) = offers.iter().map(|(k, _, _)| *k).min() else {
        return ShareSearch { fit: None, best };
    };
    let nodes: Vec<(usize, Vec<usize>)> = offers
        .into_iter()
        .filter(|(k, _, _)| *k == top)
        .map(|(_, n, g)| (n, g))
        .collect();
    ShareSearch {
        fit: world.choose_share(job, &nodes),
        best,
    }
}
