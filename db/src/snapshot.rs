//! The scheduler's view of the campus, read in one transaction: nodes with their lending
//! rules, GPUs, running attempts (with their latest checkpoint's time), the queue, and
//! each lab's and member's quota and usage ledgers.
//!
//! Usage is derived from the attempts themselves (no separate counters to drift):
//! GPU-seconds of each attempt, weighted by GPU class and decayed with the policy's
//! half-life for fair share, and summed over the quota period for quotas. A job on
//! another lab's node is borrowing: it counts against its lab's quota and ledger, and to
//! the node's lab as lending.

use super::models::{Attempt, Gpu, JobState, Lab, Node};
use super::plan::Waiting;
use super::schema::*;
use super::DbError;
use super::{now, DbConn};
use commons_sched::{LabInfo, MemberInfo, Policy, Quota};
use diesel::prelude::*;
use std::collections::BTreeMap;

/// The window GPU-hour quotas count over.
pub const QUOTA_PERIOD_S: i64 = 7 * 24 * 3600;
/// How far back the fair-share ledgers look (eight half-lives of a week: < 0.4%).
const LEDGER_LOOKBACK_S: i64 = 8 * 7 * 24 * 3600;

fn secs(t: chrono::NaiveDateTime) -> i64 {
    t.and_utc().timestamp()
}

/// Reads the campus into a scheduler snapshot (one transaction).
pub fn read(c: &mut DbConn, policy: &Policy) -> Result<commons_sched::Snapshot, DbError> {
    Ok(read_with_waiting(c, policy)?.0)
}

/// A queued job as the scheduler needs it (not its image, command or environment), and
/// what it shows while it waits.
#[derive(Queryable, Selectable)]
#[diesel(table_name = jobs)]
struct QueuedRow {
    id: i64,
    user_id: i64,
    lab_id: i64,
    gpus: i32,
    gpu_models: super::types::Json<Vec<String>>,
    min_gpu_memory_mb: i64,
    cpus: f64,
    memory_mb: i64,
    disk_gb: Option<i64>,
    time_limit_s: i64,
    kind: crate::domain::JobKind,
    created_at: chrono::NaiveDateTime,
    reason: Option<String>,
    queue_position: Option<i32>,
    estimated_start_at: Option<chrono::NaiveDateTime>,
    array_id: Option<i64>,
    /// JSON; read only when not `[]` (almost every job names no dataset).
    datasets: String,
    /// JSON, likewise.
    inputs: String,
}

/// The snapshot, and what each queued job shows now (its reason, place and estimated
/// start), so that the tick writes only what its plan changes.
pub fn read_with_waiting(
    c: &mut DbConn,
    policy: &Policy,
) -> Result<(commons_sched::Snapshot, BTreeMap<i64, Waiting>), DbError> {
    c.transaction(|c| {
        let mut laps = Laps::start();
        let t = now();
        let now_s = secs(t);
        let rows = Rows::load(c, t, &mut laps)?;
        let (labs, members) = ledgers(&rows, policy, now_s);
        laps.lap("labs and ledgers");
        let node_lab: BTreeMap<i64, i64> = rows.nodes.iter().map(|n| (n.id, n.lab_id)).collect();
        let return_rates = owner_return_rates(&rows.used, &node_lab, policy.utc_offset_s);
        let snapshot = commons_sched::Snapshot {
            nodes: sched_nodes(&rows, &return_rates),
            running: running_jobs(&rows),
            queue: queued_jobs(&rows, policy),
            labs: labs.into_values().collect(),
            members: members.into_values().collect(),
        };
        let waiting = rows
            .queued
            .iter()
            .map(|j| {
                let w = Waiting {
                    reason: j.reason.clone(),
                    position: j.queue_position,
                    estimated_start: j.estimated_start_at,
                };
                (j.id, w)
            })
            .collect();
        laps.lap("snapshot built");
        tracing::debug!(took = ?laps.took, "snapshot read (cumulative ms)");
        Ok((snapshot, waiting))
    })
}

/// Cumulative milliseconds at each step of a read, for the debug log.
struct Laps {
    began: std::time::Instant,
    took: Vec<(&'static str, u128)>,
}

impl Laps {
    fn start() -> Laps {
        Laps {
            began: std::time::Instant::now(),
            took: Vec::new(),
        }
    }

    fn lap(&mut self, what: &'static str) {
        self.took.push((what, self.began.elapsed().as_millis()));
    }
}

/// Lab, user, time limit, CPUs and memory of a job whose attempt holds GPUs.
type JobOf = (i64, i64, i64, f64, i64);

/// Every row the snapshot is built from, read in the caller's transaction.
struct Rows {
    nodes: Vec<Node>,
    gpus: Vec<Gpu>,
    active: Vec<Attempt>,
    queued: Vec<QueuedRow>,
    /// Per queued job: how often its guest attempts were taken back, and the last time.
    take_backs: BTreeMap<i64, (u32, i64)>,
    /// Attempts that used GPUs within the ledgers' reach, with their jobs' lab and user.
    used: Vec<(Attempt, i64, i64)>,
    labs: Vec<Lab>,
    members: Vec<(i64, i64, super::types::Json<Quota>)>,
    job_of: BTreeMap<i64, JobOf>,
    /// Each running attempt's latest checkpoint and the job's latest known write time.
    checkpointed: BTreeMap<(i64, i32), super::checkpoints::AttemptCheckpoints>,
    /// `LAB/NAME` of every `node:` dataset, with its lab and the export name.
    exported: Vec<(String, i64, String)>,
    /// What each queued job that names inputs or datasets will fetch at its start.
    stage_bytes: BTreeMap<i64, u64>,
}

impl Rows {
    fn load(c: &mut DbConn, t: chrono::NaiveDateTime, laps: &mut Laps) -> Result<Rows, DbError> {
        let nodes: Vec<Node> = nodes::table
            .filter(nodes::revoked_at.is_null())
            .order(nodes::id)
            .select(Node::as_select())
            .load(c)?;
        let gpus: Vec<Gpu> = gpus::table
            .order(gpus::id)
            .select(Gpu::as_select())
            .load(c)?;
        laps.lap("nodes and GPUs");
        let active = super::attempts::active_attempts(c)?;
        // Sorted here rather than by the database: tens of thousands of rows overflow
        // PostgreSQL's default work_mem and its sort goes to disk (measured 200 ms of
        // a 370 ms read at 45,000 queued).
        let mut queued: Vec<QueuedRow> = jobs::table
            .filter(jobs::state.eq(JobState::Queued))
            // Jobs that wait for other jobs are not planned until released (`deps`).
            .filter(diesel::dsl::not(jobs::held))
            .select(QueuedRow::as_select())
            .load(c)?;
        queued.sort_unstable_by_key(|j| j.id);
        // Tasks over their array's throttle are kept out like held jobs (`arrays`).
        let tasks: Vec<(i64, Option<i64>)> = queued.iter().map(|j| (j.id, j.array_id)).collect();
        let throttled = super::arrays::throttled(c, &tasks)?;
        if !throttled.is_empty() {
            queued.retain(|j| !throttled.contains(&j.id));
        }
        laps.lap("active and queued");
        let take_backs = super::attempts::take_backs_of_queued(c)?
            .into_iter()
            .map(|(job, n, last)| (job, (n, secs(last))))
            .collect();
        let since = t - chrono::Duration::seconds(LEDGER_LOOKBACK_S);
        let used = job_attempts::table
            .inner_join(jobs::table)
            .filter(job_attempts::started_at.is_not_null())
            .filter(
                job_attempts::ended_at
                    .is_null()
                    .or(job_attempts::ended_at.gt(since)),
            )
            .select((Attempt::as_select(), jobs::lab_id, jobs::user_id))
            .load(c)?;
        laps.lap("take-backs and used");
        let labs = labs::table
            .order(labs::id)
            .select(Lab::as_select())
            .load(c)?;
        let members = memberships::table
            .order((memberships::lab_id, memberships::user_id))
            .select((
                memberships::lab_id,
                memberships::user_id,
                memberships::quota,
            ))
            .load(c)?;
        let job_of = jobs_of_attempts(c, &active)?;
        let pairs: Vec<(i64, i32)> = active.iter().map(|a| (a.job_id, a.attempt)).collect();
        let checkpointed = super::checkpoints::for_attempts(c, &pairs)?;
        let sets = super::datasets::all(c)?;
        let exported = sets
            .iter()
            .filter_map(|(d, slug)| {
                let name = d.source.strip_prefix("node:")?.to_string();
                Some((format!("{slug}/{}", d.name), d.lab_id, name))
            })
            .collect();
        let stage_bytes = stage_bytes(c, &queued, &labs, &sets)?;
        laps.lap("running jobs and checkpoints");
        Ok(Rows {
            nodes,
            gpus,
            active,
            queued,
            take_backs,
            used,
            labs,
            members,
            job_of,
            checkpointed,
            exported,
            stage_bytes,
        })
    }
}

/// Lab, user and time limit of the jobs whose attempts hold GPUs, in one query.
fn jobs_of_attempts(c: &mut DbConn, active: &[Attempt]) -> Result<BTreeMap<i64, JobOf>, DbError> {
    let ids: Vec<i64> = active.iter().map(|a| a.job_id).collect();
    Ok(jobs::table
        .filter(jobs::id.eq_any(&ids))
        .select((
            jobs::id,
            jobs::lab_id,
            jobs::user_id,
            jobs::time_limit_s,
            jobs::cpus,
            jobs::memory_mb,
        ))
        .load::<(i64, i64, i64, i64, f64, i64)>(c)?
        .into_iter()
        .map(|(id, lab, user, limit, cpus, mem)| (id, (lab, user, limit, cpus, mem)))
        .collect())
}

type LabLedgers = BTreeMap<i64, LabInfo>;
type MemberLedgers = BTreeMap<(i64, i64), MemberInfo>;

/// Each lab's and member's quota with its usage: decayed GPU-hours for fair share and
/// the GPU-hours of the quota period. Borrowing counts against the borrower's lab and is
/// credited to the lender's.
fn ledgers(rows: &Rows, policy: &Policy, now_s: i64) -> (LabLedgers, MemberLedgers) {
    let (mut lab_info, mut member_info) = quotas(rows, now_s);
    let gpu_by_id: BTreeMap<i64, &Gpu> = rows.gpus.iter().map(|g| (g.id, g)).collect();
    let node_lab: BTreeMap<i64, i64> = rows.nodes.iter().map(|n| (n.id, n.lab_id)).collect();
    let period_start = now_s - QUOTA_PERIOD_S;
    for (a, job_lab, user) in &rows.used {
        let Some(start) = a.started_at.map(secs) else {
            continue;
        };
        let end = a.ended_at.map(secs).unwrap_or(now_s).max(start);
        let ids = a.gpu_id_list();
        let weight: f64 = ids
            .iter()
            .filter_map(|g| gpu_by_id.get(g))
            .map(|g| policy.gpu_weight(&g.model))
            .sum();
        let hours = (end - start) as f64 / 3600.0;
        let decayed = commons_sched::decay(weight * hours, end, now_s, policy.half_life_s);
        let in_period = ids.len() as f64 * (end - start.max(period_start)).max(0) as f64 / 3600.0;
        let borrowed = node_lab.get(&a.node_id).is_some_and(|l| l != job_lab);
        if borrowed {
            if let Some(l) = lab_info.get_mut(job_lab) {
                l.used_gpu_hours += decayed;
                l.period_gpu_hours += in_period;
            }
            if let Some(owner) = node_lab.get(&a.node_id).and_then(|l| lab_info.get_mut(l)) {
                owner.lent_gpu_hours += decayed;
            }
        }
        if let Some(m) = member_info.get_mut(&(*job_lab, *user)) {
            m.used_gpu_hours += decayed;
            m.period_gpu_hours += in_period;
        }
    }
    (lab_info, member_info)
}

/// Every lab and member with its quota and empty ledgers.
fn quotas(rows: &Rows, now_s: i64) -> (LabLedgers, MemberLedgers) {
    let labs = rows
        .labs
        .iter()
        .map(|l| {
            let info = LabInfo {
                id: l.id,
                quota: l.quota.0.clone(),
                ledger_at: now_s,
                interactive_boost: l.interactive_boost,
                ..Default::default()
            };
            (l.id, info)
        })
        .collect();
    let member_default: BTreeMap<i64, Quota> = rows
        .labs
        .iter()
        .map(|l| (l.id, l.member_quota.0.clone()))
        .collect();
    let members = rows
        .members
        .iter()
        .map(|(lab, user, quota)| {
            // A member without a quota of their own has the lab's default.
            let own = quota.0.clone();
            let quota = if own == Quota::default() {
                member_default.get(lab).cloned().unwrap_or_default()
            } else {
                own
            };
            let info = MemberInfo {
                lab: *lab,
                user: *user,
                quota,
                ledger_at: now_s,
                ..Default::default()
            };
            ((*lab, *user), info)
        })
        .collect();
    (labs, members)
}

/// The nodes that are not revoked, with their present GPUs and lending rules.
fn sched_nodes(rows: &Rows, return_rates: &BTreeMap<i64, Vec<f64>>) -> Vec<commons_sched::Node> {
    let mut on_node: BTreeMap<i64, Vec<&Gpu>> = BTreeMap::new();
    for g in rows.gpus.iter().filter(|g| g.present) {
        on_node.entry(g.node_id).or_default().push(g);
    }
    rows.nodes
        .iter()
        .map(|n| commons_sched::Node {
            id: n.id,
            name: n.name.clone(),
            lab: n.lab_id,
            // A drained node takes nothing new and gives its guests back.
            schedulable: n.online && !n.draining,
            lending: n.lending_rules(),
            grace_s: n.grace_s.max(0) as u32,
            reclaim: n.reclaim || n.draining,
            owner_return_rate: return_rates.get(&n.id).cloned().unwrap_or_default(),
            cpus: n.cpus.max(0.0),
            memory_mb: n.memory_mb.max(0) as u64,
            max_job_disk_gb: n.max_job_disk_gb.unwrap_or(0).max(0) as u64,
            low_disk: n.disk_low.is_some(),
            // New GPUs await the lab admin: no guests until approved.
            inventory_unapproved: n.inventory_unapproved,
            exports: rows
                .exported
                .iter()
                .filter(|(_, lab, name)| *lab == n.lab_id && n.datasets.exports.contains(name))
                .map(|(key, ..)| key.clone())
                .collect(),
            cached: n.datasets.cached.iter().map(|d| d.key.clone()).collect(),
            fetch_bytes_per_s: n.datasets.fetch_bytes_per_s.unwrap_or(0),
            gpus: on_node
                .get(&n.id)
                .into_iter()
                .flatten()
                .map(|g| sched_gpu(g))
                .collect(),
        })
        .collect()
}

fn sched_gpu(g: &Gpu) -> commons_sched::Gpu {
    commons_sched::Gpu {
        id: g.id,
        model: g.model.clone(),
        memory_mb: g.memory_mb.max(0) as u64,
        // A faulty GPU is withdrawn: nothing is placed on it.
        local_use: g.local_use || g.fault.is_some(),
        idle_since: g.idle_since.map(secs).unwrap_or(0),
        ..Default::default()
    }
}

/// The attempts that hold GPUs (starting, running or stopping).
fn running_jobs(rows: &Rows) -> Vec<commons_sched::RunningJob> {
    rows.active
        .iter()
        .map(|a| {
            let (lab, user, limit, cpus, memory_mb) =
                rows.job_of.get(&a.job_id).copied().unwrap_or_default();
            let k = rows
                .checkpointed
                .get(&(a.job_id, a.attempt))
                .copied()
                .unwrap_or_default();
            // An attempt still starting has no started_at yet: count from creation.
            commons_sched::RunningJob {
                id: a.job_id,
                user,
                lab,
                node: a.node_id,
                gpus: a.gpu_id_list(),
                started_at: secs(a.started_at.unwrap_or(a.created_at)),
                time_limit_s: limit,
                preempting: a.status() == super::models::AttemptStatus::Stopping,
                last_checkpoint_at: k.latest_at.map(secs),
                cpus,
                memory_mb: memory_mb.max(0) as u64,
                // As the agent measured it, in whole seconds rounded up.
                checkpoint_write_s: k.write_ms.map(|ms| (ms.max(0) + 999) / 1000),
                share: None,
            }
        })
        .collect()
}

/// The queue, in submission order.
fn queued_jobs(rows: &Rows, policy: &Policy) -> Vec<commons_sched::QueuedJob> {
    rows.queued
        .iter()
        .map(|j| {
            let (take_backs, taken_back_at) =
                rows.take_backs.get(&j.id).copied().unwrap_or_default();
            commons_sched::QueuedJob {
                id: j.id,
                user: j.user_id,
                lab: j.lab_id,
                gpus: j.gpus.max(0) as u32,
                models: j.gpu_models.0.clone(),
                min_memory_mb: j.min_gpu_memory_mb.max(0) as u64,
                time_limit_s: j.time_limit_s,
                submitted_at: secs(j.created_at),
                interactive: j.kind == crate::domain::JobKind::Interactive,
                cpus: j.cpus,
                memory_mb: j.memory_mb.max(0) as u64,
                disk_gb: effective_disk_gb(j.disk_gb, policy),
                take_backs,
                taken_back_at,
                stage_bytes: rows.stage_bytes.get(&j.id).copied().unwrap_or(0),
                ..dataset_needs(j, &rows.exported)
            }
        })
        .collect()
}

/// What each queued job naming inputs or datasets will fetch when it starts.
fn stage_bytes(
    c: &mut DbConn,
    queued: &[QueuedRow],
    labs: &[Lab],
    sets: &[(super::datasets::DatasetRow, String)],
) -> Result<BTreeMap<i64, u64>, DbError> {
    let mut out = BTreeMap::new();
    let fetching: Vec<&QueuedRow> = queued
        .iter()
        .filter(|j| j.inputs != "[]" || j.datasets != "[]")
        .collect();
    if fetching.is_empty() {
        return Ok(out);
    }
    let slugs = labs.iter().map(|l| (l.slug.clone(), l.id)).collect();
    let lab_sources = sets
        .iter()
        .filter_map(|(d, slug)| {
            let p = d.source.strip_prefix("lab:")?;
            let prefix = p.strip_suffix('/').unwrap_or(p).to_string();
            Some((format!("{slug}/{}", d.name), (d.lab_id, prefix)))
        })
        .collect();
    let mut sizes = super::staging_size::Sizes::default();
    for j in fetching {
        let inputs: Vec<String> = serde_json::from_str(&j.inputs).unwrap_or_default();
        let datasets: Vec<commons_api::datasets::JobDataset> =
            serde_json::from_str(&j.datasets).unwrap_or_default();
        let n = super::staging_size::stage_bytes(
            c,
            &mut sizes,
            j.user_id,
            &inputs,
            &datasets,
            &slugs,
            &lab_sources,
        )?;
        out.insert(j.id, n);
    }
    Ok(out)
}

/// What a queued job's datasets ask of a node: the `node:` ones it needs exported, and
/// all of them for the cache preference (the rest of the job left to its defaults).
fn dataset_needs(j: &QueuedRow, exported: &[(String, i64, String)]) -> commons_sched::QueuedJob {
    if j.datasets == "[]" {
        return commons_sched::QueuedJob::default();
    }
    let named: Vec<commons_api::datasets::JobDataset> =
        serde_json::from_str(&j.datasets).unwrap_or_default();
    let keys: Vec<String> = named.iter().map(|d| d.key()).collect();
    commons_sched::QueuedJob {
        needs_exports: keys
            .iter()
            .filter(|k| exported.iter().any(|(e, ..)| e == *k))
            .cloned()
            .collect(),
        datasets: keys,
        ..Default::default()
    }
}

/// A job's disk in GiB: its own `disk_gb`, or the campus default.
pub fn effective_disk_gb(disk_gb: Option<i64>, policy: &Policy) -> u64 {
    disk_gb.map_or(policy.default_disk_gb, |g| g.max(0) as u64)
}

/// Each node's owner take-backs by hour of the week, from the attempts in the ledgers'
/// reach: a guest attempt (its job's lab is not the node's) that was stopped and run
/// again later (a later attempt of the same job exists) was taken back by the owner
/// (or moved off a drained node). Rates are per week of the lookback, smoothed with
/// [`commons_sched::smooth_return_rate`]; nodes without take-backs get none.
fn owner_return_rates(
    used: &[(Attempt, i64, i64)],
    node_lab: &BTreeMap<i64, i64>,
    utc_offset_s: i32,
) -> BTreeMap<i64, Vec<f64>> {
    let mut last: BTreeMap<i64, i32> = BTreeMap::new();
    for (a, _, _) in used {
        let e = last.entry(a.job_id).or_insert(a.attempt);
        *e = (*e).max(a.attempt);
    }
    let mut counts: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for (a, job_lab, _) in used {
        let guest = node_lab.get(&a.node_id).is_some_and(|l| l != job_lab);
        let rerun = last.get(&a.job_id).is_some_and(|&l| l > a.attempt);
        let (true, true, true, Some(end)) = (
            guest,
            rerun,
            a.status() == super::models::AttemptStatus::Stopped,
            a.ended_at,
        ) else {
            continue;
        };
        let h = commons_sched::hour_of_week(secs(end), utc_offset_s);
        counts
            .entry(a.node_id)
            .or_insert_with(|| vec![0.0; commons_sched::WEEK_HOURS])[h] += 1.0;
    }
    let weeks = LEDGER_LOOKBACK_S as f64 / (7.0 * 86_400.0);
    counts
        .into_iter()
        .map(|(node, c)| (node, commons_sched::smooth_return_rate(&c, weeks)))
        .collect()
}
