//! The scheduler's working copy of the campus: GPUs with their holders, claims and
//! reservations, running jobs, and quota tallies, indexed for one plan.
//!
//! Invariants:
//! - Nodes are sorted by id and GPUs by (node, id); every index is stable for a plan.
//! - A GPU has at most one holder. A snapshot that names a GPU twice (or an unknown
//!   GPU) is read leniently: the first holder wins, unknown GPUs are ignored.
//! - Starts and preemptions are applied here as they are decided, so every later step
//!   sees them; claims and reservations are per round and reset by [`World::new_round`].

use std::collections::BTreeMap;
use std::ops::Range;

use crate::model::*;
use crate::policy::Policy;

/// An owner job's hold on a GPU it waits for. Guests never use a claimed GPU; a later
/// job of the owner lab may if it ends by `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    /// When the owner job expects to start (`now` when it waits for preempted guests).
    pub until: Time,
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
    /// GPUs held by guests (running, preempting, or started in this plan).
    pub guest_gpus: u32,
    /// GPUs with no holder and no local use.
    pub free: u32,
}

pub(crate) struct GpuW<'a> {
    pub gpu: &'a Gpu,
    pub node: usize,
    pub holder: Option<usize>,
    pub claim: Option<Claim>,
    pub reserved: Option<Reservation>,
}

pub(crate) struct RunW {
    pub job: JobId,
    pub lab: LabId,
    pub user: UserId,
    pub node: Option<usize>,
    pub gpus: Vec<usize>,
    pub gpu_count: u32,
    pub started_at: Time,
    pub time_limit_s: i64,
    pub last_checkpoint_at: Option<Time>,
    pub preempting: bool,
    /// Started by this plan: never a victim in it (no start-then-preempt loops).
    pub new: bool,
    pub guest: bool,
}

impl RunW {
    /// When its GPUs are expected back, if known.
    pub fn expected_end(&self, now: Time, grace_s: u32) -> Option<Time> {
        if self.preempting {
            Some(now + i64::from(grace_s))
        } else if self.time_limit_s > 0 {
            Some((self.started_at + self.time_limit_s).max(now))
        } else {
            None
        }
    }

    /// GPU-seconds a preemption now would throw away.
    pub fn lost_work(&self, now: Time) -> i64 {
        let since = self.last_checkpoint_at.unwrap_or(self.started_at).max(self.started_at);
        (now - since).max(0) * i64::from(self.gpu_count)
    }

    /// GPU-hours still committed to it by its time limit.
    pub fn committed_gpu_hours(&self, now: Time) -> f64 {
        if self.time_limit_s <= 0 {
            return 0.0;
        }
        let left = (self.started_at + self.time_limit_s - now).max(0);
        f64::from(self.gpu_count) * left as f64 / 3600.0
    }
}

/// What a lab or member holds now, for quotas and fair share.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Use {
    pub gpus: u32,
    pub committed_gpu_hours: f64,
}

pub(crate) struct World<'a> {
    pub now: Time,
    pub policy: &'a Policy,
    pub nodes: Vec<NodeW<'a>>,
    pub gpus: Vec<GpuW<'a>>,
    pub running: Vec<RunW>,
    /// Indices of nodes per owner lab.
    pub lab_nodes: BTreeMap<LabId, Vec<usize>>,
    pub labs: BTreeMap<LabId, &'a LabInfo>,
    pub members: BTreeMap<(LabId, UserId), &'a MemberInfo>,
    /// What labs hold on other labs' nodes.
    pub lab_use: BTreeMap<LabId, Use>,
    /// What members hold, charged to a lab, anywhere.
    pub member_use: BTreeMap<(LabId, UserId), Use>,
    /// Free GPUs on schedulable nodes that nobody claimed: zero means nothing can start.
    pub free_total: u32,
}

impl<'a> World<'a> {
    pub fn new(snapshot: &'a Snapshot, policy: &'a Policy, now: Time) -> Self {
        let mut order: Vec<&Node> = snapshot.nodes.iter().collect();
        order.sort_by_key(|n| n.id);
        order.dedup_by_key(|n| n.id);
        let mut nodes = Vec::with_capacity(order.len());
        let mut gpus = Vec::new();
        let mut gpu_index: BTreeMap<GpuId, usize> = BTreeMap::new();
        let mut node_index: BTreeMap<NodeId, usize> = BTreeMap::new();
        let mut lab_nodes: BTreeMap<LabId, Vec<usize>> = BTreeMap::new();
        for node in order {
            let idx = nodes.len();
            let mut own: Vec<&Gpu> = node.gpus.iter().collect();
            own.sort_by_key(|g| g.id);
            let first = gpus.len();
            for gpu in own {
                if gpu_index.insert(gpu.id, gpus.len()).is_none() {
                    gpus.push(GpuW {
                        gpu,
                        node: idx,
                        holder: None,
                        claim: None,
                        reserved: None,
                    });
                }
            }
            node_index.insert(node.id, idx);
            lab_nodes.entry(node.lab).or_default().push(idx);
            let grace_s = if node.grace_s > 0 {
                node.grace_s
            } else {
                policy.default_grace_s
            };
            nodes.push(NodeW {
                node,
                gpus: first..gpus.len(),
                lend_until: node.lending.lend_until(now, policy.utc_offset_s),
                grace_s,
                guest_gpus: 0,
                free: 0,
            });
        }
        let mut world = World {
            now,
            policy,
            nodes,
            gpus,
            running: Vec::with_capacity(snapshot.running.len()),
            lab_nodes,
            labs: snapshot.labs.iter().map(|l| (l.id, l)).collect(),
            members: snapshot.members.iter().map(|m| ((m.lab, m.user), m)).collect(),
            lab_use: BTreeMap::new(),
            member_use: BTreeMap::new(),
            free_total: 0,
        };
        let mut running: Vec<&RunningJob> = snapshot.running.iter().collect();
        running.sort_by_key(|r| r.id);
        for r in running {
            let held: Vec<usize> = r
                .gpus
                .iter()
                .filter_map(|g| gpu_index.get(g).copied())
                .filter(|&g| world.gpus[g].holder.is_none())
                .collect();
            // The GPUs say where it really runs; the node id covers a job whose GPUs
            // are unknown.
            let node = held
                .first()
                .map(|&g| world.gpus[g].node)
                .or_else(|| node_index.get(&r.node).copied());
            let owner_lab = node.map(|n| world.nodes[n].node.lab);
            world.add_running(RunW {
                job: r.id,
                lab: r.lab,
                user: r.user,
                node,
                gpus: held,
                gpu_count: u32::try_from(r.gpus.len()).unwrap_or(u32::MAX),
                started_at: r.started_at,
                time_limit_s: r.time_limit_s,
                last_checkpoint_at: r.last_checkpoint_at,
                preempting: r.preempting,
                new: false,
                guest: owner_lab.is_some_and(|l| l != r.lab),
            });
        }
        for g in 0..world.gpus.len() {
            let gw = &world.gpus[g];
            if gw.holder.is_none() && !gw.gpu.local_use {
                world.nodes[gw.node].free += 1;
            }
        }
        world
    }

    fn add_running(&mut self, run: RunW) -> usize {
        let idx = self.running.len();
        for &g in &run.gpus {
            self.gpus[g].holder = Some(idx);
        }
        if run.guest {
            if let Some(n) = run.node {
                self.nodes[n].guest_gpus += run.gpu_count;
            }
            let u = self.lab_use.entry(run.lab).or_default();
            u.gpus += run.gpu_count;
            u.committed_gpu_hours += run.committed_gpu_hours(self.now);
        }
        let u = self.member_use.entry((run.lab, run.user)).or_default();
        u.gpus += run.gpu_count;
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
        self.free_total = self
            .nodes
            .iter()
            .filter(|n| n.node.schedulable)
            .map(|n| n.free)
            .sum();
    }

    /// Start `job` on `gpus` (indices, all on `node`) and book it everywhere.
    pub fn start(&mut self, job: &QueuedJob, node: usize, gpus: Vec<usize>) -> Start {
        let guest = self.nodes[node].node.lab != job.lab;
        let mut ids: Vec<GpuId> = gpus.iter().map(|&g| self.gpus[g].gpu.id).collect();
        ids.sort_unstable();
        for &g in &gpus {
            if self.gpus[g].claim.is_none() && self.nodes[node].node.schedulable {
                self.free_total -= 1;
            }
        }
        self.nodes[node].free -= u32::try_from(gpus.len()).unwrap_or(u32::MAX);
        self.add_running(RunW {
            job: job.id,
            lab: job.lab,
            user: job.user,
            node: Some(node),
            gpu_count: job.gpus,
            gpus,
            started_at: self.now,
            time_limit_s: job.time_limit_s,
            last_checkpoint_at: None,
            preempting: false,
            new: true,
            guest,
        });
        Start {
            job: job.id,
            node: self.nodes[node].node.id,
            gpus: ids,
        }
    }

    /// Tell a guest to stop; its GPUs stay held (and counted) until it is gone.
    pub fn preempt(&mut self, run: usize, reason: String) -> Preempt {
        let r = &mut self.running[run];
        r.preempting = true;
        let grace_s = r.node.map_or(self.policy.default_grace_s, |n| self.nodes[n].grace_s);
        Preempt {
            job: r.job,
            grace_s,
            reason,
        }
    }

    /// Claim a GPU for a waiting owner job.
    pub fn claim(&mut self, g: usize, until: Time) {
        let gw = &mut self.gpus[g];
        if gw.claim.is_none()
            && gw.holder.is_none()
            && !gw.gpu.local_use
            && self.nodes[gw.node].node.schedulable
        {
            self.free_total -= 1;
        }
        let gw = &mut self.gpus[g];
        gw.claim = Some(Claim {
            until: gw.claim.map_or(until, |c| c.until.min(until)),
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

/// Whether a GPU is of the kind the job asks for (model, memory, MIG profile).
pub(crate) fn gpu_matches(job: &QueuedJob, gpu: &Gpu) -> bool {
    gpu.memory_mb >= job.min_memory_mb
        && gpu.mig_profile.as_deref() == job.mig_profile.as_deref()
        && (job.models.is_empty() || job.models.iter().any(|m| *m == gpu.model))
}

/// "model A100 or H100, with at least 80 GB": what the job asks for, for reasons.
pub(crate) fn describe_request(job: &QueuedJob) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &job.mig_profile {
        parts.push(format!("MIG {p}"));
    }
    if !job.models.is_empty() {
        parts.push(format!("model {}", job.models.join(" or ")));
    }
    if job.min_memory_mb > 0 {
        parts.push(format!("with at least {} GB", job.min_memory_mb.div_ceil(1024)));
    }
    if parts.is_empty() {
        parts.push("of any model".into());
    }
    parts.join(", ")
}
