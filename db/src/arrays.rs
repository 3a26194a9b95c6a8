//! Job arrays: the array's row and its tasks (jobs with `array_id` and `array_index`),
//! stored in a few batched statements; counts by state; cancelling the unfinished; and
//! the throttle the scheduler's snapshot applies.
//!
//! Invariants:
//! - An array and all its tasks are stored in one transaction, or nothing is.
//! - Tasks are inserted in index order, so within an array a lower index has a lower
//!   job id; the throttle lets the lowest queued ones run first.
//! - No statement comes near either backend's limit on bound parameters (SQLite
//!   32,766; PostgreSQL 65,535): tasks travel as arrays or one JSON text, and history
//!   rows in batches of [`BATCH_ROWS`].

use super::models::{Job, JobState};
use super::schema::*;
use super::types::to_json;
use super::DbError;
use super::{now, DbConn};
use crate::domain::ValidJob;
use chrono::NaiveDateTime;
use diesel::prelude::*;
use diesel::sql_types::{
    Array as SqlArray, BigInt, Bool, Double, Integer, Nullable, Text, Timestamp,
};
use std::collections::{BTreeMap, BTreeSet};

/// Rows per INSERT of history rows when cancelling (4 parameters each, far under
/// SQLite's 32,766).
pub const BATCH_ROWS: usize = 1000;

/// An array's row.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = arrays)]
pub struct Array {
    pub id: i64,
    pub user_id: i64,
    pub lab_id: i64,
    pub spec: String,
    pub task_count: i64,
    pub throttle: Option<i64>,
    pub name: Option<String>,
    pub created_at: NaiveDateTime,
    /// Its first task's job id (none only while it is being stored).
    pub first_job: Option<i64>,
}

/// What one task runs: its index, command and environment (with `{index}` replaced and
/// the `COMMONS_ARRAY_*` variables set by the caller).
pub struct Task {
    pub index: i64,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
}

/// The new array's row (the caller then makes its tasks, which need its id).
pub fn insert_array(
    c: &mut DbConn,
    user: i64,
    v: &ValidJob,
    spec: &str,
    count: i64,
    throttle: Option<i64>,
) -> Result<Array, DbError> {
    let q = diesel::insert_into(arrays::table).values((
        arrays::user_id.eq(user),
        arrays::lab_id.eq(v.lab_id),
        arrays::spec.eq(spec),
        arrays::task_count.eq(count),
        arrays::throttle.eq(throttle),
        arrays::name.eq(&v.name),
        arrays::created_at.eq(now()),
    ));
    Ok(match c {
        DbConn::Pg(c) => q.returning(Array::as_returning()).get_result(c)?,
        DbConn::Sqlite(c) => q.returning(Array::as_returning()).get_result(c)?,
    })
}

/// Binds what every task of an array shares, in [`TASK_COLUMNS_SQL`]'s order.
macro_rules! bind_same {
    ($q:expr, $user:expr, $array:expr, $v:expr) => {{
        let v: &ValidJob = $v;
        $q.bind::<BigInt, _>($user)
            .bind::<BigInt, _>(v.lab_id)
            .bind::<Text, _>(&v.image)
            .bind::<Integer, _>(v.gpus)
            .bind::<Text, _>(to_json(&v.gpu_models)?)
            .bind::<BigInt, _>(v.min_gpu_memory_mb)
            .bind::<Double, _>(v.cpus)
            .bind::<BigInt, _>(v.memory_mb)
            .bind::<BigInt, _>(v.time_limit_s)
            .bind::<Nullable<BigInt>, _>(v.checkpoint_interval_s)
            .bind::<Nullable<BigInt>, _>(v.shm_mb)
            .bind::<Nullable<BigInt>, _>(v.disk_gb)
            .bind::<Nullable<Text>, _>(&v.image_digest)
            .bind::<Nullable<Text>, _>(&v.image_signature)
            .bind::<Bool, _>(v.image_campus)
            .bind::<Text, _>(v.kind)
            .bind::<Timestamp, _>($array.created_at)
            .bind::<Nullable<Text>, _>(&v.name)
            .bind::<Text, _>(to_json(&v.tags)?)
            .bind::<Text, _>(to_json(&v.after)?)
            .bind::<Bool, _>(!v.after.is_empty())
            .bind::<BigInt, _>($array.id)
            .bind::<Text, _>(to_json(&v.inputs)?)
            .bind::<Text, _>(to_json(&v.datasets)?)
            .bind::<Nullable<Integer>, _>(super::jobs::share_columns(v).0)
            .bind::<Nullable<BigInt>, _>(super::jobs::share_columns(v).1)
    }};
}

/// The columns a task's insert fills, in the order of [`insert_tasks`]' statements.
const TASK_COLUMNS_SQL: &str = "user_id, lab_id, image, gpus, gpu_models, min_gpu_memory_mb, \
    cpus, memory_mb, time_limit_s, checkpoint_interval_s, shm_mb, disk_gb, image_digest, \
    image_signature, image_campus, kind, created_at, name, tags, after_jobs, held, array_id, \
    inputs, datasets, gpu_milli, gpu_share_memory_mb, state, array_index, command, env, reason";

/// What differs between an array's tasks, column by column: index, command,
/// environment (as JSON) and reason (tasks beyond the throttle say so from the start).
type TaskColumns = (Vec<i64>, Vec<String>, Vec<String>, Vec<String>);

fn task_columns(array: &Array, v: &ValidJob, tasks: &[Task]) -> Result<TaskColumns, DbError> {
    let waiting = v.after.first();
    let throttled = throttle_text(array.id, array.throttle.unwrap_or(0));
    let mut index = Vec::with_capacity(tasks.len());
    let mut command = Vec::with_capacity(tasks.len());
    let mut env = Vec::with_capacity(tasks.len());
    let mut reason = Vec::with_capacity(tasks.len());
    for (position, t) in tasks.iter().enumerate() {
        index.push(t.index);
        command.push(to_json(&t.command)?);
        env.push(to_json(&t.env)?);
        reason.push(match (waiting, array.throttle) {
            (Some(w), _) => super::deps::waiting_text(w, Some(t.index)),
            (None, Some(limit)) if position as i64 >= limit => throttled.clone(),
            _ => "waiting for the scheduler".to_string(),
        });
    }
    Ok((index, command, env, reason))
}

/// Stores `tasks` of `array` as queued jobs made from `v`, with their "submitted" history
/// rows, and returns their ids in index order; the caller runs it in the array's
/// transaction. Whatever the array's size this is a handful of statements with a fixed
/// number of parameters: what differs between tasks (index, command, environment,
/// reason) travels as arrays (PostgreSQL's `unnest`) or one JSON text (SQLite's
/// `json_each`), so neither backend's limit on bound parameters is ever near. Tasks
/// beyond the throttle say so from the start.
pub fn insert_tasks(
    c: &mut DbConn,
    user: i64,
    array: &Array,
    v: &ValidJob,
    tasks: &[Task],
) -> Result<Vec<i64>, DbError> {
    let (index, command, env, reason) = task_columns(array, v, tasks)?;
    let queued = JobState::Queued.as_str();
    // The same for every task: $1..$26 (PostgreSQL) or the first 26 `?` (SQLite).
    let same = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
                $18, $19, $20, $21, $22, $23, $24, $25, $26";
    match c {
        DbConn::Pg(pg) => {
            let q = diesel::sql_query(format!(
                "INSERT INTO jobs ({TASK_COLUMNS_SQL}) \
                 SELECT {same}, '{queued}', t.i, t.c, t.e, t.r \
                 FROM unnest($27::bigint[], $28::text[], $29::text[], $30::text[]) \
                   WITH ORDINALITY AS t(i, c, e, r, n) ORDER BY t.n"
            ));
            bind_same!(q, user, array, v)
                .bind::<SqlArray<BigInt>, _>(&index)
                .bind::<SqlArray<Text>, _>(&command)
                .bind::<SqlArray<Text>, _>(&env)
                .bind::<SqlArray<Text>, _>(&reason)
                .execute(pg)?;
        }
        DbConn::Sqlite(lite) => {
            let rows: Vec<serde_json::Value> = (0..tasks.len())
                .map(|k| {
                    serde_json::json!({"i": index[k], "c": command[k], "e": env[k], "r": reason[k]})
                })
                .collect();
            let same = same.split(", ").map(|_| "?").collect::<Vec<_>>().join(", ");
            let q = diesel::sql_query(format!(
                "INSERT INTO jobs ({TASK_COLUMNS_SQL}) \
                 SELECT {same}, '{queued}', json_extract(t.value, '$.i'), \
                   json_extract(t.value, '$.c'), json_extract(t.value, '$.e'), \
                   json_extract(t.value, '$.r') \
                 FROM json_each(?) AS t ORDER BY t.key"
            ));
            bind_same!(q, user, array, v)
                .bind::<Text, _>(to_json(&rows)?)
                .execute(lite)?;
        }
    }
    // Every task's "submitted" row, in one statement.
    let submitted = jobs::table.filter(jobs::array_id.eq(array.id)).select((
        jobs::id,
        jobs::created_at,
        jobs::state,
        diesel::dsl::sql::<Text>("'submitted'"),
    ));
    diesel::insert_into(job_events::table)
        .values(submitted)
        .into_columns((
            job_events::job_id,
            job_events::at,
            job_events::state,
            job_events::message,
        ))
        .execute(c)?;
    let ids = task_ids(c, array.id)?;
    diesel::update(arrays::table.find(array.id))
        .set(arrays::first_job.eq(ids.first().copied()))
        .execute(c)?;
    Ok(ids)
}

/// What a task kept back by its array's throttle says.
pub fn throttle_text(array: i64, limit: i64) -> String {
    format!("array throttle: at most {limit} tasks of array {array} run at once")
}

/// An array's row.
pub fn get(c: &mut DbConn, id: i64) -> Result<Array, DbError> {
    arrays::table
        .find(id)
        .select(Array::as_select())
        .first(c)
        .optional()?
        .ok_or(DbError::NotFound("array"))
}

/// The job ids of an array's tasks, in index order.
pub fn task_ids(c: &mut DbConn, array: i64) -> Result<Vec<i64>, DbError> {
    Ok(jobs::table
        .filter(jobs::array_id.eq(array))
        .order(jobs::array_index)
        .select(jobs::id)
        .load(c)?)
}

/// How many of an array's tasks are in each state.
pub fn counts(c: &mut DbConn, array: i64) -> Result<BTreeMap<JobState, i64>, DbError> {
    let rows: Vec<(JobState, i64)> = jobs::table
        .filter(jobs::array_id.eq(array))
        .group_by(jobs::state)
        .select((jobs::state, diesel::dsl::count_star()))
        .load(c)?;
    Ok(rows.into_iter().collect())
}

/// The counts by state of several arrays (one query): `array -> state -> n`.
pub fn counts_of(
    c: &mut DbConn,
    arrays: &[i64],
) -> Result<BTreeMap<i64, BTreeMap<JobState, i64>>, DbError> {
    let rows: Vec<(Option<i64>, JobState, i64)> = jobs::table
        .filter(jobs::array_id.eq_any(arrays))
        .group_by((jobs::array_id, jobs::state))
        .select((jobs::array_id, jobs::state, diesel::dsl::count_star()))
        .load(c)?;
    let mut out: BTreeMap<i64, BTreeMap<JobState, i64>> = BTreeMap::new();
    for (a, s, n) in rows {
        if let Some(a) = a {
            out.entry(a).or_default().insert(s, n);
        }
    }
    Ok(out)
}

/// The rows of `ids` (those that exist).
pub fn by_ids(c: &mut DbConn, ids: &[i64]) -> Result<Vec<Array>, DbError> {
    Ok(arrays::table
        .filter(arrays::id.eq_any(ids))
        .select(Array::as_select())
        .load(c)?)
}

/// An array's tasks that have not ended, in index order (what cancelling it stops).
pub fn unfinished(c: &mut DbConn, array: i64) -> Result<Vec<Job>, DbError> {
    let ended = [JobState::Succeeded, JobState::Failed, JobState::Cancelled];
    Ok(jobs::table
        .filter(jobs::array_id.eq(array))
        .filter(jobs::state.ne_all(ended))
        .order(jobs::array_index)
        .select(Job::as_select())
        .load(c)?)
}

/// Cancels an array's queued tasks in a few statements (their reason cleared, a
/// history row each); returns how many. Tasks that start or run are cancelled one by
/// one by the caller (their containers must be stopped).
pub fn cancel_queued(c: &mut DbConn, array: i64, by: &str) -> Result<usize, DbError> {
    crate::transaction(c, |c| {
        let ids: Vec<i64> = jobs::table
            .filter(jobs::array_id.eq(array))
            .filter(jobs::state.eq(JobState::Queued))
            .select(jobs::id)
            .load(c)?;
        let t = now();
        let message = format!("cancelled by {by}");
        for chunk in ids.chunks(5000) {
            diesel::update(
                jobs::table
                    .filter(jobs::id.eq_any(chunk))
                    .filter(jobs::state.eq(JobState::Queued)),
            )
            .set((
                jobs::state.eq(JobState::Cancelled),
                jobs::reason.eq(None::<String>),
                jobs::finished_at.eq(t),
            ))
            .execute(c)?;
            let rows: Vec<_> = chunk
                .iter()
                .map(|&id| {
                    (
                        job_events::job_id.eq(id),
                        job_events::at.eq(t),
                        job_events::state.eq(JobState::Cancelled),
                        job_events::message.eq(&message),
                    )
                })
                .collect();
            for rows in rows.chunks(BATCH_ROWS) {
                let q = diesel::insert_into(job_events::table).values(rows);
                match c {
                    DbConn::Pg(c) => q.execute(c)?,
                    DbConn::Sqlite(c) => q.execute(c)?,
                };
            }
        }
        Ok(ids.len())
    })
}

/// For the scheduler's snapshot: of the queued jobs `queued` (job id, array id, in id
/// order), those its array's throttle keeps back this round. An array with a throttle
/// of N lets its lowest queued tasks in until N of its tasks start, run or are in the
/// snapshot's queue.
pub fn throttled(c: &mut DbConn, queued: &[(i64, Option<i64>)]) -> Result<BTreeSet<i64>, DbError> {
    let mut ids: Vec<i64> = queued.iter().filter_map(|&(_, a)| a).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(BTreeSet::new());
    }
    let limits: BTreeMap<i64, i64> = arrays::table
        .filter(arrays::id.eq_any(&ids))
        .filter(arrays::throttle.is_not_null())
        .select((arrays::id, arrays::throttle))
        .load::<(i64, Option<i64>)>(c)?
        .into_iter()
        .filter_map(|(a, t)| t.map(|t| (a, t)))
        .collect();
    if limits.is_empty() {
        return Ok(BTreeSet::new());
    }
    let limited: Vec<i64> = limits.keys().copied().collect();
    let active = [JobState::Starting, JobState::Running, JobState::Preempting];
    let running: BTreeMap<i64, i64> = jobs::table
        .filter(jobs::array_id.eq_any(&limited))
        .filter(jobs::state.eq_any(active))
        .group_by(jobs::array_id)
        .select((jobs::array_id, diesel::dsl::count_star()))
        .load::<(Option<i64>, i64)>(c)?
        .into_iter()
        .filter_map(|(a, n)| a.map(|a| (a, n)))
        .collect();
    Ok(keep_back(queued, &limits, &running))
}

/// The pure part of [`throttled`]: goes through the queue in id order, letting each
/// throttled array's tasks in while it has room.
pub fn keep_back(
    queued: &[(i64, Option<i64>)],
    limits: &BTreeMap<i64, i64>,
    running: &BTreeMap<i64, i64>,
) -> BTreeSet<i64> {
    let mut used = running.clone();
    let mut out = BTreeSet::new();
    for &(job, array) in queued {
        let Some(a) = array else { continue };
        let Some(&limit) = limits.get(&a) else {
            continue;
        };
        let n = used.entry(a).or_insert(0);
        if *n < limit {
            *n += 1;
        } else {
            out.insert(job);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_lets_the_lowest_tasks_in_while_there_is_room() {
        let queued = [
            (10, Some(1)),
            (11, Some(1)),
            (12, Some(1)),
            (20, None),
            (30, Some(2)),
            (31, Some(2)),
            (40, Some(3)),
        ];
        let limits = BTreeMap::from([(1, 3), (2, 1)]);
        let running = BTreeMap::from([(1, 2)]);
        let kept = keep_back(&queued, &limits, &running);
        // Array 1: 2 run, one more may; array 2: one; array 3 has no throttle.
        assert_eq!(kept, BTreeSet::from([11, 12, 31]));
    }
}
