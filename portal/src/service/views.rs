//! What the API and the job pages show of a job: one read model for both.
//!
//! [`job_views`] builds the views of any number of jobs in a fixed number of queries
//! (jobs' last attempts, their nodes, their GPUs, their labs, their checkpoints), never a
//! few per job.

use crate::db::models::{Attempt, Job};
use crate::db::{self, DbConn};
use crate::domain::{JobKind, JobState};
use crate::error::AppError;
use chrono::NaiveDateTime;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize)]
pub struct GpuView {
    pub uuid: String,
    pub index: i32,
    pub model: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: i64,
    /// The owner (not shown in the API: the caller's own jobs are listed).
    #[serde(skip)]
    pub user_id: i64,
    pub state: JobState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    /// While the job waits: when the scheduler expects it to start (UTC), `null` when
    /// it cannot tell. Absent for jobs that do not wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_start_at: Option<Option<NaiveDateTime>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<GpuView>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    pub attempts: i32,
    pub image: String,
    pub command: Vec<String>,
    pub gpus_requested: i32,
    pub gpu_models: Vec<String>,
    pub time_limit_minutes: i64,
    /// The disk it asked for in GiB; absent: the campus default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<i64>,
    pub kind: JobKind,
    pub lab: String,
    pub created_at: NaiveDateTime,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<NaiveDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<NaiveDateTime>,
    /// When the checkpoint the job would resume from was stored (UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_at: Option<NaiveDateTime>,
    /// Seconds until the running attempt reaches the time limit (counted from when it
    /// started running); only while the job runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_left_s: Option<i64>,
}

impl JobView {
    /// The estimated start in words, while the job waits: a UTC time, or "unknown".
    pub fn estimated_start(&self) -> Option<String> {
        let at = self.estimated_start_at?;
        Some(at.map_or("unknown".to_string(), |t| {
            t.format("%Y-%m-%d %H:%M UTC").to_string()
        }))
    }

    /// The time left in words ("1 h 05 min"), while the job runs.
    pub fn time_left(&self) -> Option<String> {
        let s = self.time_left_s?;
        let m = s / 60;
        Some(if s < 60 {
            "under a minute".to_string()
        } else if m < 60 {
            format!("{m} min")
        } else {
            format!("{} h {:02} min", m / 60, m % 60)
        })
    }
}

/// The view of one job.
pub fn job_view(c: &mut DbConn, job: &Job) -> Result<JobView, AppError> {
    job_views(c, std::slice::from_ref(job))?
        .pop()
        .ok_or(AppError::NotFound("job"))
}

/// The view of a job just submitted, in lab `lab_slug`: no query (it has no attempt,
/// node, GPUs or checkpoint yet).
pub fn new_job_view(job: &Job, lab_slug: &str) -> JobView {
    view(
        job,
        &Facts {
            lab_slugs: BTreeMap::from([(job.lab_id, lab_slug.to_string())]),
            ..Facts::default()
        },
        db::now(),
    )
}

/// What the views of some jobs need beyond their rows.
#[derive(Default)]
struct Facts {
    last: BTreeMap<i64, Attempt>,
    node_names: BTreeMap<i64, String>,
    gpus: BTreeMap<i64, GpuView>,
    lab_slugs: BTreeMap<i64, String>,
    checkpointed: BTreeMap<i64, NaiveDateTime>,
}

/// The views of `jobs`, in their order, in at most five queries whatever their number
/// (fewer when there is nothing to look up: jobs never placed have no attempts, nodes,
/// GPUs or checkpoints).
pub fn job_views(c: &mut DbConn, jobs: &[Job]) -> Result<Vec<JobView>, AppError> {
    // A job's attempts count its attempt rows: one never placed has none.
    let placed: Vec<i64> = jobs
        .iter()
        .filter(|j| j.attempts > 0)
        .map(|j| j.id)
        .collect();
    let last: BTreeMap<i64, Attempt> = if placed.is_empty() {
        BTreeMap::new()
    } else {
        db::jobs::last_attempts(c, &placed)?
            .into_iter()
            .map(|a| (a.job_id, a))
            .collect()
    };
    let node_ids: Vec<i64> = jobs
        .iter()
        .filter_map(|j| j.node_id.or(last.get(&j.id).map(|a| a.node_id)))
        .collect();
    let node_names = if node_ids.is_empty() {
        BTreeMap::new()
    } else {
        db::nodes::names(c, &node_ids)?
    };
    let gpu_ids: Vec<i64> = last.values().flat_map(|a| a.gpu_ids.0.clone()).collect();
    let gpus: BTreeMap<i64, GpuView> = if gpu_ids.is_empty() {
        Vec::new()
    } else {
        db::nodes::gpus_by_ids(c, &gpu_ids)?
    }
    .into_iter()
    .map(|g| {
        (
            g.id,
            GpuView {
                uuid: g.uuid,
                index: g.idx,
                model: g.model,
            },
        )
    })
    .collect();
    let lab_ids: Vec<i64> = jobs.iter().map(|j| j.lab_id).collect();
    let lab_slugs = db::users::lab_slugs(c, &lab_ids)?;
    let checkpointed = if placed.is_empty() {
        BTreeMap::new()
    } else {
        db::checkpoints::latest_at_for_jobs(c, &placed)?
    };
    let facts = Facts {
        last,
        node_names,
        gpus,
        lab_slugs,
        checkpointed,
    };
    let now = db::now();
    Ok(jobs.iter().map(|job| view(job, &facts, now)).collect())
}

fn view(job: &Job, facts: &Facts, now: NaiveDateTime) -> JobView {
    let attempt = facts.last.get(&job.id);
    let node = job
        .node_id
        .or(attempt.map(|a| a.node_id))
        .and_then(|id| facts.node_names.get(&id).cloned());
    let gpus = attempt.map(|a| {
        let mut v: Vec<GpuView> = a
            .gpu_ids
            .iter()
            .filter_map(|id| facts.gpus.get(id).cloned())
            .collect();
        v.sort_by_key(|g| g.index);
        v
    });
    let running = matches!(job.state, JobState::Running | JobState::Preempting);
    let time_left_s = attempt
        .filter(|a| running && a.status().is_active())
        .and_then(|a| a.started_at)
        .map(|at| {
            (at - now)
                .num_seconds()
                .saturating_add(job.time_limit_s)
                .max(0)
        });
    JobView {
        id: job.id,
        user_id: job.user_id,
        state: job.state,
        reason: job.reason.clone(),
        queue_position: job.queue_position,
        estimated_start_at: (job.state == JobState::Queued).then_some(job.estimated_start_at),
        node,
        gpus,
        exit_code: job.exit_code,
        attempts: job.attempts,
        image: job.image.clone(),
        command: job.command.0.clone(),
        gpus_requested: job.gpus,
        gpu_models: job.gpu_models.0.clone(),
        time_limit_minutes: job.time_limit_s / 60,
        disk_gb: job.disk_gb,
        kind: job.kind,
        lab: facts
            .lab_slugs
            .get(&job.lab_id)
            .cloned()
            .unwrap_or_default(),
        created_at: job.created_at,
        started_at: job.started_at,
        finished_at: job.finished_at,
        last_checkpoint_at: facts.checkpointed.get(&job.id).copied(),
        time_left_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testkit::{campus, sqlite};
    use diesel::connection::{Connection, InstrumentationEvent};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn queries_for(n: usize) -> (usize, Vec<JobView>) {
        let (_dir, mut c) = sqlite();
        let jobs = campus(&mut c, n).jobs;
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
            if matches!(e, InstrumentationEvent::StartQuery { .. }) {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        let views = job_views(&mut c, &jobs).unwrap();
        (count.load(Ordering::SeqCst), views)
    }

    #[test]
    fn estimated_start_reads_as_a_time_or_unknown() {
        let (_d, mut c) = sqlite();
        let mut job = campus(&mut c, 1).jobs.remove(0);
        job.state = JobState::Queued;
        job.estimated_start_at = None;
        let v = job_view(&mut c, &job).unwrap();
        assert_eq!(v.estimated_start().as_deref(), Some("unknown"));
        assert_eq!(
            serde_json::to_value(&v).unwrap()["estimated_start_at"],
            serde_json::Value::Null
        );
        job.estimated_start_at =
            chrono::DateTime::from_timestamp(1_800_000_000, 0).map(|t| t.naive_utc());
        let v = job_view(&mut c, &job).unwrap();
        assert_eq!(v.estimated_start().as_deref(), Some("2027-01-15 08:00 UTC"));
        job.state = JobState::Running;
        let v = job_view(&mut c, &job).unwrap();
        assert_eq!(v.estimated_start(), None, "only while it waits");
        assert!(serde_json::to_value(&v)
            .unwrap()
            .get("estimated_start_at")
            .is_none());
    }

    #[test]
    fn time_left_reads_in_hours_and_minutes() {
        let (_d, mut c) = sqlite();
        let job = campus(&mut c, 1).jobs.remove(0);
        let mut v = job_view(&mut c, &job).unwrap();
        assert_eq!(v.time_left(), None, "only while it runs");
        for (s, text) in [
            (30, "under a minute"),
            (600, "10 min"),
            (3900, "1 h 05 min"),
        ] {
            v.time_left_s = Some(s);
            assert_eq!(v.time_left().as_deref(), Some(text));
        }
    }

    #[test]
    fn a_job_list_costs_the_same_queries_for_one_job_or_fifty() {
        let (one, v1) = queries_for(1);
        let (fifty, v50) = queries_for(50);
        assert_eq!(v1.len(), 1);
        assert_eq!(v50.len(), 50);
        assert!(v50.iter().all(|v| v.node.as_deref() == Some("n1")
            && v.gpus
                .as_ref()
                .is_some_and(|g| g.len() == 1 && g[0].uuid == "GPU-1")
            && v.lab == "vision"));
        assert_eq!(one, fifty, "queries do not grow with the number of jobs");
        assert!(one <= 5, "{one} queries");
    }
}
