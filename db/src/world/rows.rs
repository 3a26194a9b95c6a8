//! The rows the scheduler's world is made of, kept by key so that a round can replace
//! just the ones its changes name: read in full at the start ([`Rows::load`]), then
//! patched ([`Rows::reload`]).

use super::changes::Changes;
use crate::checkpoints::AttemptCheckpoints;
use crate::datasets::DatasetRow;
use crate::models::{Attempt, AttemptStatus, Gpu, JobState, Lab, Node};
use crate::schema::*;
use crate::types::Json;
use crate::{DbConn, DbError};
use commons_sched::Quota;
use diesel::expression::SqlLiteral;
use diesel::prelude::*;
use diesel::sql_types::{Integer, Nullable, Timestamp};
use std::collections::{BTreeMap, BTreeSet};

/// How far back the fair-share ledgers look (eight half-lives of a week: < 0.4%).
pub const LEDGER_LOOKBACK_S: i64 = 8 * 7 * 24 * 3600;

/// The attempts of the jobs `$ids` (a `Vec<i64>`) with their jobs' lab and user, in one
/// statement. The ids go on both sides of the join: with the jobs' side unfiltered,
/// PostgreSQL planning with statistics from before a wave of starts (a few attempts,
/// many jobs) hashed every job (a scan of 50,000 rows, 20-90 ms a round in the load
/// test) instead of looking 500 jobs up by key (`tests::reload_looks_jobs_up_by_key`).
macro_rules! attempts_of_jobs {
    ($ids:expr) => {{
        use $crate::schema::{job_attempts, jobs};
        let ids: Vec<i64> = $ids;
        job_attempts::table
            .inner_join(jobs::table)
            .filter(job_attempts::job_id.eq_any(ids.clone()))
            .filter(jobs::id.eq_any(ids))
            .select((
                <$crate::models::Attempt as diesel::SelectableHelper<_>>::as_select(),
                jobs::lab_id,
                jobs::user_id,
            ))
    }};
}
#[cfg(test)]
pub(crate) use attempts_of_jobs;

/// A queued job as the scheduler needs it (not its image, command or environment), and
/// what it shows while it waits.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = jobs)]
pub(crate) struct QueuedRow {
    pub id: i64,
    pub user_id: i64,
    pub lab_id: i64,
    pub gpus: i32,
    pub gpu_models: Json<Vec<String>>,
    pub min_gpu_memory_mb: i64,
    pub cpus: f64,
    pub memory_mb: i64,
    pub disk_gb: Option<i64>,
    pub time_limit_s: i64,
    pub kind: crate::domain::JobKind,
    pub created_at: chrono::NaiveDateTime,
    pub reason: Option<String>,
    /// From `job_places`, filled in after the job's row is read ([`fill_places`]).
    #[diesel(
        select_expression = diesel::dsl::sql::<Nullable<Integer>>("NULL"),
        select_expression_type = SqlLiteral<Nullable<Integer>>
    )]
    pub queue_position: Option<i32>,
    /// Likewise.
    #[diesel(
        select_expression = diesel::dsl::sql::<Nullable<Timestamp>>("NULL"),
        select_expression_type = SqlLiteral<Nullable<Timestamp>>
    )]
    pub estimated_start_at: Option<chrono::NaiveDateTime>,
    pub array_id: Option<i64>,
    /// JSON; read only when not `[]` (almost every job names no dataset).
    pub datasets: String,
    /// JSON, likewise.
    pub inputs: String,
    pub gpu_milli: Option<i32>,
    pub gpu_share_memory_mb: Option<i64>,
}

/// Lab, user, time limit, CPUs and memory of a job whose attempt holds GPUs.
pub(crate) type JobOf = (i64, i64, i64, f64, i64);

/// An attempt with its job's lab and user.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub attempt: Attempt,
    pub lab: i64,
    pub user: i64,
}

/// Every row the snapshot is built from.
#[derive(Default)]
pub(crate) struct Rows {
    /// Nodes not revoked.
    pub nodes: BTreeMap<i64, Node>,
    pub gpus: BTreeMap<i64, Gpu>,
    /// By (job, attempt): the attempts that hold GPUs, and those that used GPUs within
    /// the ledgers' reach.
    pub attempts: BTreeMap<(i64, i32), Held>,
    /// Queued jobs not held back by dependencies.
    pub queued: BTreeMap<i64, QueuedRow>,
    /// Queued tasks over their array's throttle (left out like held jobs).
    pub throttled: BTreeSet<i64>,
    /// Per queued job: how often its guest attempts were taken back, and the last time.
    pub take_backs: BTreeMap<i64, (u32, i64)>,
    pub labs: Vec<Lab>,
    pub members: Vec<(i64, i64, Json<Quota>)>,
    /// For the jobs whose attempts hold GPUs.
    pub job_of: BTreeMap<i64, JobOf>,
    /// Each active attempt's latest checkpoint and the job's latest known write time.
    pub checkpointed: BTreeMap<(i64, i32), AttemptCheckpoints>,
    /// Every dataset with its lab's slug.
    pub sets: Vec<(DatasetRow, String)>,
    /// What each queued job that names inputs or datasets will fetch at its start.
    pub stage_bytes: BTreeMap<i64, u64>,
}

/// Sets the queued jobs' places and estimates from `job_places` rows (job, place,
/// estimate); a job without a row has none.
fn fill_places(queued: &mut BTreeMap<i64, QueuedRow>, places: Vec<crate::plan::Place>) {
    for (job, position, estimate) in places {
        if let Some(j) = queued.get_mut(&job) {
            j.queue_position = position;
            j.estimated_start_at = estimate;
        }
    }
}

pub(crate) fn secs(t: chrono::NaiveDateTime) -> i64 {
    t.and_utc().timestamp()
}

/// Whether the world keeps an attempt: it holds GPUs, or it used them after `since`.
fn kept(a: &Attempt, since: chrono::NaiveDateTime) -> bool {
    AttemptStatus::ACTIVE.contains(&a.status())
        || (a.started_at.is_some() && a.ended_at.is_none_or(|e| e > since))
}

impl Rows {
    /// Reads every row, at `t` (the caller's transaction).
    pub fn load(c: &mut DbConn, t: chrono::NaiveDateTime) -> Result<Rows, DbError> {
        let since = t - chrono::Duration::seconds(LEDGER_LOOKBACK_S);
        let nodes = nodes::table
            .filter(nodes::revoked_at.is_null())
            .select(Node::as_select())
            .load::<Node>(c)?
            .into_iter()
            .map(|n| (n.id, n))
            .collect();
        let gpus = gpus::table
            .select(Gpu::as_select())
            .load::<Gpu>(c)?
            .into_iter()
            .map(|g| (g.id, g))
            .collect();
        let mut queued: BTreeMap<i64, QueuedRow> = jobs::table
            .filter(jobs::state.eq(JobState::Queued))
            // Jobs that wait for other jobs are not planned until released (`deps`).
            .filter(diesel::dsl::not(jobs::held))
            .select(QueuedRow::as_select())
            .load::<QueuedRow>(c)?
            .into_iter()
            .map(|j| (j.id, j))
            .collect();
        let attempts = job_attempts::table
            .inner_join(jobs::table)
            .filter(
                job_attempts::state
                    .eq_any(AttemptStatus::ACTIVE)
                    .or(job_attempts::started_at.is_not_null().and(
                        job_attempts::ended_at
                            .is_null()
                            .or(job_attempts::ended_at.gt(since)),
                    )),
            )
            .select((Attempt::as_select(), jobs::lab_id, jobs::user_id))
            .load::<(Attempt, i64, i64)>(c)?
            .into_iter()
            .map(|(a, lab, user)| {
                let key = (a.job_id, a.attempt);
                (
                    key,
                    Held {
                        attempt: a,
                        lab,
                        user,
                    },
                )
            })
            .collect();
        fill_places(&mut queued, crate::plan::all_places(c)?);
        // The rest looks rows up by the keys read so far.
        super::by_key(c, true)?;
        let take_backs = take_backs(c, &queued, queued.keys().copied())?;
        let mut rows = Rows {
            nodes,
            gpus,
            attempts,
            queued,
            take_backs,
            ..Rows::default()
        };
        rows.reload_small_tables(c, true, true, true)?;
        let active: Vec<i64> = rows.active_jobs().collect();
        rows.job_of = job_of(c, &active)?;
        let pairs: Vec<(i64, i32)> = rows.active().map(|a| (a.job_id, a.attempt)).collect();
        rows.checkpointed = crate::checkpoints::for_attempts(c, &pairs)?;
        rows.derive(c)?;
        super::by_key(c, false)?;
        Ok(rows)
    }

    /// Reads again what `ch` names, at `t`, and drops attempts that left the ledgers'
    /// reach; every read by key ([`super::by_key`]), like the full read's lookups.
    pub fn reload(
        &mut self,
        c: &mut DbConn,
        ch: &Changes,
        t: chrono::NaiveDateTime,
    ) -> Result<(), DbError> {
        super::by_key(c, true)?;
        self.reload_by_key(c, ch, t)?;
        super::by_key(c, false)
    }

    fn reload_by_key(
        &mut self,
        c: &mut DbConn,
        ch: &Changes,
        t: chrono::NaiveDateTime,
    ) -> Result<(), DbError> {
        let since = t - chrono::Duration::seconds(LEDGER_LOOKBACK_S);
        if !ch.nodes.is_empty() {
            for id in &ch.nodes {
                self.nodes.remove(id);
            }
            for ids in chunks(&ch.nodes) {
                let found: Vec<Node> = nodes::table
                    .filter(nodes::id.eq_any(ids))
                    .filter(nodes::revoked_at.is_null())
                    .select(Node::as_select())
                    .load(c)?;
                self.nodes.extend(found.into_iter().map(|n| (n.id, n)));
            }
        }
        if !ch.gpus.is_empty() {
            for id in &ch.gpus {
                self.gpus.remove(id);
            }
            for ids in chunks(&ch.gpus) {
                let found: Vec<Gpu> = gpus::table
                    .filter(gpus::id.eq_any(ids))
                    .select(Gpu::as_select())
                    .load(c)?;
                self.gpus.extend(found.into_iter().map(|g| (g.id, g)));
            }
        }
        for id in &ch.jobs {
            self.queued.remove(id);
        }
        for ids in chunks(&ch.jobs) {
            // State and hold are tested here: in the statement, statistics from before a
            // burst of submissions took the index on states for selective and read every
            // queued job for each chunk of ids.
            let found: Vec<(QueuedRow, JobState, bool)> = jobs::table
                .filter(jobs::id.eq_any(&ids))
                .select((QueuedRow::as_select(), jobs::state, jobs::held))
                .load(c)?;
            self.queued.extend(
                found
                    .into_iter()
                    .filter(|(_, state, held)| *state == JobState::Queued && !held)
                    .map(|(j, ..)| (j.id, j)),
            );
            fill_places(&mut self.queued, crate::plan::places(c, &ids)?);
        }
        for job in &ch.attempts {
            let keys: Vec<(i64, i32)> = self
                .attempts
                .range((*job, i32::MIN)..=(*job, i32::MAX))
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                self.attempts.remove(&k);
            }
        }
        for ids in chunks(&ch.attempts) {
            let found: Vec<(Attempt, i64, i64)> = attempts_of_jobs!(ids).load(c)?;
            for (a, lab, user) in found.into_iter().filter(|(a, ..)| kept(a, since)) {
                self.attempts.insert(
                    (a.job_id, a.attempt),
                    Held {
                        attempt: a,
                        lab,
                        user,
                    },
                );
            }
        }
        self.attempts.retain(|_, h| kept(&h.attempt, since));
        // What depends on a job's row or its attempts.
        let touched: BTreeSet<i64> = ch.jobs.union(&ch.attempts).copied().collect();
        if !touched.is_empty() {
            let ids: Vec<i64> = touched.iter().copied().collect();
            for id in &ids {
                self.take_backs.remove(id);
                self.job_of.remove(id);
            }
            self.take_backs
                .extend(take_backs(c, &self.queued, ids.iter().copied())?);
            let active: BTreeSet<i64> = self.active_jobs().collect();
            let holding: Vec<i64> = ids.into_iter().filter(|id| active.contains(id)).collect();
            self.job_of.extend(job_of(c, &holding)?);
        }
        let refresh: BTreeSet<i64> = ch.checkpoints.union(&ch.attempts).copied().collect();
        if !refresh.is_empty() {
            self.checkpointed
                .retain(|(job, _), _| !refresh.contains(job));
            let pairs: Vec<(i64, i32)> = self
                .active()
                .filter(|a| refresh.contains(&a.job_id))
                .map(|a| (a.job_id, a.attempt))
                .collect();
            self.checkpointed
                .extend(crate::checkpoints::for_attempts(c, &pairs)?);
        }
        // Datasets carry their lab's slug.
        self.reload_small_tables(c, ch.labs, ch.memberships, ch.datasets || ch.labs)?;
        self.derive(c)
    }

    fn reload_small_tables(
        &mut self,
        c: &mut DbConn,
        labs: bool,
        memberships: bool,
        datasets: bool,
    ) -> Result<(), DbError> {
        if labs {
            self.labs = labs::table
                .order(labs::id)
                .select(Lab::as_select())
                .load(c)?;
        }
        if memberships {
            self.members = memberships::table
                .order((memberships::lab_id, memberships::user_id))
                .select((
                    memberships::lab_id,
                    memberships::user_id,
                    memberships::quota,
                ))
                .load(c)?;
        }
        if datasets {
            self.sets = crate::datasets::all(c)?;
        }
        Ok(())
    }

    /// What is read again every round, being cheap or rare: the arrays' throttles and
    /// the bytes the jobs naming inputs or datasets will fetch (files come and go).
    fn derive(&mut self, c: &mut DbConn) -> Result<(), DbError> {
        let tasks: Vec<(i64, Option<i64>)> = self
            .queued
            .values()
            .filter(|j| j.array_id.is_some())
            .map(|j| (j.id, j.array_id))
            .collect();
        self.throttled = crate::arrays::throttled(c, &tasks)?;
        self.stage_bytes = crate::snapshot::stage_bytes(c, self)?;
        Ok(())
    }

    /// The attempts that hold GPUs (starting, running or stopping), by (job, attempt).
    pub fn active(&self) -> impl Iterator<Item = &Attempt> {
        self.attempts
            .values()
            .map(|h| &h.attempt)
            .filter(|a| AttemptStatus::ACTIVE.contains(&a.status()))
    }

    fn active_jobs(&self) -> impl Iterator<Item = i64> + '_ {
        self.active().map(|a| a.job_id)
    }

    /// The queue as the scheduler plans it: queued, not held, not throttled.
    pub fn queue(&self) -> impl Iterator<Item = &QueuedRow> {
        self.queued
            .values()
            .filter(|j| !self.throttled.contains(&j.id))
    }

    /// Attempts that used GPUs after `since`, with their jobs' lab and user.
    pub fn used(&self, since: chrono::NaiveDateTime) -> impl Iterator<Item = &Held> + Clone {
        self.attempts.values().filter(move |h| {
            h.attempt.started_at.is_some() && h.attempt.ended_at.is_none_or(|e| e > since)
        })
    }
}

fn chunks(ids: &BTreeSet<i64>) -> Vec<Vec<i64>> {
    let all: Vec<i64> = ids.iter().copied().collect();
    all.chunks(crate::IDS_PER_QUERY)
        .map(<[i64]>::to_vec)
        .collect()
}

/// Lab, user, time limit, CPUs and memory of the jobs `ids`.
fn job_of(c: &mut DbConn, ids: &[i64]) -> Result<BTreeMap<i64, JobOf>, DbError> {
    let mut out = BTreeMap::new();
    for ids in ids.chunks(crate::IDS_PER_QUERY) {
        let found: Vec<(i64, i64, i64, i64, f64, i64)> = jobs::table
            .filter(jobs::id.eq_any(ids))
            .select((
                jobs::id,
                jobs::lab_id,
                jobs::user_id,
                jobs::time_limit_s,
                jobs::cpus,
                jobs::memory_mb,
            ))
            .load(c)?;
        out.extend(
            found
                .into_iter()
                .map(|(id, lab, user, limit, cpus, mem)| (id, (lab, user, limit, cpus, mem))),
        );
    }
    Ok(out)
}

/// Per queued job of `ids` (the world's): how often its guest attempts were taken
/// back, and the last time.
fn take_backs(
    c: &mut DbConn,
    queued: &BTreeMap<i64, QueuedRow>,
    ids: impl Iterator<Item = i64>,
) -> Result<BTreeMap<i64, (u32, i64)>, DbError> {
    let labs: BTreeMap<i64, i64> = ids
        .filter_map(|id| queued.get(&id).map(|j| (id, j.lab_id)))
        .collect();
    if labs.is_empty() {
        return Ok(BTreeMap::new());
    }
    Ok(crate::attempts::take_backs(c, &labs)?
        .into_iter()
        .map(|(job, (n, last))| (job, (n, secs(last))))
        .collect())
}
