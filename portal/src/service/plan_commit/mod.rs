//! Committing the scheduler's plan (Nomad's plan applier): the plan was made from a
//! snapshot; this re-checks it against the database as it is now and writes what still
//! holds, in a fixed number of statements whatever the plan's size (see `db::plan`).
//!
//! Invariants:
//! - A job starts only if it is still queued when its row is written
//!   (`db::plan::claim_queued`), on an online node with an agent, on present GPUs of that
//!   node that no active attempt holds and no other start of the same plan takes.
//! - A guest is preempted only while its job and attempt still start or run.
//! - Every state change writes its history row in the same transaction.
//! - What waiting jobs show (reason, place, estimate) is written only where it changed,
//!   and outside the commit: it is for people to read, nothing decides on it. A new
//!   reason is written at once; a new place or estimate alone at the caller's pace.

use super::attempts::{Order, Timing};
use crate::db::models::{AttemptStatus, Gpu, Job, JobState, Node};
use crate::db::plan::{NewAttempt, Shown, Waiting};
use crate::db::{self, now, DbConn};
use crate::error::AppError;
use commons_proto::{JobSpec, Lease, PortalMsg, StopReason};
use std::collections::{BTreeMap, BTreeSet};

/// Commits a plan (second transaction):
/// 1. Preemptions first: jobs that still start or run go to `preempting`, their
///    attempts to `stopping`, and their nodes get a `Stop` with the grace.
/// 2. Starts: checked against the jobs, nodes and GPUs as they are now (one query
///    each), then claimed in one statement; the attempts and history rows are inserted
///    in one statement each, and each start gets its `Start`.
pub fn apply_plan(
    c: &mut DbConn,
    plan: &commons_sched::Plan,
    timing: Timing,
) -> Result<Vec<Order>, AppError> {
    db::transaction(c, |c| {
        // Only the attempts the plan's checks need: those on the nodes it starts jobs on
        // (what their GPUs hold) and those of the jobs it preempts.
        let nodes: BTreeSet<i64> = plan.start.iter().map(|s| s.node).collect();
        let nodes: Vec<i64> = nodes.into_iter().collect();
        let jobs: Vec<i64> = plan.preempt.iter().map(|p| p.job).collect();
        let active = db::attempts::active_on_nodes_or_of_jobs(c, &nodes, &jobs)?;
        let mut orders = preempt(c, plan, &active)?;
        orders.extend(start(c, plan, &active, timing)?);
        Ok(orders)
    })
}

fn preempt(
    c: &mut DbConn,
    plan: &commons_sched::Plan,
    active: &[crate::db::models::Attempt],
) -> Result<Vec<Order>, AppError> {
    if plan.preempt.is_empty() {
        return Ok(Vec::new());
    }
    let live: BTreeMap<i64, &crate::db::models::Attempt> = active
        .iter()
        .filter(|a| matches!(a.state, AttemptStatus::Starting | AttemptStatus::Running))
        .map(|a| (a.job_id, a))
        .collect();
    let wanted: Vec<i64> = plan
        .preempt
        .iter()
        .map(|p| p.job)
        .filter(|j| live.contains_key(j))
        .collect();
    let moved: BTreeSet<i64> = db::plan::preempt(c, &wanted)?.into_iter().collect();
    let mut events = Vec::new();
    let mut orders = Vec::new();
    for p in &plan.preempt {
        let (true, Some(a)) = (moved.contains(&p.job), live.get(&p.job)) else {
            tracing::info!(job = p.job, "plan preemption no longer valid; skipped");
            continue;
        };
        events.push((
            p.job,
            JobState::Preempting,
            format!("preempting: {} (grace {} s)", p.reason, p.grace_s),
        ));
        orders.push(Order {
            node: a.node_id,
            msg: PortalMsg::Stop {
                job: a.job_id,
                attempt: a.attempt,
                grace_s: u64::from(p.grace_s),
                reason: StopReason::Preempted,
                detail: Some(p.reason.to_string()),
            },
        });
    }
    db::plan::add_events(c, &events, now())?;
    Ok(orders)
}

fn start(
    c: &mut DbConn,
    plan: &commons_sched::Plan,
    active: &[crate::db::models::Attempt],
    timing: Timing,
) -> Result<Vec<Order>, AppError> {
    if plan.start.is_empty() {
        return Ok(Vec::new());
    }
    let held = Holds::of(active);
    let rows = StartRows::read(c, plan)?;
    let valid = rows.still_valid(plan, held);
    // 2. Claimed in one statement: a job no longer queued now is left out.
    let pairs: Vec<(i64, i64)> = valid.iter().map(|(s, ..)| (s.job, s.node)).collect();
    let claimed: BTreeMap<i64, i32> = db::plan::claim_queued(c, &pairs)?.into_iter().collect();
    let t = now();
    let mut attempts = Vec::new();
    let mut events = Vec::new();
    let mut started = Vec::new();
    for (s, node, clock, on) in valid {
        let Some(&attempt) = claimed.get(&s.job) else {
            tracing::info!(job = s.job, "plan start no longer valid; skipped");
            continue;
        };
        attempts.push(NewAttempt {
            job: s.job,
            attempt,
            node: node.id,
            gpus: s.gpus.clone(),
            lease_until: clock.lease_until(timing.lease_ttl_s),
            share: s.share,
        });
        let names: Vec<String> = on
            .iter()
            .map(|g| format!("#{} {}", g.idx, g.model))
            .collect();
        events.push((
            s.job,
            JobState::Starting,
            format!(
                "attempt {attempt} starting on {} (GPU {})",
                node.name,
                names.join(", ")
            ),
        ));
        let lease = clock.lease(timing.lease_ttl_s);
        started.push((s.job, attempt, node.id, lease, on, s.share));
    }
    db::plan::insert_attempts(c, &attempts, t)?;
    db::plan::add_events(c, &events, t)?;
    // 3. The `Start`s, from what the jobs' rows say (read before the claim).
    let StartRows { jobs, nodes, .. } = rows;
    let mut facts = StartFacts::read(c, started.iter().filter_map(|s| jobs.get(&s.0)))?;
    facts.nodes = nodes;
    Ok(started
        .into_iter()
        .filter_map(|(job, attempt, node, lease, on, share)| {
            let job = jobs.get(&job)?;
            Some(Order {
                node,
                msg: start_msg(job, attempt, (&on, share), lease, timing, &facts),
            })
        })
        .collect())
}

/// The jobs, online nodes and GPUs a plan's starts name, read in one query each.
struct StartRows {
    jobs: BTreeMap<i64, Job>,
    nodes: BTreeMap<i64, Node>,
    gpus: BTreeMap<i64, Gpu>,
}

/// A start that still holds: the planned start, its node, the node's agent clock, and
/// its GPUs in index order.
type ValidStart<'a> = (
    &'a commons_sched::Start,
    &'a Node,
    crate::db::models::AgentClock,
    Vec<Gpu>,
);

impl StartRows {
    fn read(c: &mut DbConn, plan: &commons_sched::Plan) -> Result<StartRows, AppError> {
        let job_ids: Vec<i64> = plan.start.iter().map(|s| s.job).collect();
        let jobs = db::jobs::by_ids(c, &job_ids)?
            .into_iter()
            .map(|j| (j.id, j))
            .collect();
        let node_ids: BTreeSet<i64> = plan.start.iter().map(|s| s.node).collect();
        let node_ids: Vec<i64> = node_ids.into_iter().collect();
        let nodes = db::nodes::online_nodes(c, &node_ids)?
            .into_iter()
            .map(|n| (n.id, n))
            .collect();
        let gpu_ids: Vec<i64> = plan.start.iter().flat_map(|s| s.gpus.clone()).collect();
        let gpus = db::nodes::gpus_by_ids(c, &gpu_ids)?
            .into_iter()
            .map(|g| (g.id, g))
            .collect();
        Ok(StartRows { jobs, nodes, gpus })
    }

    /// The starts that still hold, in plan order (a GPU goes to the first start that
    /// wants it, or to the shares that fit on it; `held` is what active attempts hold).
    fn still_valid<'a>(
        &'a self,
        plan: &'a commons_sched::Plan,
        mut held: Holds,
    ) -> Vec<ValidStart<'a>> {
        let mut valid = Vec::new();
        for s in &plan.start {
            let node = self.nodes.get(&s.node);
            let clock = node.and_then(|n| n.agent_clock());
            let on: Vec<&Gpu> = s.gpus.iter().filter_map(|g| self.gpus.get(g)).collect();
            let gpus_ok = on.len() == s.gpus.len()
                && on
                    .iter()
                    .all(|g| g.node_id == s.node && g.present && held.takes(g, s.share));
            let queued = self
                .jobs
                .get(&s.job)
                .is_some_and(|j| j.state == JobState::Queued);
            let (Some(node), Some(clock), true, true) = (node, clock, gpus_ok, queued) else {
                tracing::info!(job = s.job, "plan start no longer valid; skipped");
                continue;
            };
            held.add(&s.gpus, s.share);
            let mut on: Vec<Gpu> = on.into_iter().cloned().collect();
            on.sort_by_key(|g| g.idx);
            valid.push((s, node, clock, on));
        }
        valid
    }
}

/// What a `Start` needs beyond the job's row, read for many jobs at once.
pub(crate) struct StartFacts {
    lab_slugs: BTreeMap<i64, String>,
    usernames: BTreeMap<i64, String>,
    /// Jobs with a committed checkpoint (their next attempt resumes).
    checkpointed: BTreeSet<i64>,
    nodes: BTreeMap<i64, Node>,
    /// The mounts of the jobs that name datasets (checked again now).
    datasets: BTreeMap<i64, Vec<commons_proto::DatasetMount>>,
}

impl StartFacts {
    /// Four queries whatever the number of jobs (the nodes of the GPUs are added by the
    /// caller, or read in [`StartFacts::with_nodes`]), and a few more for each job that
    /// names datasets.
    pub(crate) fn read<'a>(
        c: &mut DbConn,
        jobs: impl Iterator<Item = &'a Job>,
    ) -> Result<Self, AppError> {
        let jobs: Vec<&Job> = jobs.collect();
        if jobs.is_empty() {
            return Ok(StartFacts {
                lab_slugs: BTreeMap::new(),
                usernames: BTreeMap::new(),
                checkpointed: BTreeSet::new(),
                nodes: BTreeMap::new(),
                datasets: BTreeMap::new(),
            });
        }
        let labs: Vec<i64> = jobs.iter().map(|j| j.lab_id).collect();
        let users: Vec<i64> = jobs.iter().map(|j| j.user_id).collect();
        let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
        Ok(StartFacts {
            lab_slugs: db::users::lab_slugs(c, &labs)?,
            usernames: db::users::usernames(c, &users)?,
            checkpointed: db::checkpoints::jobs_with_any(c, &ids)?,
            nodes: BTreeMap::new(),
            datasets: dataset_mounts(c, &jobs)?,
        })
    }

    /// Adds the nodes `ids` (one query).
    pub(crate) fn with_nodes(mut self, c: &mut DbConn, ids: &[i64]) -> Result<Self, AppError> {
        for n in db::nodes::by_ids(c, ids)? {
            self.nodes.insert(n.id, n);
        }
        Ok(self)
    }
}

/// The dataset mounts of the jobs that name any; a dataset a job may no longer use goes
/// as [`commons_proto::DatasetSource::Refused`], and its agent fails the attempt.
fn dataset_mounts(
    c: &mut DbConn,
    jobs: &[&Job],
) -> Result<BTreeMap<i64, Vec<commons_proto::DatasetMount>>, AppError> {
    let mut out = BTreeMap::new();
    for j in jobs.iter().filter(|j| !j.datasets.0.is_empty()) {
        let mounts = match super::datasets::mounts_for_start(c, j.user_id, &j.datasets.0) {
            Ok(m) => m,
            Err(AppError::Invalid { message, .. }) => j
                .datasets
                .0
                .iter()
                .map(|d| commons_proto::DatasetMount {
                    key: d.key(),
                    mount: d.mount_or_default(),
                    source: commons_proto::DatasetSource::Refused {
                        why: message.clone(),
                    },
                })
                .collect(),
            Err(e) => return Err(e),
        };
        out.insert(j.id, mounts);
    }
    Ok(out)
}

/// What active attempts hold: GPUs of their own, and the shares on shared GPUs.
#[derive(Debug, Default)]
struct Holds {
    whole: BTreeSet<i64>,
    /// Per GPU: compute (thousandths) and memory (MiB) given to shares.
    shares: BTreeMap<i64, (u32, u64)>,
}

impl Holds {
    fn of(active: &[crate::db::models::Attempt]) -> Holds {
        let mut h = Holds::default();
        for a in active {
            h.add(&a.gpu_id_list(), a.share());
        }
        h
    }

    fn add(&mut self, gpus: &[i64], share: Option<commons_sched::GpuShare>) {
        for &g in gpus {
            match share {
                Some(s) => {
                    let e = self.shares.entry(g).or_default();
                    *e = (e.0 + s.milli, e.1 + s.memory_mb);
                }
                None => {
                    self.whole.insert(g);
                }
            }
        }
    }

    /// Whether `gpu` can take a start of `share` (`None`: the whole GPU) next to what
    /// is on it.
    fn takes(&self, gpu: &Gpu, share: Option<commons_sched::GpuShare>) -> bool {
        if self.whole.contains(&gpu.id) {
            return false;
        }
        let (milli, memory) = self.shares.get(&gpu.id).copied().unwrap_or_default();
        match share {
            None => milli == 0 && memory == 0,
            Some(s) => {
                milli + s.milli <= 1000 && memory + s.memory_mb <= gpu.memory_mb.max(0) as u64
            }
        }
    }
}

/// The `Start` for an attempt of `job` on `gpus`, with the share of them it holds.
pub(crate) fn start_msg(
    job: &Job,
    attempt: i32,
    (gpus, share): (&[Gpu], Option<commons_sched::GpuShare>),
    lease: Lease,
    timing: Timing,
    facts: &StartFacts,
) -> PortalMsg {
    let node = gpus.first().and_then(|g| facts.nodes.get(&g.node_id));
    let node_lab = node.map(|n| n.lab_id);
    let grace_s = node.map(|n| timing.grace_on(n.grace_s));
    PortalMsg::Start {
        job: job.id,
        attempt,
        spec: JobSpec {
            image: job.image.clone(),
            command: job.command.0.clone(),
            env: job.env.0.clone(),
            cpus: job.cpus,
            memory_mb: job.memory_mb.max(0) as u64,
            time_limit_s: job.time_limit_s.max(0) as u64,
            user: facts
                .usernames
                .get(&job.user_id)
                .cloned()
                .unwrap_or_default(),
            checkpoint_interval_s: job.checkpoint_interval_s.map(|s| s.max(60) as u64),
            shm_mb: job.shm_mb.and_then(|m| u64::try_from(m).ok()),
            interactive: job.kind == crate::domain::JobKind::Interactive,
            guest: node_lab.is_some_and(|l| l != job.lab_id),
            lab: facts.lab_slugs.get(&job.lab_id).cloned(),
            grace_s,
            image_digest: job.image_digest.clone(),
            image_signature: job.image_signature.clone(),
            image_campus: job.image_campus,
            inputs: job.inputs.0.clone(),
            datasets: facts.datasets.get(&job.id).cloned().unwrap_or_default(),
            disk_gb: Some(
                job.disk_gb
                    .map_or(timing.default_disk_gb, |g| g.max(1) as u64),
            ),
            gpu_share: share.map(|s| commons_proto::GpuShare {
                milli: s.milli,
                memory_mb: s.memory_mb,
            }),
        },
        gpus: gpus.iter().map(|g| g.uuid.clone()).collect(),
        lease,
        // Any attempt of the job committed a checkpoint: the next one resumes from it.
        resume: facts.checkpointed.contains(&job.id),
    }
}

/// Writes what the waiting jobs of a plan show (reason, place in the queue, estimated
/// start) where it differs from what they show now (`shown`: the scheduler's world, or
/// a read); returns the rows written (the scheduler's world notes them). One statement
/// on PostgreSQL.
///
/// Without `moves`, only rows whose reason changed (a job the scheduler saw for the
/// first time, one that now waits for something else) are written: when a round starts
/// jobs, every job behind them moves up and tens of thousands of rows would change each
/// round for their place alone. The caller passes `moves` every few seconds.
pub fn record_waiting<'a>(
    c: &mut DbConn,
    pending: &[commons_sched::Pending],
    shown: impl Fn(i64) -> Option<Shown<'a>>,
    moves: bool,
) -> Result<Vec<(i64, Waiting)>, AppError> {
    let (changed, reasons): (Vec<(i64, Waiting)>, Vec<bool>) =
        waiting_changes(pending, shown, moves).into_iter().unzip();
    db::plan::set_waiting(c, &changed, &reasons)?;
    Ok(changed)
}

/// Removes the places of jobs that no longer wait, which a cancel or start racing the
/// places' write can leave behind (`db::plan::sweep_places`); returns how many.
pub fn sweep_places(c: &mut DbConn) -> Result<usize, AppError> {
    Ok(db::plan::sweep_places(c)?)
}

/// The rows [`record_waiting`] writes, each with whether its reason changed (a place
/// alone is written to `job_places`, not to the job's row). Each reason is written out
/// once, into one buffer, to compare: tens of thousands of jobs wait, and few of them
/// change.
fn waiting_changes<'a>(
    pending: &[commons_sched::Pending],
    shown: impl Fn(i64) -> Option<Shown<'a>>,
    moves: bool,
) -> Vec<((i64, Waiting), bool)> {
    use std::fmt::Write;
    let mut reason = String::new();
    pending
        .iter()
        .filter_map(|p| {
            reason.clear();
            // Writing into a String cannot fail.
            let _ = write!(reason, "{}", p.reason);
            let position = Some(p.position as i32);
            let estimated_start = p
                .estimated_start
                .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
                .map(|t| t.naive_utc());
            let (write, reason_changed) = match shown(p.job) {
                Some(now) => {
                    let reason_changed = now.reason != Some(reason.as_str());
                    let moved = now.position != position || now.estimated_start != estimated_start;
                    (reason_changed || (moves && moved), reason_changed)
                }
                None => (true, true),
            };
            write.then(|| {
                let w = Waiting {
                    reason: Some(reason.clone()),
                    position,
                    estimated_start,
                };
                ((p.job, w), reason_changed)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
