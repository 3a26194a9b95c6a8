//! What the API and the job pages show of a job: one read model for both, built here
//! from the database's rows into `commons_api`'s types (the API's contract).
//!
//! [`job_views`] builds the views of any number of jobs in a fixed number of queries
//! (jobs' last attempts, their nodes, their GPUs, their labs, their checkpoints), never a
//! few per job.

use crate::db::models::{Attempt, Job};
use crate::db::{self, DbConn};
use crate::domain::{self, JobKind, JobState};
use crate::error::AppError;
use chrono::NaiveDateTime;
pub use commons_api::job_view::{GpuView, JobView};
use std::collections::BTreeMap;

/// A job's state as the API names it. Exhaustive both ways, so a state added on one
/// side and not the other does not compile.
pub fn api_state(s: JobState) -> commons_api::JobState {
    use commons_api::JobState as A;
    match s {
        JobState::Queued => A::Queued,
        JobState::Starting => A::Starting,
        JobState::Running => A::Running,
        JobState::Preempting => A::Preempting,
        JobState::Succeeded => A::Succeeded,
        JobState::Failed => A::Failed,
        JobState::Cancelled => A::Cancelled,
    }
}

/// A job's kind as the API names it.
pub fn api_kind(k: JobKind) -> commons_api::JobKind {
    match k {
        JobKind::Batch => commons_api::JobKind::Batch,
        JobKind::Interactive => commons_api::JobKind::Interactive,
    }
}

/// A history entry as the API shows it.
pub fn api_event(e: &crate::db::models::JobEvent) -> commons_api::JobEvent {
    commons_api::JobEvent {
        at: e.at,
        state: api_state(e.state),
        message: e.message.clone(),
    }
}

/// A role as the API names it.
pub fn api_role(r: domain::Role) -> commons_api::account::Role {
    match r {
        domain::Role::Member => commons_api::account::Role::Member,
        domain::Role::Admin => commons_api::account::Role::Admin,
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
    /// The apps of the running jobs that serve one.
    apps: BTreeMap<i64, db::apps::AppRow>,
    /// The running jobs whose app answered during their current attempt.
    ready: std::collections::BTreeSet<i64>,
    /// Starting jobs whose inputs are being staged: how far.
    staging: BTreeMap<i64, commons_api::Staging>,
    /// The queued jobs' places in the queue and estimated starts (`job_places`).
    places: BTreeMap<i64, (Option<i32>, Option<NaiveDateTime>)>,
}

/// The views of `jobs`, in their order, in a fixed number of queries whatever their
/// number (fewer when there is nothing to look up: jobs never placed have no attempts,
/// nodes, GPUs or checkpoints; jobs not queued have no places).
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
                share: None,
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
    let running: Vec<i64> = jobs
        .iter()
        .filter(|j| j.state == JobState::Running)
        .map(|j| j.id)
        .collect();
    let apps = if running.is_empty() {
        BTreeMap::new()
    } else {
        db::apps::of_jobs(c, &running)?
            .into_iter()
            .map(|a| (a.job_id, a))
            .collect()
    };
    // An app's URL is shown once it answered during the job's current attempt.
    let ready: std::collections::BTreeSet<i64> = if running.is_empty() {
        Default::default()
    } else {
        let answered = db::apps::ready_attempts(c, &running)?;
        jobs.iter()
            .filter(|j| answered.get(&j.id) == Some(&j.attempts))
            .map(|j| j.id)
            .collect()
    };
    let staging = staging_of(c, jobs, &last)?;
    let queued: Vec<i64> = jobs
        .iter()
        .filter(|j| j.state == JobState::Queued)
        .map(|j| j.id)
        .collect();
    let places = if queued.is_empty() {
        BTreeMap::new()
    } else {
        db::plan::places(c, &queued)?
            .into_iter()
            .map(|(job, position, estimate)| (job, (position, estimate)))
            .collect()
    };
    let facts = Facts {
        last,
        node_names,
        gpus,
        lab_slugs,
        checkpointed,
        apps,
        ready,
        staging,
        places,
    };
    let now = db::now();
    Ok(jobs.iter().map(|job| view(job, &facts, now)).collect())
}

/// How far the staging of each starting job with inputs got (one read per such job:
/// few are starting at once).
fn staging_of(
    c: &mut DbConn,
    jobs: &[Job],
    last: &BTreeMap<i64, Attempt>,
) -> Result<BTreeMap<i64, commons_api::Staging>, AppError> {
    let mut out = BTreeMap::new();
    let starting = jobs
        .iter()
        .filter(|j| j.state == JobState::Starting && !j.inputs.0.is_empty());
    for job in starting {
        let Some(a) = last.get(&job.id) else { continue };
        if let Some(s) = db::staging::get(c, job.id, a.attempt)?.filter(|s| !s.finished) {
            let staging = commons_api::Staging {
                done_bytes: s.done_bytes.max(0) as u64,
                total_bytes: s.total_bytes.max(0) as u64,
            };
            out.insert(job.id, staging);
        }
    }
    Ok(out)
}

fn view(job: &Job, facts: &Facts, now: NaiveDateTime) -> JobView {
    let attempt = facts.last.get(&job.id);
    let place = facts.places.get(&job.id);
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
        if let Some(s) = a.share() {
            for g in &mut v {
                g.share = Some(commons_api::job_view::GpuShareView {
                    fraction: f64::from(s.milli) / 1000.0,
                    memory_mb: s.memory_mb,
                    memory_used_mb: a.gpu_memory_used_mb.map(|m| m.max(0) as u64),
                });
            }
        }
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
        array_id: job.array_id,
        array_index: job.array_index,
        name: job.name.clone(),
        tags: job.tags.0.clone(),
        after: job.after_jobs.0.clone(),
        inputs: job.inputs.0.clone(),
        datasets: job.datasets.0.clone(),
        staging: facts.staging.get(&job.id).copied(),
        state: api_state(job.state),
        reason: job.reason.clone(),
        queue_position: place.and_then(|p| p.0),
        // A job held for its waits has no estimate until they are met.
        estimated_start_at: (job.state == JobState::Queued && !job.held)
            .then_some(place.and_then(|p| p.1)),
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
        kind: api_kind(job.kind),
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
        app_url: facts
            .apps
            .get(&job.id)
            .filter(|_| facts.ready.contains(&job.id))
            .map(|a| a.url.clone()),
        app_idle_ends_at: facts
            .apps
            .get(&job.id)
            .and_then(|a| idle_ends_at(a, attempt)),
    }
}

/// When a warned idle app ends unless used (`service::app_idle`).
fn idle_ends_at(app: &db::apps::AppRow, attempt: Option<&Attempt>) -> Option<NaiveDateTime> {
    let limit_s = i64::from(app.idle_minutes?) * 60;
    let since =
        super::app_idle::idle_since(app.last_activity_at, attempt.and_then(|a| a.started_at))?;
    super::app_idle::ends_at(since, limit_s, app.idle_warned_at)
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
    fn an_unknown_estimate_is_null_while_the_job_waits() {
        let (_d, mut c) = sqlite();
        let mut job = campus(&mut c, 1).jobs.remove(0);
        job.state = JobState::Queued;
        let v = job_view(&mut c, &job).unwrap();
        assert_eq!(v.estimated_start().as_deref(), Some("unknown"));
        assert_eq!(
            serde_json::to_value(&v).unwrap()["estimated_start_at"],
            serde_json::Value::Null
        );
        job.state = JobState::Running;
        let v = job_view(&mut c, &job).unwrap();
        assert_eq!(v.estimated_start(), None, "only while it waits");
        assert!(serde_json::to_value(&v)
            .unwrap()
            .get("estimated_start_at")
            .is_none());
    }

    #[test]
    fn every_state_reads_the_same_in_the_api() {
        for s in JobState::ALL {
            assert_eq!(api_state(*s).as_str(), s.as_str());
        }
        for k in JobKind::ALL {
            assert_eq!(api_kind(*k).as_str(), k.as_str());
        }
        for r in domain::Role::ALL {
            assert_eq!(api_role(*r).as_str(), r.as_str());
        }
    }

    #[test]
    fn a_job_list_costs_the_same_queries_for_one_job_or_fifty() {
        let (one, v1) = queries_for(1);
        let (fifty, v50) = queries_for(50);
        assert_eq!(v1.len(), 1);
        assert_eq!(v50.len(), 50);
        assert!(v50.iter().all(|v| {
            v.node.as_deref() == Some("n1")
                && v.gpus
                    .as_ref()
                    .is_some_and(|g| g.len() == 1 && g[0].uuid == "GPU-1")
                && v.lab == "vision"
        }));
        assert_eq!(one, fifty, "queries do not grow with the number of jobs");
        assert!(one <= 5, "{one} queries");
    }
}
