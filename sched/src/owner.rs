//! Owner first: a lab's jobs on the lab's own nodes, before any guest is considered.
//!
//! Invariants:
//! - An owner job that fits one of its lab's schedulable nodes is placed there: on
//!   free GPUs if enough are free, else by preempting just enough guests (with the
//!   node's grace period), else it waits for its lab's own jobs.
//! - GPUs an owner job waits for are claimed: no guest is placed on them in this plan.
//!   A later job of the same lab may use a claimed free GPU only if it ends before the
//!   owner job is expected to start (backfill inside the lab).
//! - Owner jobs are never preempted; guests started in this plan are never victims.
//! - Lending rules do not apply to a lab's own jobs; member quotas do.

use crate::fairshare::member_key;
use crate::model::{QueuedJob, Time};
use crate::placement::end_of;
use crate::preemption::victims;
use crate::quota::member_block;
use crate::reason::Reason;
use crate::state::{gpu_matches, World};
use crate::Round;

/// Whether `job` could ever run on one of its lab's schedulable nodes.
pub(crate) fn fits_own_node(world: &World, job: &QueuedJob) -> bool {
    job.gpus > 0
        && world.lab_nodes.get(&job.lab).is_some_and(|nodes| {
            nodes.iter().any(|&n| {
                let nw = &world.nodes[n];
                nw.node.schedulable
                    && world.gpus[nw.gpus.clone()]
                        .iter()
                        .filter(|g| gpu_matches(job, g.gpu))
                        .count()
                        >= job.gpus as usize
            })
        })
}

/// What one own node offers an owner job.
enum Offer {
    /// Start now on these GPUs; `left` free GPUs remain on the node.
    Start { left: u32, gpus: Vec<usize> },
    /// Preempt these guests (running indices), losing `cost` GPU-seconds.
    Preempt {
        cost: i64,
        victims: Vec<usize>,
        usable: Vec<usize>,
    },
    /// Wait until about `at` (Time::MAX: unknown); claim the usable free GPUs meanwhile.
    Wait { at: Time, usable: Vec<usize> },
}

fn offer(world: &World, job: &QueuedJob, n: usize) -> Offer {
    let now = world.now;
    let want = job.gpus as usize;
    let ends = end_of(now, job);
    let nw = &world.nodes[n];
    let mut usable = Vec::new();
    let mut guest_held = 0usize;
    let mut times: Vec<Time> = Vec::new();
    for g in nw.gpus.clone() {
        let gw = &world.gpus[g];
        if gw.gpu.local_use || !gpu_matches(job, gw.gpu) {
            continue;
        }
        match gw.holder {
            None => {
                if gw.claim.is_none_or(|c| ends.is_some_and(|e| e <= c.until)) {
                    usable.push(g);
                    times.push(now);
                }
            }
            Some(r) if gw.claim.is_none() => {
                let run = &world.running[r];
                if run.guest && !run.new {
                    guest_held += 1;
                    times.push(now + i64::from(nw.grace_s));
                } else if let Some(end) = run.expected_end(now, nw.grace_s) {
                    times.push(end);
                }
            }
            Some(_) => {}
        }
    }
    if usable.len() >= want {
        usable.sort_by_key(|&g| (world.gpus[g].claim.is_some(), world.gpus[g].gpu.memory_mb, g));
        usable.truncate(want);
        return Offer::Start {
            left: nw.free.saturating_sub(job.gpus),
            gpus: usable,
        };
    }
    if usable.len() + guest_held >= want {
        let need = (want - usable.len()) as u32;
        if let Some((victims, cost)) = victims(world, job, n, need) {
            return Offer::Preempt {
                cost,
                victims,
                usable,
            };
        }
    }
    times.sort_unstable();
    let at = times.get(want - 1).copied().unwrap_or(Time::MAX);
    Offer::Wait { at, usable }
}

/// Place the owner jobs `jobs` (indices into `queue`) on their labs' nodes.
///
/// 1. Order each lab's jobs by member standing (lowest decayed usage first), then
///    first come, first served; labs are independent (their nodes are disjoint).
/// 2. A job over its member quota waits with that reason.
/// 3. Every own node that could hold the job makes an offer: start now (best fit wins:
///    fewest free GPUs left), else preempt guests (the cheapest set wins), else wait
///    (the earliest expected start wins). Ties go to the lowest node id.
/// 4. Preempting: the victims are told to stop and the job claims the free GPUs and
///    the victims' GPUs. Waiting: it claims the free matching GPUs of that node until
///    its expected start, and is returned so the guest phase may place it elsewhere.
pub(crate) fn place_owner_jobs(
    world: &mut World,
    queue: &[&QueuedJob],
    mut jobs: Vec<usize>,
    round: &mut Round,
) -> Vec<usize> {
    let keys: Vec<(i64, f64, i64, i64, i64)> = jobs
        .iter()
        .map(|&j| {
            let q = queue[j];
            (q.lab, member_key(world, q.lab, q.user), q.user, q.submitted_at, q.id)
        })
        .collect();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| {
        let (ka, kb) = (&keys[a], &keys[b]);
        ka.0.cmp(&kb.0)
            .then(ka.1.total_cmp(&kb.1))
            .then((ka.2, ka.3, ka.4).cmp(&(kb.2, kb.3, kb.4)))
    });
    jobs = order.into_iter().map(|i| jobs[i]).collect();

    let mut elsewhere = Vec::new();
    for j in jobs {
        let job = queue[j];
        if let Some(reason) = member_block(world, job) {
            round.pending.push((j, reason));
            continue;
        }
        let nodes = world.lab_nodes.get(&job.lab).cloned().unwrap_or_default();
        let mut start: Option<(u32, usize, Vec<usize>)> = None;
        let mut preempt: Option<(i64, usize, Vec<usize>, Vec<usize>)> = None;
        let mut wait: Option<(Time, usize, Vec<usize>)> = None;
        for n in nodes {
            let nw = &world.nodes[n];
            let fits = nw.node.schedulable
                && world.gpus[nw.gpus.clone()]
                    .iter()
                    .filter(|g| gpu_matches(job, g.gpu))
                    .count()
                    >= job.gpus as usize;
            if !fits {
                continue;
            }
            match offer(world, job, n) {
                Offer::Start { left, gpus } => {
                    if start.as_ref().is_none_or(|s| left < s.0) {
                        start = Some((left, n, gpus));
                    }
                }
                Offer::Preempt {
                    cost,
                    victims,
                    usable,
                } => {
                    if preempt.as_ref().is_none_or(|p| cost < p.0) {
                        preempt = Some((cost, n, victims, usable));
                    }
                }
                Offer::Wait { at, usable } => {
                    if wait.as_ref().is_none_or(|w| at < w.0) {
                        wait = Some((at, n, usable));
                    }
                }
            }
        }
        if let Some((_, n, gpus)) = start {
            round.starts.push(world.start(job, n, gpus));
        } else if let Some((_, n, victims, usable)) = preempt {
            let name = world.node_name(n);
            for &g in &usable {
                world.claim(g, world.now);
            }
            for r in victims {
                for g in world.running[r].gpus.clone() {
                    if gpu_matches(job, world.gpus[g].gpu) {
                        world.claim(g, world.now);
                    }
                }
                if !world.running[r].preempting {
                    let why = format!("the owner lab of node {name} needs its GPUs back");
                    round.preempts.push(world.preempt(r, why));
                }
            }
            let grace_s = world.nodes[n].grace_s;
            round
                .pending
                .push((j, Reason::WaitingForGuestsToLeave { node: name, grace_s }));
        } else if let Some((at, n, usable)) = wait {
            for g in usable {
                world.claim(g, at);
            }
            let node = world.node_name(n);
            round.pending.push((j, Reason::WaitingForOwnJobs { node }));
            elsewhere.push(j);
        }
    }
    elsewhere
}
