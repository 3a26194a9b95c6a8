//! Reading a snapshot into the planner's [`World`], in four steps:
//!
//! 1. Nodes and their GPUs in id order; GPU kinds per node; lending end per node.
//! 2. Labs and members get dense slots, with decayed ledgers and shares at `now`.
//! 3. The queue, in id order, gets slots and interned shapes, then fair-share order.
//! 4. Running jobs take their GPUs (first holder wins) and fill the quota tallies.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};

use crate::model::*;
use crate::policy::Policy;
use crate::request::{boost_tier, shape, Shape};
use crate::state::{GpuW, JobMeta, LabW, MemberW, NodeW, RunW, Use, World};

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

/// The nodes and GPUs of a snapshot, and where each id went.
struct Hardware<'a> {
    nodes: Vec<NodeW<'a>>,
    gpus: Vec<GpuW<'a>>,
    /// Looked up only (never iterated), so hashing keeps the plan deterministic.
    gpu_index: FxHashMap<GpuId, usize>,
    node_index: FxHashMap<NodeId, usize>,
}

impl<'a> World<'a> {
    /// Reads the snapshot (see the module's steps).
    pub fn new(snapshot: &'a Snapshot, policy: &'a Policy, now: Time) -> Self {
        let pressure = crate::risk::pressure(snapshot);
        let hw = hardware(snapshot, policy, now, pressure);
        let running_ids: FxHashSet<JobId> = snapshot.running.iter().map(|r| r.id).collect();
        let mut queue: Vec<&QueuedJob> = snapshot
            .queue
            .iter()
            .filter(|j| !running_ids.contains(&j.id))
            .collect();
        queue.sort_by_key(|j| j.id);
        queue.dedup_by_key(|j| j.id);
        let mut running: Vec<&RunningJob> = snapshot.running.iter().collect();
        running.sort_by_key(|r| r.id);
        let slots = dense_slots(snapshot, &hw.nodes, &running, &queue);
        let share_mix = crate::sharing::waiting_mix(&queue);
        let (labs, members) = ledgers(snapshot, &slots, &hw.nodes, policy, now);
        let (queue, meta, shapes) = fair_share_order(snapshot, queue, &slots, policy, now);
        let mut world = World {
            now,
            policy,
            nodes: hw.nodes,
            gpus: hw.gpus,
            running: Vec::with_capacity(snapshot.running.len()),
            queue,
            meta,
            shapes,
            lab_use: vec![Use::default(); labs.len()],
            member_use: vec![Use::default(); members.len()],
            labs,
            members,
            free_total: 0,
            pressure,
            share_mix,
        };
        for r in running {
            world.place_running(r, &hw.gpu_index, &hw.node_index, &slots);
        }
        for g in 0..world.gpus.len() {
            let gw = &world.gpus[g];
            if gw.is_empty() && !gw.gpu.local_use {
                world.nodes[gw.node].free += 1;
            }
        }
        world
    }

    /// A running job takes its GPUs (those no one took before it) and fills the tallies.
    fn place_running(
        &mut self,
        r: &RunningJob,
        gpu_index: &FxHashMap<GpuId, usize>,
        node_index: &FxHashMap<NodeId, usize>,
        slots: &Slots,
    ) {
        // A share keeps its one GPU unless someone holds it whole; whole GPUs only those
        // nobody holds in any way.
        let mut held: Vec<usize> = r
            .gpus
            .iter()
            .filter_map(|g| gpu_index.get(g).copied())
            .filter(|&g| match r.share {
                Some(_) => self.gpus[g].holder.is_none(),
                None => self.gpus[g].is_empty(),
            })
            .collect();
        if r.share.is_some() {
            held.truncate(1);
        }
        let share = r.share.map(|s| match held.first() {
            Some(&g) if s.milli == 0 || s.memory_mb == 0 => {
                let (milli, memory_mb) = crate::sharing::resolve(s, self.gpus[g].gpu.memory_mb)
                    .unwrap_or((s.milli.max(1), s.memory_mb));
                GpuShare { milli, memory_mb }
            }
            _ => s,
        });
        let gpu_count = match r.share {
            Some(_) => 1,
            None => u32::try_from(r.gpus.len()).unwrap_or(u32::MAX),
        };
        // The GPUs say where it really runs; the node id covers a job whose GPUs are
        // unknown.
        let node = held
            .first()
            .map(|&g| self.gpus[g].node)
            .or_else(|| node_index.get(&r.node).copied());
        let owner_lab = node.map(|n| self.nodes[n].node.lab);
        self.add_running(RunW {
            job: r.id,
            lab: slots.labs[&r.lab],
            member: slots.members[&(r.lab, r.user)],
            node,
            gpus: held,
            gpu_count,
            milli: share.map_or(u64::from(gpu_count) * 1000, |s| u64::from(s.milli)),
            share,
            started_at: r.started_at,
            time_limit_s: r.time_limit_s,
            last_checkpoint_at: r.last_checkpoint_at,
            checkpoint_write_s: r.checkpoint_write_s,
            preempting: r.preempting,
            new: false,
            guest: owner_lab.is_some_and(|l| l != r.lab),
            cpus: r.cpus,
            memory_mb: r.memory_mb,
        });
    }
}

/// Step 1: nodes in id order (duplicates dropped), each with its GPUs in id order.
fn hardware<'a>(snapshot: &'a Snapshot, policy: &Policy, now: Time, pressure: f64) -> Hardware<'a> {
    let mut order: Vec<&Node> = snapshot.nodes.iter().collect();
    order.sort_by_key(|n| n.id);
    order.dedup_by_key(|n| n.id);
    let mut hw = Hardware {
        nodes: Vec::with_capacity(order.len()),
        gpus: Vec::new(),
        gpu_index: FxHashMap::default(),
        node_index: FxHashMap::default(),
    };
    for node in order {
        let idx = hw.nodes.len();
        let first = hw.gpus.len();
        let kinds = node_gpus(node, idx, &mut hw);
        hw.node_index.insert(node.id, idx);
        let grace_s = if node.grace_s > 0 {
            node.grace_s
        } else {
            policy.default_grace_s
        };
        let returns = crate::risk::Returns::new(node);
        let min_idle_s = crate::risk::min_idle_s(node, returns.as_ref(), now, policy, pressure);
        hw.nodes.push(NodeW {
            returns,
            min_idle_s,
            node,
            gpus: first..hw.gpus.len(),
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
    hw
}

/// A node's GPUs into `hw` (a GPU id seen before stays with its first node); the node's
/// GPU kinds and how many of each.
fn node_gpus<'a>(node: &'a Node, idx: usize, hw: &mut Hardware<'a>) -> Vec<(&'a Gpu, u32)> {
    let mut own: Vec<&Gpu> = node.gpus.iter().collect();
    own.sort_by_key(|g| g.id);
    let mut kinds: Vec<(&Gpu, u32)> = Vec::new();
    for gpu in own {
        let same = |k: &&Gpu| {
            k.model == gpu.model && k.memory_mb == gpu.memory_mb && k.mig_profile == gpu.mig_profile
        };
        match kinds.iter_mut().find(|(k, _)| same(k)) {
            Some((_, c)) => *c += 1,
            None => kinds.push((gpu, 1)),
        }
        if hw.gpu_index.insert(gpu.id, hw.gpus.len()).is_none() {
            hw.gpus.push(GpuW {
                gpu,
                node: idx,
                holder: None,
                claim: None,
                reserved: None,
                shared: None,
            });
        }
    }
    kinds
}

/// Step 2a: every lab and (lab, user) the snapshot names gets a slot, in id order.
fn dense_slots(
    snapshot: &Snapshot,
    nodes: &[NodeW],
    running: &[&RunningJob],
    queue: &[&QueuedJob],
) -> Slots {
    let mut slots = Slots::default();
    let lab_ids = snapshot.labs.iter().map(|l| l.id);
    let lab_ids = lab_ids.chain(nodes.iter().map(|n| n.node.lab));
    let lab_ids = lab_ids.chain(running.iter().map(|r| r.lab));
    for lab in lab_ids
        .chain(queue.iter().map(|q| q.lab))
        .collect::<BTreeSet<_>>()
    {
        slots.lab(lab);
    }
    let pairs = snapshot.members.iter().map(|m| (m.lab, m.user));
    let pairs = pairs.chain(running.iter().map(|r| (r.lab, r.user)));
    for (lab, user) in pairs
        .chain(queue.iter().map(|q| (q.lab, q.user)))
        .collect::<BTreeSet<_>>()
    {
        slots.member(lab, user);
    }
    slots
}

/// Step 2b: labs' and members' usage and shares, decayed to `now`.
fn ledgers<'a>(
    snapshot: &'a Snapshot,
    slots: &Slots,
    nodes: &[NodeW],
    policy: &Policy,
    now: Time,
) -> (Vec<LabW<'a>>, Vec<MemberW<'a>>) {
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
    let members = slots
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
    (labs, members)
}

/// Step 3: the queue (in id order) with each job's metadata, in fair-share order: by lab
/// and member, boosted jobs first, then first come. Also the number of shapes.
fn fair_share_order<'a>(
    snapshot: &Snapshot,
    queue: Vec<&'a QueuedJob>,
    slots: &Slots,
    policy: &Policy,
    now: Time,
) -> (Vec<&'a QueuedJob>, Vec<JobMeta>, usize) {
    let boosting: BTreeSet<LabId> = snapshot
        .labs
        .iter()
        .filter(|l| l.interactive_boost)
        .map(|l| l.id)
        .collect();
    // Interning only looks up (never iterates), and ids follow id order, so a hash map
    // keeps the plan deterministic. Each job is read once, in id order (the snapshot's,
    // so memory is read in sequence), and its metadata travels with it through the sort.
    let mut shape_ids: FxHashMap<Shape, usize> = Default::default();
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
            keys.push(((q.lab, q.user, tier, q.submitted_at, q.id), i));
            Some(JobMeta {
                id: q.id,
                lab,
                member,
                shape: *shape_ids.entry(shape(q, policy, now)).or_insert(next),
                gpus: q.gpus,
                share: q.share.is_some(),
                ask: crate::quota::Ask::of(q),
                tier,
            })
        })
        .collect();
    // Storing the queue in fair-share order lets every round walk it front to back. The
    // keys are unique (ids are), so an unstable sort gives a stable sort's order.
    keys.sort_unstable_by_key(|&(key, _)| key);
    let (queue, meta): (Vec<&QueuedJob>, Vec<JobMeta>) = keys
        .into_iter()
        .filter_map(|(_, i)| Some((queue[i], metas[i].take()?)))
        .unzip();
    (queue, meta, shape_ids.len())
}
