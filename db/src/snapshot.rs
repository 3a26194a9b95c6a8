//! The scheduler's view of the campus, read in one transaction: nodes with their lending
//! rules, GPUs, running attempts (with their latest checkpoint's time), the queue, and
//! each lab's and member's quota and usage ledgers.
//!
//! Usage is derived from the attempts themselves (no separate counters to drift):
//! GPU-seconds of each attempt, weighted by GPU class and decayed with the policy's
//! half-life for fair share, and summed over the quota period for quotas. A job on
//! another lab's node is borrowing: it counts against its lab's quota and ledger, and to
//! the node's lab as lending.

use super::models::Gpu;
use super::plan::Waiting;
use super::world::rows::{secs, Held, QueuedRow, Rows, LEDGER_LOOKBACK_S};
use super::DbConn;
use super::DbError;
use commons_sched::{LabInfo, MemberInfo, Policy, Quota};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// The window GPU-hour quotas count over.
pub const QUOTA_PERIOD_S: i64 = 7 * 24 * 3600;

/// Reads the campus into a scheduler snapshot (one transaction).
pub fn read(c: &mut DbConn, policy: &Policy) -> Result<commons_sched::Snapshot, DbError> {
    Ok(read_with_waiting(c, policy)?.0)
}

/// The snapshot, and what each queued job shows now (its reason, place and estimated
/// start): a full read in one transaction, which leaves the change log alone (the
/// scheduler keeps a [`crate::world::World`] between rounds instead).
pub fn read_with_waiting(
    c: &mut DbConn,
    policy: &Policy,
) -> Result<(commons_sched::Snapshot, BTreeMap<i64, Waiting>), DbError> {
    crate::transaction(c, |c| {
        let t = super::now();
        let rows = Rows::load(c, t)?;
        Ok((build(&rows, policy, t), waiting(&rows)))
    })
}

/// Builds the snapshot at `t` from the world's rows.
pub(crate) fn build(
    rows: &Rows,
    policy: &Policy,
    t: chrono::NaiveDateTime,
) -> commons_sched::Snapshot {
    let now_s = secs(t);
    let since = t - chrono::Duration::seconds(LEDGER_LOOKBACK_S);
    let (labs, members) = ledgers(rows, since, policy, now_s);
    let node_lab: BTreeMap<i64, i64> = rows.nodes.values().map(|n| (n.id, n.lab_id)).collect();
    let return_rates = owner_return_rates(rows.used(since), &node_lab, policy.utc_offset_s);
    let exported = exported(rows);
    commons_sched::Snapshot {
        nodes: sched_nodes(rows, &exported, &return_rates),
        running: running_jobs(rows),
        queue: queued_jobs(rows, &exported, policy),
        labs: labs.into_values().collect(),
        members: members.into_values().collect(),
    }
}

/// What each job of the queue shows now.
pub(crate) fn waiting(rows: &Rows) -> BTreeMap<i64, Waiting> {
    rows.queue()
        .map(|j| {
            let w = Waiting {
                reason: j.reason.clone(),
                position: j.queue_position,
                estimated_start: j.estimated_start_at,
            };
            (j.id, w)
        })
        .collect()
}

/// `LAB/NAME` of every `node:` dataset, with its lab and the export name.
fn exported(rows: &Rows) -> Vec<(String, i64, String)> {
    rows.sets
        .iter()
        .filter_map(|(d, slug)| {
            let name = d.source.strip_prefix("node:")?.to_string();
            Some((format!("{slug}/{}", d.name), d.lab_id, name))
        })
        .collect()
}

type LabLedgers = BTreeMap<i64, LabInfo>;
type MemberLedgers = BTreeMap<(i64, i64), MemberInfo>;

/// Each lab's and member's quota with its usage: decayed GPU-hours for fair share and
/// the GPU-hours of the quota period. Borrowing counts against the borrower's lab and is
/// credited to the lender's.
fn ledgers(
    rows: &Rows,
    since: chrono::NaiveDateTime,
    policy: &Policy,
    now_s: i64,
) -> (LabLedgers, MemberLedgers) {
    let (mut lab_info, mut member_info) = quotas(rows, now_s);
    // Looked up once per ended attempt of the last eight weeks, every round: the class
    // weight of each GPU is worked out once here, and both maps hash instead of
    // searching a tree (the values, and so the sums, are the same).
    let gpu_weight: FxHashMap<i64, f64> = rows
        .gpus
        .values()
        .map(|g| (g.id, policy.gpu_weight(&g.model)))
        .collect();
    let node_lab: FxHashMap<i64, i64> = rows.nodes.values().map(|n| (n.id, n.lab_id)).collect();
    let period_start = now_s - QUOTA_PERIOD_S;
    for held in rows.used(since) {
        let Held {
            attempt: a,
            lab: job_lab,
            user,
        } = held;
        let Some(start) = a.started_at.map(secs) else {
            continue;
        };
        let end = a.ended_at.map(secs).unwrap_or(now_s).max(start);
        // A share counts as its fraction of its GPU (a quarter for 4 hours: 1 GPU-hour).
        let part = a.share().map_or(1.0, |s| f64::from(s.milli) / 1000.0);
        let weight: f64 = part
            * a.gpu_ids
                .0
                .iter()
                .filter_map(|g| gpu_weight.get(g))
                .sum::<f64>();
        let hours = (end - start) as f64 / 3600.0;
        let decayed = commons_sched::decay(weight * hours, end, now_s, policy.half_life_s);
        let in_period = a.gpu_amount() * (end - start.max(period_start)).max(0) as f64 / 3600.0;
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
fn sched_nodes(
    rows: &Rows,
    exported: &[(String, i64, String)],
    return_rates: &BTreeMap<i64, Vec<f64>>,
) -> Vec<commons_sched::Node> {
    let mut on_node: BTreeMap<i64, Vec<&Gpu>> = BTreeMap::new();
    for g in rows.gpus.values().filter(|g| g.present) {
        on_node.entry(g.node_id).or_default().push(g);
    }
    rows.nodes
        .values()
        .map(|n| commons_sched::Node {
            id: n.id,
            name: n.name.clone(),
            lab: n.lab_id,
            // A drained node takes nothing new and gives its guests back.
            schedulable: n.online && !n.draining,
            lending: n.effective_lending(),
            grace_s: n.grace_s.max(0) as u32,
            reclaim: n.reclaim || n.draining,
            owner_return_rate: return_rates.get(&n.id).cloned().unwrap_or_default(),
            cpus: n.cpus.max(0.0),
            memory_mb: n.memory_mb.max(0) as u64,
            max_job_disk_gb: n.max_job_disk_gb.unwrap_or(0).max(0) as u64,
            low_disk: n.disk_low.is_some(),
            // New GPUs await the lab admin: no guests until approved.
            inventory_unapproved: n.inventory_unapproved,
            exports: exported
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
    // In the order the attempts were created, as the plan has always seen them.
    let mut active: Vec<&super::models::Attempt> = rows.active().collect();
    active.sort_unstable_by_key(|a| a.id);
    active
        .into_iter()
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
                share: a.share(),
            }
        })
        .collect()
}

/// The queue, in submission order.
fn queued_jobs(
    rows: &Rows,
    exported: &[(String, i64, String)],
    policy: &Policy,
) -> Vec<commons_sched::QueuedJob> {
    rows.queue()
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
                share: (j.gpu_milli.is_some() || j.gpu_share_memory_mb.is_some()).then(|| {
                    commons_sched::GpuShare {
                        milli: j.gpu_milli.unwrap_or(0).max(0) as u32,
                        memory_mb: j.gpu_share_memory_mb.unwrap_or(0).max(0) as u64,
                    }
                }),
                ..dataset_needs(j, exported)
            }
        })
        .collect()
}

/// What each queued job naming inputs or datasets will fetch when it starts.
pub(crate) fn stage_bytes(c: &mut DbConn, rows: &Rows) -> Result<BTreeMap<i64, u64>, DbError> {
    let (labs, sets) = (&rows.labs, &rows.sets);
    let mut out = BTreeMap::new();
    let fetching: Vec<&QueuedRow> = rows
        .queue()
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
fn owner_return_rates<'a>(
    used: impl Iterator<Item = &'a Held>,
    node_lab: &BTreeMap<i64, i64>,
    utc_offset_s: i32,
) -> BTreeMap<i64, Vec<f64>> {
    let mut counts: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    // In (job, attempt) order (the world's key): an attempt was run again when the
    // next one is of the same job.
    let mut used = used.peekable();
    while let Some(Held {
        attempt: a,
        lab: job_lab,
        ..
    }) = used.next()
    {
        if a.status() != super::models::AttemptStatus::Stopped {
            continue;
        }
        let rerun = used.peek().is_some_and(|n| n.attempt.job_id == a.job_id);
        let guest = node_lab.get(&a.node_id).is_some_and(|l| l != job_lab);
        let (true, true, Some(end)) = (guest, rerun, a.ended_at) else {
            continue;
        };
        count_take_back(&mut counts, a.node_id, end, utc_offset_s);
    }
    smoothed(counts)
}

/// One take-back on `node` at `end`, in its hour of the week.
fn count_take_back(
    counts: &mut BTreeMap<i64, Vec<f64>>,
    node: i64,
    end: chrono::NaiveDateTime,
    utc_offset_s: i32,
) {
    let h = commons_sched::hour_of_week(secs(end), utc_offset_s);
    counts
        .entry(node)
        .or_insert_with(|| vec![0.0; commons_sched::WEEK_HOURS])[h] += 1.0;
}

/// Take-backs per hour of the week, counted over the lookback, as smoothed rates.
fn smoothed(counts: BTreeMap<i64, Vec<f64>>) -> BTreeMap<i64, Vec<f64>> {
    let weeks = LEDGER_LOOKBACK_S as f64 / (7.0 * 86_400.0);
    counts
        .into_iter()
        .map(|(node, c)| (node, commons_sched::smooth_return_rate(&c, weeks)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Attempt, AttemptStatus};
    use crate::types::Json;

    /// Which attempts count, as first written: a map of each job's last attempt, built
    /// from every attempt each round (the rule the single pass must keep).
    fn rates_by_map(
        used: &[Held],
        node_lab: &BTreeMap<i64, i64>,
        offset: i32,
    ) -> BTreeMap<i64, Vec<f64>> {
        let mut last: BTreeMap<i64, i32> = BTreeMap::new();
        for h in used {
            let e = last.entry(h.attempt.job_id).or_insert(h.attempt.attempt);
            *e = (*e).max(h.attempt.attempt);
        }
        let mut counts: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for Held {
            attempt: a, lab, ..
        } in used
        {
            let guest = node_lab.get(&a.node_id).is_some_and(|l| l != lab);
            let rerun = last.get(&a.job_id).is_some_and(|&l| l > a.attempt);
            if !(guest && rerun && a.status() == AttemptStatus::Stopped) {
                continue;
            }
            let Some(end) = a.ended_at else { continue };
            count_take_back(&mut counts, a.node_id, end, offset);
        }
        smoothed(counts)
    }

    fn held(job: i64, attempt: i32, node: i64, lab: i64, state: AttemptStatus, hour: i64) -> Held {
        let t = chrono::DateTime::from_timestamp(1_765_000_000 + hour * 3600, 0)
            .unwrap()
            .naive_utc();
        Held {
            attempt: Attempt {
                id: job * 10 + i64::from(attempt),
                job_id: job,
                attempt,
                node_id: node,
                gpu_ids: Json(vec![node * 8]),
                state,
                lease_until: t,
                created_at: t,
                started_at: Some(t),
                ended_at: (!state.is_active()).then_some(t),
                exit_code: None,
                reason: None,
                share_milli: None,
                share_memory_mb: None,
                gpu_memory_used_mb: None,
            },
            lab,
            user: lab * 100,
        }
    }

    #[test]
    fn a_guest_stopped_and_run_again_counts_once_per_take_back() {
        use AttemptStatus::*;
        // Node 1 is lab 1's, node 2 lab 2's.
        let node_lab = BTreeMap::from([(1, 1), (2, 2)]);
        let used = vec![
            held(10, 1, 1, 2, Stopped, 5), // a guest taken back, run again: counts
            held(10, 2, 2, 2, Running, 6),
            held(11, 1, 1, 2, Stopped, 7), // a guest stopped and not run again
            held(12, 1, 1, 1, Stopped, 8), // the owner's own job
            held(12, 2, 1, 1, Exited, 9),
            held(13, 1, 1, 2, Exited, 9), // a guest that ended by itself
            held(13, 2, 1, 2, Stopped, 10), // taken back twice: both count
            held(13, 3, 1, 2, Stopped, 11),
            held(13, 4, 2, 2, Exited, 12),
        ];
        let rates = owner_return_rates(used.iter(), &node_lab, 0);
        assert_eq!(rates.keys().collect::<Vec<_>>(), vec![&1]);
        assert_eq!(rates, rates_by_map(&used, &node_lab, 0));
        // Generated histories: the same rates as the map's rule.
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..50 {
            let mut used = Vec::new();
            for job in 0..200 {
                for attempt in 1..=(1 + next(4) as i32) {
                    let state = [Stopped, Exited, Failed, Lost, Running][next(5) as usize];
                    let (node, lab) = (1 + next(2) as i64, 1 + next(2) as i64);
                    used.push(held(job, attempt, node, lab, state, next(400) as i64));
                }
            }
            assert_eq!(
                owner_return_rates(used.iter(), &node_lab, 3600),
                rates_by_map(&used, &node_lab, 3600)
            );
        }
    }
}
