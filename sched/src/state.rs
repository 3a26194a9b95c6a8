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
pub(crate) use crate::request::{boost_tier, describe_request, gpu_matches};
use crate::request::{shape, Shape};

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
    pub holder: Option<usize>,
    pub claim: Option<Claim>,
    pub reserved: Option<Reservation>,
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
    pub started_at: Time,
    pub time_limit_s: i64,
    pub last_checkpoint_at: Option<Time>,
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

    /// GPU-seconds a preemption now would throw away.
    pub fn lost_work(&self, now: Time) -> i64 {
        let since = self
            .last_checkpoint_at
            .unwrap_or(self.started_at)
            .max(self.started_at);
        now.saturating_sub(since)
            .max(0)
            .saturating_mul(i64::from(self.gpu_count))
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
        f64::from(self.gpu_count) * left as f64 / 3600.0
    }
}

/// What a lab or member holds now, for quotas and fair share.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Use {
    pub gpus: u32,
    pub committed_gpu_hours: f64,
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
}

/// Dense slots for labs and (lab, user) pairs, handed out in id order.
#[derive(Default)]
struct Slots {
    labs: BTreeMap<LabId, usize>,
    members: BTreeMap<(LabId, UserId), usize>,
}

impl Slots {
    fn lab(&mut self, lab: LabId) -> usize {
        let next = self.labs.len();
        *self.labs.entry(lab).or_insert(next)
    }
    fn member(&mut self, lab: LabId, user: UserId) -> usize {
        let next = self.members.len();
        *self.members.entry((lab, user)).or_insert(next)
    }
}

impl<'a> World<'a> {
    /// Read the snapshot.
    ///
    /// 1. Nodes and their GPUs in id order; GPU kinds per node; lending end per node.
    /// 2. Labs and members get dense slots, with decayed ledgers and shares at `now`.
    /// 3. Running jobs take their GPUs (first holder wins) and fill the quota tallies.
    /// 4. The queue, in id order, gets slots and interned shapes.
    pub fn new(snapshot: &'a Snapshot, policy: &'a Policy, now: Time) -> Self {
        let mut order: Vec<&Node> = snapshot.nodes.iter().collect();
        order.sort_by_key(|n| n.id);
        order.dedup_by_key(|n| n.id);
        let mut nodes = Vec::with_capacity(order.len());
        let mut gpus = Vec::new();
        let mut gpu_index: BTreeMap<GpuId, usize> = BTreeMap::new();
        let mut node_index: BTreeMap<NodeId, usize> = BTreeMap::new();
        for node in order {
            let idx = nodes.len();
            let mut own: Vec<&Gpu> = node.gpus.iter().collect();
            own.sort_by_key(|g| g.id);
            let first = gpus.len();
            let mut kinds: Vec<(&Gpu, u32)> = Vec::new();
            for gpu in own {
                let same = |k: &&Gpu| {
                    k.model == gpu.model
                        && k.memory_mb == gpu.memory_mb
                        && k.mig_profile == gpu.mig_profile
                };
                match kinds.iter_mut().find(|(k, _)| same(k)) {
                    Some((_, c)) => *c += 1,
                    None => kinds.push((gpu, 1)),
                }
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
            let grace_s = if node.grace_s > 0 {
                node.grace_s
            } else {
                policy.default_grace_s
            };
            let returns = crate::risk::Returns::new(node);
            let min_idle_s = crate::risk::min_idle_s(node, returns.as_ref(), now, policy);
            nodes.push(NodeW {
                returns,
                min_idle_s,
                node,
                gpus: first..gpus.len(),
                lend_until: node.lending.lend_until(now, policy.utc_offset_s),
                grace_s,
                guest_gpus: 0,
                free: 0,
                changes: 0,
                kinds,
                cpus_free: if node.cpus > 0.0 {
                    node.cpus
                } else {
                    f64::INFINITY
                },
                memory_free_mb: if node.memory_mb > 0 {
                    node.memory_mb
                } else {
                    u64::MAX
                },
            });
        }
        let running_ids: std::collections::BTreeSet<JobId> =
            snapshot.running.iter().map(|r| r.id).collect();
        let mut queue: Vec<&QueuedJob> = snapshot
            .queue
            .iter()
            .filter(|j| !running_ids.contains(&j.id))
            .collect();
        queue.sort_by_key(|j| j.id);
        queue.dedup_by_key(|j| j.id);
        let boosting: std::collections::BTreeSet<LabId> = snapshot
            .labs
            .iter()
            .filter(|l| l.interactive_boost)
            .map(|l| l.id)
            .collect();
        let mut running: Vec<&RunningJob> = snapshot.running.iter().collect();
        running.sort_by_key(|r| r.id);

        let mut slots = Slots::default();
        let lab_ids = snapshot.labs.iter().map(|l| l.id);
        let lab_ids = lab_ids.chain(nodes.iter().map(|n| n.node.lab));
        let lab_ids = lab_ids.chain(running.iter().map(|r| r.lab));
        for lab in lab_ids
            .chain(queue.iter().map(|q| q.lab))
            .collect::<std::collections::BTreeSet<_>>()
        {
            slots.lab(lab);
        }
        let pairs = snapshot.members.iter().map(|m| (m.lab, m.user));
        let pairs = pairs.chain(running.iter().map(|r| (r.lab, r.user)));
        for (lab, user) in pairs
            .chain(queue.iter().map(|q| (q.lab, q.user)))
            .collect::<std::collections::BTreeSet<_>>()
        {
            slots.member(lab, user);
        }
        let lab_info: BTreeMap<LabId, &LabInfo> = snapshot.labs.iter().map(|l| (l.id, l)).collect();
        let member_info: BTreeMap<(LabId, UserId), &MemberInfo> = snapshot
            .members
            .iter()
            .map(|m| ((m.lab, m.user), m))
            .collect();
        let decay = |v: f64, at: Time| crate::decay(v, at, now, policy.half_life_s).max(0.0);
        let mut labs: Vec<LabW> = slots
            .labs
            .keys()
            .map(|&id| {
                let info = lab_info.get(&id).copied();
                let base = info
                    .and_then(|i| i.base_share_gpu_hours)
                    .unwrap_or(policy.base_share_gpu_hours);
                LabW {
                    info,
                    usage: info.map_or(0.0, |i| decay(i.used_gpu_hours, i.ledger_at)),
                    share: (base + info.map_or(0.0, |i| decay(i.lent_gpu_hours, i.ledger_at)))
                        .max(1e-9),
                    nodes: Vec::new(),
                }
            })
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            labs[slots.labs[&n.node.lab]].nodes.push(i);
        }
        let members: Vec<MemberW> = slots
            .members
            .keys()
            .map(|key| {
                let info = member_info.get(key).copied();
                MemberW {
                    info,
                    usage: info.map_or(0.0, |m| decay(m.used_gpu_hours, m.ledger_at)),
                }
            })
            .collect();

        // Interning only looks up (never iterates), and ids follow id order, so a hash
        // map keeps the plan deterministic. Each job is read once, in id order (the
        // snapshot's, so memory is read in sequence), and its metadata travels with it
        // through the sort.
        let mut shape_ids: std::collections::HashMap<Shape, usize> = Default::default();
        let mut last: Option<((LabId, UserId), (usize, usize))> = None;
        let mut keys = Vec::with_capacity(queue.len());
        let mut metas: Vec<Option<JobMeta>> = queue
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let next = shape_ids.len();
                let (lab, member) = match last {
                    Some((key, slots)) if key == (q.lab, q.user) => slots,
                    _ => {
                        let found = (slots.labs[&q.lab], slots.members[&(q.lab, q.user)]);
                        last = Some(((q.lab, q.user), found));
                        found
                    }
                };
                let tier = boost_tier(q, boosting.contains(&q.lab));
                let meta = JobMeta {
                    id: q.id,
                    lab,
                    member,
                    shape: *shape_ids.entry(shape(q, policy, now)).or_insert(next),
                    gpus: q.gpus,
                    ask: crate::quota::Ask::of(q),
                    tier,
                };
                keys.push(((q.lab, q.user, tier, q.submitted_at, q.id), i));
                Some(meta)
            })
            .collect();
        // Fair-share order groups jobs by lab and member, boosted jobs first, then first
        // come; storing the queue that way lets every round walk it front to back. The
        // keys are unique (ids are), so an unstable sort gives a stable sort's order.
        keys.sort_unstable_by_key(|&(key, _)| key);
        let (queue, meta): (Vec<&QueuedJob>, Vec<JobMeta>) = keys
            .into_iter()
            .filter_map(|(_, i)| Some((queue[i], metas[i].take()?)))
            .unzip();
        let mut world = World {
            now,
            policy,
            nodes,
            gpus,
            running: Vec::with_capacity(snapshot.running.len()),
            queue,
            meta,
            shapes: shape_ids.len(),
            lab_use: vec![Use::default(); labs.len()],
            member_use: vec![Use::default(); members.len()],
            labs,
            members,
            free_total: 0,
        };
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
                lab: slots.labs[&r.lab],
                member: slots.members[&(r.lab, r.user)],
                node,
                gpus: held,
                gpu_count: u32::try_from(r.gpus.len()).unwrap_or(u32::MAX),
                started_at: r.started_at,
                time_limit_s: r.time_limit_s,
                last_checkpoint_at: r.last_checkpoint_at,
                preempting: r.preempting,
                new: false,
                guest: owner_lab.is_some_and(|l| l != r.lab),
                cpus: r.cpus,
                memory_mb: r.memory_mb,
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
        if let Some(n) = run.node {
            let nw = &mut self.nodes[n];
            nw.cpus_free = (nw.cpus_free - run.cpus.max(0.0)).max(0.0);
            nw.memory_free_mb = nw.memory_free_mb.saturating_sub(run.memory_mb);
        }
        if run.guest {
            if let Some(n) = run.node {
                self.nodes[n].guest_gpus += run.gpu_count;
            }
            let u = &mut self.lab_use[run.lab];
            u.gpus += run.gpu_count;
            u.committed_gpu_hours += run.committed_gpu_hours(self.now);
        }
        let u = &mut self.member_use[run.member];
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
            gpus,
            started_at: self.now,
            time_limit_s: job.time_limit_s,
            last_checkpoint_at: None,
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
        }
    }

    /// Tell a guest to stop; its GPUs stay held (and counted) until it is gone.
    pub fn preempt(&mut self, run: usize, reason: String) -> Preempt {
        let r = &mut self.running[run];
        r.preempting = true;
        if let Some(n) = r.node {
            self.nodes[n].changes = self.nodes[n].changes.wrapping_add(1);
        }
        let r = &self.running[run];
        let grace_s = r
            .node
            .map_or(self.policy.default_grace_s, |n| self.nodes[n].grace_s);
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
        let nw = &mut self.nodes[self.gpus[g].node];
        nw.changes = nw.changes.wrapping_add(1);
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
