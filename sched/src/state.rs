//! The scheduler's working copy of the campus: GPUs with their holders, claims and
//! reservations, running jobs, and quota tallies, indexed for one plan.
//!
//! Invariants:
//! - Nodes are sorted by id and GPUs by (node, id); every index is stable for a plan.
//! - A GPU has at most one holder, or else any number of shares (see `sharing`), never
//!   both. A snapshot that names a GPU twice (or an unknown GPU) is read leniently: the
//!   first holder wins, unknown GPUs are ignored.
//! - Starts and preemptions are applied here as they are decided, so every later step
//!   sees them; claims and reservations are per round and reset by [`World::new_round`].

use std::ops::Range;

use crate::model::*;
use crate::policy::Policy;
pub(crate) use crate::request::{describe_request, gpu_matches};

/// An owner job's hold on a GPU it waits for. Guests never use a claimed GPU; a later
/// job of the owner lab may if it ends by `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    /// When the owner job expects to start (`now` when it waits for preempted guests).
    pub until: Time,
    /// Made by a waiting share job of the owner lab: other share jobs of the lab may
    /// still use the GPU (see `owner_share`).
    pub share: bool,
}

/// A guest job's reservation of a GPU for its earliest start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reservation {
    /// The expected start; only jobs that end by then may use the GPU before.
    pub at: Time,
    /// The job that reserved it.
    pub job: JobId,
}

pub(crate) struct NodeW<'a> {
    pub node: &'a Node,
    pub gpus: Range<usize>,
    /// See [`crate::Lending::lend_until`].
    pub lend_until: Option<Time>,
    pub grace_s: u32,
    /// GPUs held by guests (running, preempting, or started in this plan), a GPU that
    /// carries any guest share counted once.
    pub guest_gpus: u32,
    /// GPUs with no holder, no share and no local use.
    pub free: u32,
    /// Distinct kinds of GPU on the node (model, memory, MIG profile) with their
    /// counts, so hardware checks compare a kind once instead of every GPU.
    pub kinds: Vec<(&'a Gpu, u32)>,
    /// The owner's return rates, if the caller gave any (see `risk`).
    pub returns: Option<crate::risk::Returns>,
    /// Seconds a free GPU must have been free of owner work before it is lent: the
    /// lending rule or the re-lending hysteresis ([`crate::risk::min_idle_s`]).
    pub min_idle_s: i64,
    /// CPUs not given to running jobs (infinite when the node's capacity is unknown).
    pub cpus_free: f64,
    /// Memory in MiB not given to running jobs (`u64::MAX` when unknown).
    pub memory_free_mb: u64,
    /// Bumped by every start, preemption and claim on the node and by a new round, so
    /// a result computed from the node's state can tell whether it still holds.
    pub changes: u32,
}

impl NodeW<'_> {
    /// Whether the node has enough GPUs of the kind `job` asks for, busy or not.
    pub fn can_hold(&self, job: &QueuedJob) -> bool {
        job.gpus > 0
            && self
                .kinds
                .iter()
                .filter(|(g, _)| gpu_matches(job, g))
                .map(|(_, c)| c)
                .sum::<u32>()
                >= job.gpus
            && self.has_capacity_for(job)
            && self.exports_all(job)
    }

    /// Whether the server provides every exported dataset the job needs.
    pub fn exports_all(&self, job: &QueuedJob) -> bool {
        job.needs_exports
            .iter()
            .all(|d| self.node.exports.contains(d))
    }

    /// How many of the job's datasets the server would have to fetch.
    pub fn uncached(&self, job: &QueuedJob) -> usize {
        job.datasets
            .iter()
            .filter(|d| !self.node.cached.contains(d))
            .count()
    }

    /// Whether the server has the CPUs, memory and disk the job asks for at all, busy or
    /// not.
    pub fn has_capacity_for(&self, job: &QueuedJob) -> bool {
        self.has_cpus_and_memory_for(job) && self.gives_disk_for(job)
    }

    pub fn has_cpus_and_memory_for(&self, job: &QueuedJob) -> bool {
        let n = self.node;
        (n.cpus <= 0.0 || job.cpus <= n.cpus + CPU_SLACK)
            && (n.memory_mb == 0 || job.memory_mb <= n.memory_mb)
    }

    /// Whether the server's agent gives one job as much disk as it asks for.
    pub fn gives_disk_for(&self, job: &QueuedJob) -> bool {
        self.node.max_job_disk_gb == 0 || job.disk_gb <= self.node.max_job_disk_gb
    }

    /// Whether the CPUs and memory the job asks for are free now.
    pub fn capacity_free_for(&self, job: &QueuedJob) -> bool {
        job.cpus <= self.cpus_free + CPU_SLACK && job.memory_mb <= self.memory_free_mb
    }
}

/// Rounding room when comparing CPU counts (fractions of CPUs add up inexactly).
const CPU_SLACK: f64 = 1e-6;

pub(crate) struct GpuW<'a> {
    pub gpu: &'a Gpu,
    pub node: usize,
    /// The running job that holds it whole.
    pub holder: Option<usize>,
    pub claim: Option<Claim>,
    pub reserved: Option<Reservation>,
    /// Its shares, if it carries any (`None` when `holder` is set). Boxed: most GPUs
    /// carry none, and the planner's hot loops walk every GPU.
    pub shared: Option<Box<Shared>>,
}

/// The shares on one GPU.
#[derive(Default)]
pub(crate) struct Shared {
    /// Running jobs (indices) that hold a share of it.
    pub runs: Vec<usize>,
    /// Compute they hold together, in milli-GPU.
    pub milli: u32,
    /// Memory they hold together, in MiB.
    pub memory_mb: u64,
    /// How many of them are guests (it counts as lent while any is).
    pub guests: u32,
}

impl GpuW<'_> {
    /// Nobody holds it, whole or in part (it may still be in local use or claimed).
    pub fn is_empty(&self) -> bool {
        self.holder.is_none() && self.shared.is_none()
    }

    /// The running jobs that hold shares of it.
    pub fn shares(&self) -> &[usize] {
        self.shared.as_deref().map_or(&[], |s| &s.runs)
    }

    /// Compute (milli-GPU) and memory (MiB) its shares hold.
    pub fn share_used(&self) -> (u32, u64) {
        self.shared
            .as_deref()
            .map_or((0, 0), |s| (s.milli, s.memory_mb))
    }

    /// How many of its shares are guests'.
    pub fn guest_shares(&self) -> u32 {
        self.shared.as_deref().map_or(0, |s| s.guests)
    }
}

pub(crate) struct RunW {
    pub job: JobId,
    /// Slot of the job's lab in the world's lab tables.
    pub lab: usize,
    /// Slot of the (lab, user) pair in the world's member tables.
    pub member: usize,
    pub node: Option<usize>,
    pub gpus: Vec<usize>,
    pub gpu_count: u32,
    /// What it holds in milli-GPU: 1000 per whole GPU, or its share's compute. Quotas,
    /// fair share, GPU-hours and lost work count this.
    pub milli: u64,
    /// The share it holds on its one GPU, if it runs on a share.
    pub share: Option<GpuShare>,
    pub started_at: Time,
    pub time_limit_s: i64,
    pub last_checkpoint_at: Option<Time>,
    /// See [`RunningJob::checkpoint_write_s`].
    pub checkpoint_write_s: Option<i64>,
    pub preempting: bool,
    /// Started by this plan: never a victim in it (no start-then-preempt loops).
    pub new: bool,
    pub guest: bool,
    pub cpus: f64,
    pub memory_mb: u64,
}

impl RunW {
    /// When its GPUs are expected back, if known.
    pub fn expected_end(&self, now: Time, grace_s: u32) -> Option<Time> {
        if self.preempting {
            Some(now.saturating_add(i64::from(grace_s)))
        } else if self.time_limit_s > 0 {
            Some(self.started_at.saturating_add(self.time_limit_s).max(now))
        } else {
            None
        }
    }

    /// The grace period it gets when it is preempted on a node of `node_grace`
    /// seconds: longer when its latest checkpoint took longer than that to write and
    /// [`Policy::grace_covers_checkpoint_s`] allows a grace that covers it (a quarter
    /// more than the write, at most that limit), and at most `extra` seconds longer
    /// (the owner job's [`Policy::owner_delay_share`]).
    pub fn grace_s(&self, node_grace: u32, policy: &Policy, extra: Option<u32>) -> u32 {
        let cap = policy.grace_covers_checkpoint_s;
        let cap = extra.map_or(cap, |e| cap.min(node_grace.saturating_add(e)));
        match self.checkpoint_write_s {
            Some(w) if w > i64::from(node_grace) && w <= i64::from(cap) => {
                let wanted = w.saturating_add((w + 3) / 4).min(i64::from(cap));
                u32::try_from(wanted).unwrap_or(cap).max(node_grace)
            }
            _ => node_grace,
        }
    }

    /// Whether it is expected to save all its work when told to stop on a node of
    /// `node_grace` seconds, its grace at most `extra` seconds longer: its latest
    /// checkpoint took no longer than its grace period to write
    /// ([`Policy::victims_save_aware`] only).
    pub fn saves_on_stop(&self, node_grace: u32, policy: &Policy, extra: Option<u32>) -> bool {
        policy.victims_save_aware
            && self
                .checkpoint_write_s
                .is_some_and(|w| w <= i64::from(self.grace_s(node_grace, policy, extra)))
    }

    /// GPU-seconds a preemption now would throw away.
    pub fn lost_work(&self, now: Time) -> i64 {
        let since = self
            .last_checkpoint_at
            .unwrap_or(self.started_at)
            .max(self.started_at);
        let seconds = now.saturating_sub(since).max(0);
        if self.share.is_none() {
            return seconds.saturating_mul(i64::from(self.gpu_count));
        }
        seconds.saturating_mul(self.milli_i64()) / 1000
    }

    /// [`RunW::milli`] as an `i64`.
    pub fn milli_i64(&self) -> i64 {
        i64::try_from(self.milli).unwrap_or(i64::MAX)
    }

    /// The GPUs it holds, a share counting as its fraction.
    pub fn gpus_held(&self) -> f64 {
        self.milli as f64 / 1000.0
    }

    /// GPU-hours still committed to it by its time limit.
    pub fn committed_gpu_hours(&self, now: Time) -> f64 {
        if self.time_limit_s <= 0 {
            return 0.0;
        }
        let left = self
            .started_at
            .saturating_add(self.time_limit_s)
            .saturating_sub(now)
            .max(0);
        self.gpus_held() * left as f64 / 3600.0
    }
}

/// What a lab or member holds now, for quotas and fair share.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Use {
    /// GPUs held, in milli-GPU (a share counts as its fraction).
    pub milli: u64,
    pub committed_gpu_hours: f64,
}

impl Use {
    /// GPUs held, a share counting as its fraction.
    pub fn gpus(&self) -> f64 {
        self.milli as f64 / 1000.0
    }
}

/// What a plan needs to know about a queued job that does not change between rounds.
pub(crate) struct JobMeta {
    /// The job's id (copied, like `gpus` and `ask`).
    pub id: JobId,
    /// Lab slot.
    pub lab: usize,
    /// Member slot.
    pub member: usize,
    /// Identical requests (lab, GPUs, models, memory, MIG profile, time limit) share a
    /// shape, and so share search results.
    pub shape: usize,
    /// GPUs asked for (copied: the hot loop should not chase the job's pointer).
    pub gpus: u32,
    /// Whether it asks for a share of one GPU ([`QueuedJob::share`]).
    pub share: bool,
    /// GPUs and time limit for the quota checks (copied for the same reason).
    pub ask: crate::quota::Ask,
    /// 0 for an interactive job of a lab with [`LabInfo::interactive_boost`], else 1:
    /// inside a lab, jobs go by tier first (see `boost_tier`).
    pub tier: u8,
}

/// A lab's fixed data for one plan.
pub(crate) struct LabW<'a> {
    pub info: Option<&'a LabInfo>,
    /// Decayed usage (GPU-hours) at `now`.
    pub usage: f64,
    /// Base share plus decayed contribution (GPU-hours) at `now`.
    pub share: f64,
    /// Owner nodes (indices).
    pub nodes: Vec<usize>,
}

/// A member's fixed data for one plan.
pub(crate) struct MemberW<'a> {
    pub info: Option<&'a MemberInfo>,
    /// Decayed usage (GPU-hours) at `now`.
    pub usage: f64,
}

pub(crate) struct World<'a> {
    pub now: Time,
    pub policy: &'a Policy,
    pub nodes: Vec<NodeW<'a>>,
    pub gpus: Vec<GpuW<'a>>,
    pub running: Vec<RunW>,
    /// The queue without duplicates or jobs that already run, ordered by (lab, user,
    /// submitted_at, id).
    pub queue: Vec<&'a QueuedJob>,
    /// Per queued job, same order as `queue`.
    pub meta: Vec<JobMeta>,
    /// Number of distinct shapes in the queue.
    pub shapes: usize,
    pub labs: Vec<LabW<'a>>,
    pub members: Vec<MemberW<'a>>,
    /// What labs hold on other labs' nodes, by lab slot.
    pub lab_use: Vec<Use>,
    /// What members hold, charged to a lab, anywhere, by member slot.
    pub member_use: Vec<Use>,
    /// Free GPUs on schedulable nodes that nobody claimed: zero means nothing can start.
    pub free_total: u32,
    /// Queue pressure at the snapshot, 0 to 1 ([`crate::risk::pressure`]).
    pub pressure: f64,
    /// The recent mix of waiting GPU requests that shares are placed against (empty when
    /// no job asks for a share), see [`crate::sharing::waiting_mix`].
    pub share_mix: crate::share::ShapeMix,
}

impl<'a> World<'a> {
    pub(crate) fn add_running(&mut self, run: RunW) -> usize {
        let idx = self.running.len();
        if let Some(share) = run.share {
            self.book_share(idx, &run, share);
        } else {
            for &g in &run.gpus {
                self.gpus[g].holder = Some(idx);
            }
        }
        if let Some(n) = run.node {
            let nw = &mut self.nodes[n];
            nw.cpus_free = (nw.cpus_free - run.cpus.max(0.0)).max(0.0);
            nw.memory_free_mb = nw.memory_free_mb.saturating_sub(run.memory_mb);
        }
        if run.guest {
            if let (Some(n), None) = (run.node, run.share) {
                self.nodes[n].guest_gpus += run.gpu_count;
            }
            let u = &mut self.lab_use[run.lab];
            u.milli += run.milli;
            u.committed_gpu_hours += run.committed_gpu_hours(self.now);
        }
        let u = &mut self.member_use[run.member];
        u.milli += run.milli;
        u.committed_gpu_hours += run.committed_gpu_hours(self.now);
        self.running.push(run);
        idx
    }

    /// Forget the claims and reservations of the previous round and recount the GPUs
    /// anyone could get.
    pub fn new_round(&mut self) {
        for g in &mut self.gpus {
            g.claim = None;
            g.reserved = None;
        }
        for n in &mut self.nodes {
            n.changes = n.changes.wrapping_add(1);
        }
        self.free_total = self
            .nodes
            .iter()
            .filter(|n| n.node.schedulable)
            .map(|n| n.free)
            .sum();
    }

    /// Start queued job `j` on `gpus` (indices, all on `node`) and book it everywhere.
    pub fn start(&mut self, j: usize, node: usize, gpus: Vec<usize>) -> Start {
        let job = self.queue[j];
        let guest = self.nodes[node].node.lab != job.lab;
        let mut ids: Vec<GpuId> = gpus.iter().map(|&g| self.gpus[g].gpu.id).collect();
        ids.sort_unstable();
        for &g in &gpus {
            if self.gpus[g].claim.is_none() && self.nodes[node].node.schedulable {
                self.free_total -= 1;
            }
        }
        self.nodes[node].free -= u32::try_from(gpus.len()).unwrap_or(u32::MAX);
        self.nodes[node].changes = self.nodes[node].changes.wrapping_add(1);
        self.add_running(RunW {
            job: job.id,
            lab: self.meta[j].lab,
            member: self.meta[j].member,
            node: Some(node),
            gpu_count: job.gpus,
            milli: u64::from(job.gpus) * 1000,
            share: None,
            gpus,
            started_at: self.now,
            time_limit_s: job.time_limit_s,
            last_checkpoint_at: None,
            checkpoint_write_s: None,
            preempting: false,
            new: true,
            guest,
            cpus: job.cpus,
            memory_mb: job.memory_mb,
        });
        Start {
            job: job.id,
            node: self.nodes[node].node.id,
            gpus: ids,
            share: None,
        }
    }

    /// Tell a guest to stop; its GPUs stay held (and counted) until it is gone. `extra`:
    /// the most its grace may exceed the node's (see [`RunW::grace_s`]).
    pub fn preempt(&mut self, run: usize, reason: String, extra: Option<u32>) -> Preempt {
        let r = &mut self.running[run];
        r.preempting = true;
        if let Some(n) = r.node {
            self.nodes[n].changes = self.nodes[n].changes.wrapping_add(1);
        }
        let r = &self.running[run];
        let node_grace = r
            .node
            .map_or(self.policy.default_grace_s, |n| self.nodes[n].grace_s);
        let grace_s = r.grace_s(node_grace, self.policy, extra);
        Preempt {
            job: r.job,
            grace_s,
            reason,
        }
    }

    /// Claim a GPU for a waiting owner job (`share`: a share job, see [`Claim::share`]).
    pub fn claim(&mut self, g: usize, until: Time, share: bool) {
        let gw = &mut self.gpus[g];
        if gw.claim.is_none()
            && gw.is_empty()
            && !gw.gpu.local_use
            && self.nodes[gw.node].node.schedulable
        {
            self.free_total -= 1;
        }
        let nw = &mut self.nodes[self.gpus[g].node];
        nw.changes = nw.changes.wrapping_add(1);
        let gw = &mut self.gpus[g];
        gw.claim = Some(match gw.claim {
            None => Claim { until, share },
            Some(c) => Claim {
                until: c.until.min(until),
                share: c.share && share,
            },
        });
    }

    /// The node's name for researchers.
    pub fn node_name(&self, node: usize) -> String {
        let n = self.nodes[node].node;
        if n.name.is_empty() {
            format!("#{}", n.id)
        } else {
            n.name.clone()
        }
    }
}
