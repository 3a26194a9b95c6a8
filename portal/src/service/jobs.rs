//! A user's jobs: submit, list, read, output, history, cancel.

use super::views::{api_event, job_view, job_views, new_job_view, JobView};
use super::Actor;
use super::Ctx;
use crate::db::models::{Job, JobEvent, Lab};
use crate::db::{self, DbConn};
use crate::error::AppError;
use crate::validate::{self, JobRequest, ValidJob};
use commons_proto::PortalMsg;

/// A job the actor may see, else "not found".
pub fn visible(c: &mut DbConn, actor: &Actor, id: i64) -> Result<Job, AppError> {
    let job = db::jobs::get(c, id)?;
    if actor.may_see(&job) {
        Ok(job)
    } else {
        Err(AppError::NotFound("job"))
    }
}

/// Validates and stores a job, then wakes the scheduler. Nothing is written when any
/// rule fails. A handful of statements and one commit: the caller's lab comes with the
/// actor, and a new job's view needs no lookups (it has no attempt yet).
pub async fn submit(state: &Ctx, actor: &Actor, req: JobRequest) -> Result<JobView, AppError> {
    let notify = req
        .notify
        .as_deref()
        .map(|n| commons_api::notify::events("notify", n))
        .transpose()?;
    let app = req.app;
    super::apps::check_offered(&state.apps, app.as_ref())?;
    let valid = validate::job(req, &actor.lab_ids())?;
    let user = actor.user.id;
    let lab = charged_lab(actor, valid.lab_id)?;
    let waiter = actor.clone();
    let apps = state.apps.clone();
    let view = state
        .db
        .run(move |c| {
            super::deps::check_may_wait_for(c, &waiter, &valid.after)?;
            super::files::inputs::check_for_submit(c, &waiter, &valid.inputs)?;
            super::datasets::check_for_submit(c, &waiter, &valid.datasets)?;
            let view = store(c, user, &lab, valid)?;
            if let Some(events) = &notify {
                super::notify::set_job_events(c, view.id, events)?;
            }
            if let Some(app) = &app {
                super::apps::register(c, &apps, view.id, app)?;
            }
            Ok::<_, AppError>(view)
        })
        .await?;
    tracing::info!(job = view.id, "job submitted");
    state.wake.notify_one();
    Ok(view)
}

/// The lab a submission is charged to, among the actor's.
pub(super) fn charged_lab(actor: &Actor, lab_id: i64) -> Result<Lab, AppError> {
    actor
        .labs
        .iter()
        .map(|(l, _)| l)
        .find(|l| l.id == lab_id)
        .cloned()
        .ok_or_else(|| AppError::invalid("lab", "you are not a member of this lab"))
}

/// Pins the job's image to the allow-list's entry for `lab`: the digest (and signature)
/// it may ever run as.
pub(super) fn pin_image(c: &mut DbConn, lab: &Lab, valid: &mut ValidJob) -> Result<(), AppError> {
    let pin = super::images::pin_for_job(c, lab, &valid.image)?;
    valid.image = pin.name_tag;
    valid.image_digest = Some(pin.digest);
    valid.image_signature = pin.signature;
    valid.image_campus = pin.lab_id.is_none();
    Ok(())
}

/// A submission's database work: the allow-list's pin for the image (one read), then
/// the job and its history row (one transaction).
fn store(c: &mut DbConn, user: i64, lab: &Lab, mut valid: ValidJob) -> Result<JobView, AppError> {
    // The allow-list decides which digest this job may ever run.
    pin_image(c, lab, &mut valid)?;
    let job = db::jobs::insert(c, user, &valid)?;
    Ok(new_job_view(&job, &lab.slug))
}

/// The actor's latest jobs, newest first.
pub async fn list(state: &Ctx, actor: &Actor, limit: i64) -> Result<Vec<JobView>, AppError> {
    let user = actor.user.id;
    state
        .db
        .run(move |c| {
            let jobs = db::jobs::list_for_user(c, user, limit)?;
            job_views(c, &jobs)
        })
        .await
}

pub use commons_api::LabJobView;

/// The latest jobs of lab `slug`, newest first: its admins and operators only (403 for
/// others, 404 for an unknown lab).
pub async fn list_lab(
    state: &Ctx,
    actor: &Actor,
    slug: String,
    limit: i64,
) -> Result<Vec<LabJobView>, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let admin = super::lab_admin(c, &actor, &slug)?;
            let jobs = db::jobs::list_for_lab(c, admin.lab().id, limit)?;
            let users: Vec<i64> = jobs.iter().map(|j| j.user_id).collect();
            let names = db::users::usernames(c, &users)?;
            Ok(job_views(c, &jobs)?
                .into_iter()
                .zip(&jobs)
                .map(|(job, row)| LabJobView {
                    user: names.get(&row.user_id).cloned().unwrap_or_default(),
                    job,
                })
                .collect())
        })
        .await
}

/// One job the actor may see.
pub async fn get(state: &Ctx, actor: &Actor, id: i64) -> Result<JobView, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let job = visible(c, &actor, id)?;
            job_view(c, &job)
        })
        .await
}

/// What the job page shows of a job.
pub struct Detail {
    pub job: JobView,
    /// The owner's user id.
    pub owner: i64,
    pub events: Vec<JobEvent>,
    /// The last bytes of its output.
    pub logs: String,
}

/// A job's view, owner, history and the last `tail` bytes of its output (the job page).
pub async fn detail(state: &Ctx, actor: &Actor, id: i64, tail: usize) -> Result<Detail, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let job = visible(c, &actor, id)?;
            Ok(Detail {
                job: job_view(c, &job)?,
                owner: job.user_id,
                events: db::jobs::events(c, id)?,
                logs: db::jobs::logs(c, id, tail)?,
            })
        })
        .await
}

/// A job the actor may see, as stored: what "submit again" fills the form from.
pub async fn stored(state: &Ctx, actor: &Actor, id: i64) -> Result<Job, AppError> {
    let actor = actor.clone();
    state.db.run(move |c| visible(c, &actor, id)).await
}

/// All of a job's output.
pub async fn logs(state: &Ctx, actor: &Actor, id: i64) -> Result<String, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            visible(c, &actor, id)?;
            Ok(db::jobs::logs(c, id, db::jobs::MAX_LOG_BYTES as usize)?)
        })
        .await
}

/// A job's state history.
pub async fn events(
    state: &Ctx,
    actor: &Actor,
    id: i64,
) -> Result<Vec<commons_api::JobEvent>, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            visible(c, &actor, id)?;
            Ok(db::jobs::events(c, id)?.iter().map(api_event).collect())
        })
        .await
}

/// Cancels a job the actor may see, and tells its node to stop the container.
pub async fn cancel(state: &Ctx, actor: &Actor, id: i64) -> Result<JobView, AppError> {
    let actor = actor.clone();
    let actor_name = actor.user.username.clone();
    let (view, attempt) = state
        .db
        .run(move |c| {
            let job = visible(c, &actor, id)?;
            let attempt = db::jobs::cancel(c, &job, &actor.user.username)?;
            let job = db::jobs::get(c, id)?;
            Ok::<_, AppError>((job_view(c, &job)?, attempt))
        })
        .await?;
    if let Some(a) = attempt {
        let stop = PortalMsg::Stop {
            job: a.job_id,
            attempt: a.attempt,
            grace_s: super::attempts::SHORT_GRACE_S,
            reason: commons_proto::StopReason::Cancelled,
            detail: Some(format!("cancelled by {}", actor_name)),
        };
        // Whichever replica holds the agent; one that is not connected learns of the
        // cancel from its next renewal, which no longer names the attempt.
        if let Err(e) = super::agents::deliver(state, a.node_id, stop).await {
            tracing::info!(job = a.job_id, "cancel not passed to the agent now: {e}");
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testkit::sqlite;
    use diesel::connection::{Connection, InstrumentationEvent};
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_submission_is_one_read_and_one_short_transaction() {
        let (_d, mut c) = sqlite();
        let lab = db::users::create_lab(&mut c, "vision", "Vision").unwrap();
        let user = db::users::create_user(&mut c, "alice", "alice@x.test", false).unwrap();
        let entry = db::images::NewEntry {
            lab_id: None,
            name_tag: "commons-demo:latest",
            digest: "sha256:0123",
            description: "",
            signature: None,
            signed_by: None,
            created_by: "olga",
        };
        db::images::insert(&mut c, &entry).unwrap();
        let valid = || {
            let req: JobRequest = serde_json::from_value(serde_json::json!(
                {"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5}
            ))
            .unwrap();
            validate::job(req, &[("vision".into(), lab.id)]).unwrap()
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = e {
                s.lock().unwrap().push(query.to_string());
            }
        });
        let view = store(&mut c, user.id, &lab, valid()).unwrap();
        let seen = seen.lock().unwrap().clone();
        // The pin, then BEGIN, the job (returned by its INSERT), its history row, COMMIT.
        assert_eq!(seen.len(), 5, "{seen:#?}");
        assert!(
            seen[2].starts_with("INSERT INTO `jobs`")
                || seen[2].starts_with("INSERT INTO \"jobs\""),
            "{seen:#?}"
        );
        assert_eq!(
            (view.state, view.lab.as_str(), view.attempts),
            (commons_api::JobState::Queued, "vision", 0)
        );
        // What the view says is what a later read says.
        let stored = db::jobs::get(&mut c, view.id).unwrap();
        let again = super::super::views::job_view(&mut c, &stored).unwrap();
        assert_eq!(
            serde_json::to_value(&again).unwrap(),
            serde_json::to_value(&view).unwrap()
        );
        assert_eq!(db::jobs::events(&mut c, view.id).unwrap().len(), 1);
        assert_eq!(
            db::jobs::get(&mut c, view.id)
                .unwrap()
                .image_digest
                .as_deref(),
            Some("sha256:0123")
        );
    }
}
