//! Jobs: creation, reading, history, logs and cancellation.
//!
//! Every state change of a job goes through [`set_state`], which writes the event row in
//! the same transaction: the history in the UI is complete by construction.

use super::models::{Attempt, Job, JobEvent, JobState};
use super::schema::*;
use super::{now, DbConn};
use crate::error::AppError;
use crate::insert_returning_id;
use crate::validate::ValidJob;
use diesel::prelude::*;

/// Most log bytes kept per job; later output is dropped with a note.
pub const MAX_LOG_BYTES: i64 = 4 * 1024 * 1024;

pub fn add_event(c: &mut DbConn, job: i64, state: JobState, message: &str) -> Result<(), AppError> {
    diesel::insert_into(job_events::table)
        .values((
            job_events::job_id.eq(job),
            job_events::at.eq(now()),
            job_events::state.eq(state.as_str()),
            job_events::message.eq(message),
        ))
        .execute(c)?;
    Ok(())
}

/// Moves a job to `state` and records why.
pub fn set_state(c: &mut DbConn, job: i64, state: JobState, message: &str) -> Result<(), AppError> {
    let t = now();
    diesel::update(jobs::table.find(job))
        .set(jobs::state.eq(state.as_str()))
        .execute(c)?;
    if state.is_final() {
        diesel::update(jobs::table.find(job))
            .set((
                jobs::finished_at.eq(t),
                jobs::queue_position.eq(None::<i32>),
            ))
            .execute(c)?;
    }
    add_event(c, job, state, message)
}

pub fn insert(c: &mut DbConn, user: i64, v: &ValidJob) -> Result<Job, AppError> {
    c.transaction(|c| {
        let id = insert_returning_id!(
            c,
            diesel::insert_into(jobs::table).values((
                jobs::user_id.eq(user),
                jobs::lab_id.eq(v.lab_id),
                jobs::image.eq(&v.image),
                jobs::command.eq(serde_json::to_string(&v.command).expect("json")),
                jobs::env.eq(serde_json::to_string(&v.env).expect("json")),
                jobs::gpus.eq(v.gpus),
                jobs::gpu_models.eq(serde_json::to_string(&v.gpu_models).expect("json")),
                jobs::min_gpu_memory_mb.eq(v.min_gpu_memory_mb),
                jobs::cpus.eq(v.cpus),
                jobs::memory_mb.eq(v.memory_mb),
                jobs::time_limit_s.eq(v.time_limit_s),
                jobs::kind.eq(v.kind.as_str()),
                jobs::state.eq(JobState::Queued.as_str()),
                jobs::reason.eq(Some("waiting for the scheduler")),
                jobs::created_at.eq(now()),
            )),
            jobs::id
        )?;
        add_event(c, id, JobState::Queued, "submitted")?;
        get(c, id)
    })
}

pub fn get(c: &mut DbConn, id: i64) -> Result<Job, AppError> {
    jobs::table
        .find(id)
        .select(Job::as_select())
        .first(c)
        .optional()?
        .ok_or(AppError::NotFound("job"))
}

/// A job the user may see: their own, else "not found" (never "forbidden", which would
/// tell that the id exists).
pub fn get_for(c: &mut DbConn, id: i64, user: &crate::auth::CurrentUser) -> Result<Job, AppError> {
    let job = get(c, id)?;
    if job.user_id == user.user.id || user.user.is_operator {
        Ok(job)
    } else {
        Err(AppError::NotFound("job"))
    }
}

pub fn list_for_user(c: &mut DbConn, user: i64, limit: i64) -> Result<Vec<Job>, AppError> {
    Ok(jobs::table
        .filter(jobs::user_id.eq(user))
        .order(jobs::id.desc())
        .limit(limit)
        .select(Job::as_select())
        .load(c)?)
}

pub fn events(c: &mut DbConn, job: i64) -> Result<Vec<JobEvent>, AppError> {
    Ok(job_events::table
        .filter(job_events::job_id.eq(job))
        .order(job_events::id)
        .select(JobEvent::as_select())
        .load(c)?)
}

pub fn attempts(c: &mut DbConn, job: i64) -> Result<Vec<Attempt>, AppError> {
    Ok(job_attempts::table
        .filter(job_attempts::job_id.eq(job))
        .order(job_attempts::attempt)
        .select(Attempt::as_select())
        .load(c)?)
}

/// The job's output, all attempts in order, at most the last `tail` bytes.
pub fn logs(c: &mut DbConn, job: i64, tail: usize) -> Result<String, AppError> {
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
pub fn append_log(c: &mut DbConn, job: i64, attempt: i32, chunk: &str) -> Result<(), AppError> {
    c.transaction(|c| {
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

/// Cancels a job. Returns the attempt to stop on its node, if one is active.
pub fn cancel(c: &mut DbConn, job: &Job, by: &str) -> Result<Option<Attempt>, AppError> {
    c.transaction(|c| {
        let current = get(c, job.id)?;
        if current.state().is_final() {
            return Err(AppError::conflict(
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
                .set(job_attempts::state.eq("stopping"))
                .execute(c)?;
        }
        diesel::update(jobs::table.find(job.id))
            .set(jobs::reason.eq(None::<String>))
            .execute(c)?;
        set_state(
            c,
            job.id,
            JobState::Cancelled,
            &format!("cancelled by {by}"),
        )?;
        Ok(active)
    })
}
