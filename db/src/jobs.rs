//! Jobs: creation, reading, history, logs and cancellation.
//!
//! Every state change of a job goes through [`set_state`], which writes the event row in
//! the same transaction: the history in the UI is complete by construction.

use super::models::{Attempt, Job, JobEvent, JobState};
use super::schema::*;
use super::types::to_json;
use super::DbError;
use super::{now, DbConn};
use crate::domain::ValidJob;
use diesel::prelude::*;

/// Most log bytes kept per job; later output is dropped with a note.
pub const MAX_LOG_BYTES: i64 = 4 * 1024 * 1024;

pub fn add_event(c: &mut DbConn, job: i64, state: JobState, message: &str) -> Result<(), DbError> {
    diesel::insert_into(job_events::table)
        .values((
            job_events::job_id.eq(job),
            job_events::at.eq(now()),
            job_events::state.eq(state),
            job_events::message.eq(message),
        ))
        .execute(c)?;
    Ok(())
}

/// Moves a job to `state` and records why.
pub fn set_state(c: &mut DbConn, job: i64, state: JobState, message: &str) -> Result<(), DbError> {
    let t = now();
    diesel::update(jobs::table.find(job))
        .set(jobs::state.eq(state))
        .execute(c)?;
    if state.is_final() {
        diesel::update(jobs::table.find(job))
            .set(jobs::finished_at.eq(t))
            .execute(c)?;
    }
    add_event(c, job, state, message)
}

pub fn insert(c: &mut DbConn, user: i64, v: &ValidJob) -> Result<Job, DbError> {
    let command = to_json(&v.command)?;
    let env = to_json(&v.env)?;
    let models = to_json(&v.gpu_models)?;
    let tags = to_json(&v.tags)?;
    let after = to_json(&v.after)?;
    let inputs = to_json(&v.inputs)?;
    let datasets = to_json(&v.datasets)?;
    let created_at = now();
    // A job that waits for others is held out of the queue until they have ended; it says
    // what it waits for from the start.
    let held = !v.after.is_empty();
    let (milli, share_memory) = share_columns(v);
    let waiting_for = v.after.first().map(|a| super::deps::waiting_text(a, None));
    let reason = waiting_for
        .as_deref()
        .unwrap_or("waiting for the scheduler");
    if let DbConn::Pg(pg) = c {
        // PostgreSQL: the job and its history row in one statement (atomic by itself),
        // one round trip instead of four (BEGIN, two INSERTs, COMMIT).
        use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, Text, Timestamp};
        return Ok(diesel::sql_query(format!(
            "WITH j AS (INSERT INTO jobs (user_id, lab_id, image, command, env, gpus, \
                 gpu_models, min_gpu_memory_mb, cpus, memory_mb, time_limit_s, \
                 checkpoint_interval_s, shm_mb, image_digest, image_signature, image_campus, kind, \
                 state, reason, created_at, disk_gb, name, tags, after_jobs, held, inputs, datasets, \
                 gpu_milli, gpu_share_memory_mb) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                 $16, $17, '{queued}', $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28) \
               RETURNING *), \
             e AS (INSERT INTO job_events (job_id, at, state, message) \
               SELECT id, created_at, state, 'submitted' FROM j) \
             SELECT * FROM j",
            queued = JobState::Queued.as_str()
        ))
        .bind::<BigInt, _>(user)
        .bind::<BigInt, _>(v.lab_id)
        .bind::<Text, _>(&v.image)
        .bind::<Text, _>(&command)
        .bind::<Text, _>(&env)
        .bind::<Integer, _>(v.gpus)
        .bind::<Text, _>(&models)
        .bind::<BigInt, _>(v.min_gpu_memory_mb)
        .bind::<Double, _>(v.cpus)
        .bind::<BigInt, _>(v.memory_mb)
        .bind::<BigInt, _>(v.time_limit_s)
        .bind::<Nullable<BigInt>, _>(v.checkpoint_interval_s)
        .bind::<Nullable<BigInt>, _>(v.shm_mb)
        .bind::<Nullable<Text>, _>(&v.image_digest)
        .bind::<Nullable<Text>, _>(&v.image_signature)
        .bind::<Bool, _>(v.image_campus)
        .bind::<Text, _>(v.kind)
        .bind::<Text, _>(reason)
        .bind::<Timestamp, _>(created_at)
        .bind::<Nullable<BigInt>, _>(v.disk_gb)
        .bind::<Nullable<Text>, _>(&v.name)
        .bind::<Text, _>(&tags)
        .bind::<Text, _>(&after)
        .bind::<Bool, _>(held)
        .bind::<Text, _>(&inputs)
        .bind::<Text, _>(&datasets)
        .bind::<Nullable<Integer>, _>(milli)
        .bind::<Nullable<BigInt>, _>(share_memory)
        .get_result::<Job>(pg)?);
    }
    crate::transaction(c, |c| {
        let insert = diesel::insert_into(jobs::table).values((
            jobs::user_id.eq(user),
            jobs::lab_id.eq(v.lab_id),
            jobs::image.eq(&v.image),
            jobs::command.eq(&command),
            jobs::env.eq(&env),
            jobs::gpus.eq(v.gpus),
            jobs::gpu_models.eq(&models),
            jobs::min_gpu_memory_mb.eq(v.min_gpu_memory_mb),
            jobs::cpus.eq(v.cpus),
            jobs::memory_mb.eq(v.memory_mb),
            jobs::time_limit_s.eq(v.time_limit_s),
            jobs::checkpoint_interval_s.eq(v.checkpoint_interval_s),
            jobs::shm_mb.eq(v.shm_mb),
            jobs::disk_gb.eq(v.disk_gb),
            jobs::image_digest.eq(&v.image_digest),
            jobs::image_signature.eq(&v.image_signature),
            jobs::image_campus.eq(v.image_campus),
            jobs::kind.eq(v.kind),
            jobs::state.eq(JobState::Queued),
            jobs::reason.eq(Some(reason)),
            jobs::created_at.eq(created_at),
            jobs::name.eq(&v.name),
            jobs::tags.eq(&tags),
            jobs::after_jobs.eq(&after),
            jobs::held.eq(held),
            jobs::inputs.eq(&inputs),
            jobs::datasets.eq(&datasets),
            jobs::gpu_milli.eq(milli),
            jobs::gpu_share_memory_mb.eq(share_memory),
        ));
        // The stored row comes back with the insert: no second read.
        let job: Job = match c {
            DbConn::Pg(c) => insert.returning(Job::as_returning()).get_result(c)?,
            DbConn::Sqlite(c) => insert.returning(Job::as_returning()).get_result(c)?,
        };
        add_event(c, job.id, JobState::Queued, "submitted")?;
        Ok(job)
    })
}

/// The share columns of a job: (`gpu_milli`, `gpu_share_memory_mb`).
pub(crate) fn share_columns(v: &ValidJob) -> (Option<i32>, Option<i64>) {
    match v.gpu_share {
        Some((milli, memory)) => (Some(milli as i32), Some(memory as i64)),
        None => (None, None),
    }
}

/// Sets a job's time limit (an extension; the caller checks the rules).
pub fn set_time_limit(c: &mut DbConn, id: i64, limit_s: i64) -> Result<(), DbError> {
    diesel::update(jobs::table.find(id))
        .set(jobs::time_limit_s.eq(limit_s))
        .execute(c)?;
    Ok(())
}

/// The time limits of `jobs`, by job id (one query).
pub fn time_limits(
    c: &mut DbConn,
    jobs: &[i64],
) -> Result<std::collections::BTreeMap<i64, i64>, DbError> {
    Ok(jobs::table
        .filter(jobs::id.eq_any(jobs))
        .select((jobs::id, jobs::time_limit_s))
        .load::<(i64, i64)>(c)?
        .into_iter()
        .collect())
}

/// The jobs `ids` that exist (one query), in id order.
pub fn by_ids(c: &mut DbConn, ids: &[i64]) -> Result<Vec<Job>, DbError> {
    Ok(jobs::table
        .filter(jobs::id.eq_any(ids))
        .order(jobs::id)
        .select(Job::as_select())
        .load(c)?)
}

pub fn get(c: &mut DbConn, id: i64) -> Result<Job, DbError> {
    jobs::table
        .find(id)
        .select(Job::as_select())
        .first(c)
        .optional()?
        .ok_or(DbError::NotFound("job"))
}

pub fn list_for_user(c: &mut DbConn, user: i64, limit: i64) -> Result<Vec<Job>, DbError> {
    Ok(jobs::table
        .filter(jobs::user_id.eq(user))
        .order(jobs::id.desc())
        .limit(limit)
        .select(Job::as_select())
        .load(c)?)
}

/// A lab's latest jobs, newest first (its admins' `commons ls --all`).
pub fn list_for_lab(c: &mut DbConn, lab: i64, limit: i64) -> Result<Vec<Job>, DbError> {
    Ok(jobs::table
        .filter(jobs::lab_id.eq(lab))
        .order(jobs::id.desc())
        .limit(limit)
        .select(Job::as_select())
        .load(c)?)
}

/// The latest attempt of each of `jobs` (one query).
pub fn last_attempts(c: &mut DbConn, jobs: &[i64]) -> Result<Vec<Attempt>, DbError> {
    let all: Vec<Attempt> = job_attempts::table
        .filter(job_attempts::job_id.eq_any(jobs))
        .order((job_attempts::job_id, job_attempts::attempt))
        .select(Attempt::as_select())
        .load(c)?;
    let mut last: Vec<Attempt> = Vec::new();
    for a in all {
        match last.last_mut() {
            Some(l) if l.job_id == a.job_id => *l = a,
            _ => last.push(a),
        }
    }
    Ok(last)
}

pub fn events(c: &mut DbConn, job: i64) -> Result<Vec<JobEvent>, DbError> {
    Ok(job_events::table
        .filter(job_events::job_id.eq(job))
        .order(job_events::id)
        .select(JobEvent::as_select())
        .load(c)?)
}

pub fn attempts(c: &mut DbConn, job: i64) -> Result<Vec<Attempt>, DbError> {
    Ok(job_attempts::table
        .filter(job_attempts::job_id.eq(job))
        .order(job_attempts::attempt)
        .select(Attempt::as_select())
        .load(c)?)
}

/// The job's output, all attempts in order, at most the last `tail` bytes.
pub fn logs(c: &mut DbConn, job: i64, tail: usize) -> Result<String, DbError> {
    let chunks: Vec<(i32, String)> = job_logs::table
        .filter(job_logs::job_id.eq(job))
        .order(job_logs::id)
        .select((job_logs::attempt, job_logs::chunk))
        .load(c)?;
    let mut out = String::new();
    let mut last_attempt = None;
    for (attempt, chunk) in chunks {
        if last_attempt.is_some_and(|a| a != attempt) {
            out.push_str(&format!("\n--- attempt {attempt} ---\n"));
        }
        last_attempt = Some(attempt);
        out.push_str(&chunk);
    }
    if out.len() > tail {
        let mut cut = out.len() - tail;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out = format!("[... earlier output not shown ...]\n{}", &out[cut..]);
    }
    Ok(out)
}

/// Appends output, up to [`MAX_LOG_BYTES`] per job.
pub fn append_log(c: &mut DbConn, job: i64, attempt: i32, chunk: &str) -> Result<(), DbError> {
    crate::transaction(c, |c| {
        let used: Option<i64> = jobs::table
            .find(job)
            .select(jobs::log_bytes)
            .first(c)
            .optional()?;
        let Some(used) = used else { return Ok(()) };
        if used >= MAX_LOG_BYTES {
            return Ok(());
        }
        let room = (MAX_LOG_BYTES - used) as usize;
        let text = if chunk.len() > room {
            let mut cut = room;
            while !chunk.is_char_boundary(cut) {
                cut -= 1;
            }
            format!(
                "{}\n[log limit of {} MiB reached; further output dropped]\n",
                &chunk[..cut],
                MAX_LOG_BYTES >> 20
            )
        } else {
            chunk.to_string()
        };
        diesel::insert_into(job_logs::table)
            .values((
                job_logs::job_id.eq(job),
                job_logs::attempt.eq(attempt),
                job_logs::chunk.eq(&text),
                job_logs::created_at.eq(now()),
            ))
            .execute(c)?;
        diesel::update(jobs::table.find(job))
            .set(jobs::log_bytes.eq(used + text.len() as i64))
            .execute(c)?;
        Ok(())
    })
}

/// A job placed on `node` as attempt `attempt`: no longer waiting.
pub fn set_placed(c: &mut DbConn, job: i64, attempt: i32, node: i64) -> Result<(), DbError> {
    diesel::update(jobs::table.find(job))
        .set((
            jobs::attempts.eq(attempt),
            jobs::node_id.eq(node),
            jobs::reason.eq(None::<String>),
        ))
        .execute(c)?;
    Ok(())
}

/// A job back in the queue: on no node, with the reason it waits.
pub fn set_unplaced(c: &mut DbConn, job: i64, why: &str) -> Result<(), DbError> {
    diesel::update(jobs::table.find(job))
        .set((jobs::node_id.eq(None::<i64>), jobs::reason.eq(Some(why))))
        .execute(c)?;
    Ok(())
}

pub fn set_result(
    c: &mut DbConn,
    job: i64,
    exit_code: Option<i64>,
    reason: Option<&str>,
) -> Result<(), DbError> {
    diesel::update(jobs::table.find(job))
        .set((jobs::exit_code.eq(exit_code), jobs::reason.eq(reason)))
        .execute(c)?;
    Ok(())
}

/// Job `job` to `running`, if it is starting attempt `attempt`, with `at` as its first
/// start time unless an earlier attempt set one; whether it moved. (The caller writes
/// the history row.)
pub fn set_running(
    c: &mut DbConn,
    job: i64,
    attempt: i32,
    at: chrono::NaiveDateTime,
) -> Result<bool, DbError> {
    use diesel::dsl::case_when;
    use diesel::sql_types::{Nullable, Timestamp};
    let first = case_when(
        jobs::started_at.is_null(),
        Some(at).into_sql::<Nullable<Timestamp>>(),
    )
    .otherwise(jobs::started_at);
    let moved = diesel::update(
        jobs::table
            .find(job)
            .filter(jobs::state.eq(JobState::Starting))
            .filter(jobs::attempts.eq(attempt)),
    )
    .set((
        jobs::state.eq(JobState::Running),
        jobs::started_at.eq(first),
    ))
    .execute(c)?;
    Ok(moved > 0)
}

/// The username of a job's owner.
pub fn owner_name(c: &mut DbConn, job: &Job) -> Result<String, DbError> {
    Ok(users::table
        .find(job.user_id)
        .select(users::username)
        .first(c)?)
}

/// Cancels a job. Returns the attempt to stop on its node, if one is active.
pub fn cancel(c: &mut DbConn, job: &Job, by: &str) -> Result<Option<Attempt>, DbError> {
    end_as_cancelled(c, job, &format!("cancelled by {by}"), None)
}

/// Ends a job as cancelled by the portal's own rule (an app's idle limit): `why` is its
/// history entry and the reason its page shows. Returns the attempt to stop.
pub fn end_for(c: &mut DbConn, job: &Job, why: &str) -> Result<Option<Attempt>, DbError> {
    end_as_cancelled(c, job, why, Some(why))
}

fn end_as_cancelled(
    c: &mut DbConn,
    job: &Job,
    message: &str,
    reason: Option<&str>,
) -> Result<Option<Attempt>, DbError> {
    crate::transaction(c, |c| {
        let current = get(c, job.id)?;
        if current.state().is_final() {
            return Err(DbError::conflict(
                "job_finished",
                format!("job {} has already {}", job.id, current.state()),
            ));
        }
        let active: Option<Attempt> = job_attempts::table
            .filter(job_attempts::job_id.eq(job.id))
            .filter(job_attempts::state.eq_any(super::models::AttemptStatus::ACTIVE))
            .select(Attempt::as_select())
            .first(c)
            .optional()?;
        if let Some(a) = &active {
            diesel::update(job_attempts::table.find(a.id))
                .set(job_attempts::state.eq(super::models::AttemptStatus::Stopping))
                .execute(c)?;
        }
        diesel::update(jobs::table.find(job.id))
            .set(jobs::reason.eq(reason))
            .execute(c)?;
        set_state(c, job.id, JobState::Cancelled, message)?;
        Ok(active)
    })
}

/// How many jobs each lab has in each state: (lab id, state, count).
pub fn count_by_lab_and_state(c: &mut DbConn) -> Result<Vec<(i64, String, i64)>, DbError> {
    Ok(jobs::table
        .group_by((jobs::lab_id, jobs::state))
        .select((jobs::lab_id, jobs::state, diesel::dsl::count_star()))
        .order_by((jobs::lab_id, jobs::state))
        .load(c)?)
}
