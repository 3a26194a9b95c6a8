//! Job arrays (`"array": "0-99%8"`): one request, many tasks, each a job of its own (so
//! quotas, fair share, dependencies and the job pages see tasks as jobs). Submitting one
//! stores the array and every task in one transaction with batched inserts; reading one
//! counts its tasks by state; cancelling one cancels every task not yet ended.
//!
//! Invariants:
//! - Each task's command and environment values have `{index}` replaced by its index,
//!   and its environment has `COMMONS_ARRAY_ID`, `COMMONS_ARRAY_INDEX` and
//!   `COMMONS_ARRAY_COUNT` (set here, after the request's rules refused any `COMMONS_*`
//!   of the user's own).
//! - The throttle is applied where the scheduler's snapshot is read
//!   (`db::arrays::throttled`): tasks over it are kept out of the queue like held jobs.

use super::Actor;
use super::Ctx;
use crate::db::arrays::{Array, Task};
use crate::db::models::Lab;
use crate::db::{self, DbConn};
use crate::error::AppError;
use crate::validate::{self, JobRequest, ValidJob};
use commons_api::array::{self as spec, ArrayView};
use std::collections::BTreeMap;

/// Validates and stores an array and its tasks, then wakes the scheduler. Nothing is
/// written when any rule fails.
pub async fn submit(state: &Ctx, actor: &Actor, req: JobRequest) -> Result<ArrayView, AppError> {
    let text = req.array.clone().unwrap_or_default();
    // Not for arrays: a web app per task.
    if req.app.is_some() {
        return Err(AppError::invalid(
            "app",
            "an array's tasks cannot serve web apps; submit such jobs one by one",
        ));
    }
    // The array's own list, kept with its first task: it chooses whether the array's
    // one message (`array_finished`) is sent; its tasks send none of their own.
    let notify = req
        .notify
        .as_deref()
        .map(|n| commons_api::notify::events("notify", n))
        .transpose()?;
    let valid = validate::job(req, &actor.lab_ids())?;
    let parsed = spec::parse(&text).map_err(commons_api::Invalid::from)?;
    let lab = super::jobs::charged_lab(actor, valid.lab_id)?;
    let user = actor.user.id;
    let waiter = actor.clone();
    let view = state
        .db
        .run(move |c| {
            super::deps::check_may_wait_for(c, &waiter, &valid.after)?;
            check_per_index(c, &valid.after, text.trim(), &parsed)?;
            super::files::inputs::check_for_submit(c, &waiter, &valid.inputs)?;
            super::datasets::check_for_submit(c, &waiter, &valid.datasets)?;
            let view = store(c, user, &lab, valid, text.trim(), &parsed)?;
            if let Some(events) = &notify {
                super::notify::set_job_events(c, view.first_job, events)?;
            }
            Ok::<_, AppError>(view)
        })
        .await?;
    tracing::info!(array = view.id, tasks = view.count, "array submitted");
    state.wake.notify_one();
    Ok(view)
}

/// Refuses (422, `after[i].per_index`) a per-index wait for an array whose indices are
/// not this one's, saying both.
fn check_per_index(
    c: &mut DbConn,
    after: &[commons_api::flows::After],
    text: &str,
    parsed: &spec::ArraySpec,
) -> Result<(), AppError> {
    let ids: Vec<i64> = after
        .iter()
        .filter(|a| a.per_index)
        .filter_map(|a| a.array)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let others: BTreeMap<i64, Array> = db::arrays::by_ids(c, &ids)?
        .into_iter()
        .map(|a| (a.id, a))
        .collect();
    let indices = |t: &str| t.split('%').next().unwrap_or_default().trim().to_string();
    for (i, a) in after.iter().enumerate() {
        let Some(other) = a
            .array
            .filter(|_| a.per_index)
            .and_then(|id| others.get(&id))
        else {
            continue;
        };
        let same = spec::parse(&other.spec).is_ok_and(|o| o.indices == parsed.indices);
        if !same {
            return Err(AppError::invalid(
                &format!("after[{i}].per_index"),
                format!(
                    "array {} has {} tasks ({}) but this array has {} ({}); a per-index \
                     wait needs the same indices",
                    other.id,
                    other.task_count,
                    indices(&other.spec),
                    parsed.indices.len(),
                    indices(text)
                ),
            ));
        }
    }
    Ok(())
}

/// The image's pin (one read), then the array and its tasks (one transaction).
fn store(
    c: &mut DbConn,
    user: i64,
    lab: &Lab,
    mut valid: ValidJob,
    text: &str,
    parsed: &spec::ArraySpec,
) -> Result<ArrayView, AppError> {
    super::jobs::pin_image(c, lab, &mut valid)?;
    let count = parsed.indices.len();
    let throttle = parsed.throttle.map(i64::from);
    let (array, tasks) = db::transaction(c, |c| {
        let array = db::arrays::insert_array(c, user, &valid, text, count as i64, throttle)?;
        let tasks: Vec<Task> = parsed
            .indices
            .iter()
            .map(|&i| task(&valid, array.id, i, count))
            .collect();
        let ids = db::arrays::insert_tasks(c, user, &array, &valid, &tasks)?;
        Ok::<_, db::DbError>((array, ids))
    })?;
    let states = BTreeMap::from([(
        commons_api::JobState::Queued.as_str().to_string(),
        count as i64,
    )]);
    Ok(view(&array, &lab.slug, tasks, states))
}

/// What task `index` runs.
fn task(valid: &ValidJob, array: i64, index: u32, count: usize) -> Task {
    let (command, mut env) = spec::substitute(&valid.command, &valid.env, index);
    env.extend(spec::task_env(array, index, count));
    Task {
        index: i64::from(index),
        command,
        env,
    }
}

fn view(a: &Array, lab: &str, tasks: Vec<i64>, states: BTreeMap<String, i64>) -> ArrayView {
    let ended: i64 = ["succeeded", "failed", "cancelled"]
        .iter()
        .filter_map(|s| states.get(*s))
        .sum();
    ArrayView {
        id: a.id,
        spec: a.spec.clone(),
        name: a.name.clone(),
        lab: lab.to_string(),
        count: a.task_count,
        throttle: a.throttle,
        first_job: tasks.first().copied().unwrap_or_default(),
        tasks,
        states,
        finished: ended == a.task_count,
        created_at: a.created_at,
    }
}

/// An array the actor may see (its own, or of a lab they administer), else "not found".
fn visible(c: &mut DbConn, actor: &Actor, id: i64) -> Result<Array, AppError> {
    let a = db::arrays::get(c, id)?;
    if a.user_id == actor.user.id || actor.admin_of(a.lab_id) {
        Ok(a)
    } else {
        Err(AppError::NotFound("array"))
    }
}

fn read_view(c: &mut DbConn, a: &Array) -> Result<ArrayView, AppError> {
    let lab = db::users::lab_by_id(c, a.lab_id)?;
    let tasks = db::arrays::task_ids(c, a.id)?;
    let states = db::arrays::counts(c, a.id)?
        .into_iter()
        .map(|(s, n)| (s.as_str().to_string(), n))
        .collect();
    Ok(view(a, &lab.slug, tasks, states))
}

/// One array with its tasks' counts by state.
pub async fn get(state: &Ctx, actor: &Actor, id: i64) -> Result<ArrayView, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            let a = visible(c, &actor, id)?;
            read_view(c, &a)
        })
        .await
}

/// Cancels every task of the array that has not ended: the queued ones in a few
/// statements, those that start or run one by one (their servers are told to stop
/// them). Returns the array as it is then.
pub async fn cancel(state: &Ctx, actor: &Actor, id: i64) -> Result<ArrayView, AppError> {
    let who = actor.clone();
    let by = actor.user.username.clone();
    let active = state
        .db
        .run(move |c| {
            visible(c, &who, id)?;
            db::arrays::cancel_queued(c, id, &by)?;
            Ok::<_, AppError>(db::arrays::unfinished(c, id)?)
        })
        .await?;
    for job in active {
        match super::jobs::cancel(state, actor, job.id).await {
            Ok(_) => {}
            // It ended meanwhile.
            Err(AppError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    tracing::info!(array = id, "array cancelled");
    get(state, actor, id).await
}

/// An array as the job list shows it, in its first task's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub id: i64,
    pub spec: String,
    pub count: i64,
    /// `(state, n)` for the states its tasks are in, in the states' order.
    pub states: Vec<(String, i64)>,
}

impl Summary {
    /// "12 succeeded · 3 running · 5 queued".
    pub fn counts(&self) -> String {
        self.states
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// The summaries of the arrays `jobs` are tasks of (two queries).
pub fn summaries(
    c: &mut DbConn,
    jobs: &[crate::db::models::Job],
) -> Result<BTreeMap<i64, Summary>, AppError> {
    let mut ids: Vec<i64> = jobs.iter().filter_map(|j| j.array_id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut counts = db::arrays::counts_of(c, &ids)?;
    Ok(db::arrays::by_ids(c, &ids)?
        .into_iter()
        .map(|a| {
            let states = counts
                .remove(&a.id)
                .unwrap_or_default()
                .into_iter()
                .map(|(s, n)| (s.as_str().to_string(), n))
                .collect();
            let s = Summary {
                id: a.id,
                spec: a.spec,
                count: a.task_count,
                states,
            };
            (a.id, s)
        })
        .collect())
}

/// The job list's `array` filter: empty, or an array's id.
pub fn parse_filter(s: &str) -> Result<Option<i64>, AppError> {
    match s.trim() {
        "" => Ok(None),
        t => t
            .parse()
            .map(Some)
            .map_err(|_| AppError::invalid("array", format!("array: {t:?} is not an array id"))),
    }
}

/// An array's tasks as jobs, in index order (`GET /api/v1/jobs?array=ID`).
pub async fn tasks(
    state: &Ctx,
    actor: &Actor,
    id: i64,
) -> Result<Vec<commons_api::JobView>, AppError> {
    let actor = actor.clone();
    state
        .db
        .run(move |c| {
            visible(c, &actor, id)?;
            let ids = db::arrays::task_ids(c, id)?;
            let mut jobs = Vec::with_capacity(ids.len());
            for chunk in ids.chunks(5000) {
                jobs.extend(db::jobs::by_ids(c, chunk)?);
            }
            jobs.sort_by_key(|j| j.array_index);
            super::views::job_views(c, &jobs)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testkit::sqlite;

    #[test]
    fn an_array_is_stored_with_its_tasks_indices_and_variables() {
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
        let req: JobRequest = serde_json::from_value(serde_json::json!({
            "image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5,
            "command": ["echo", "task {index}"], "env": {"OUT": "/o/{index}"},
            "array": "0-9999%8"
        }))
        .unwrap();
        let valid = validate::job(req, &[("vision".into(), lab.id)]).unwrap();
        let parsed = spec::parse("0-9999%8").unwrap();
        let v = store(&mut c, user.id, &lab, valid, "0-9999%8", &parsed).unwrap();
        assert_eq!(
            (v.count, v.tasks.len(), v.throttle),
            (10_000, 10_000, Some(8))
        );
        let last = db::jobs::get(&mut c, v.tasks[9999]).unwrap();
        assert_eq!(last.command.0, vec!["echo", "task 9999"]);
        assert_eq!(last.env.0["OUT"], "/o/9999");
        assert_eq!(last.env.0["COMMONS_ARRAY_INDEX"], "9999");
        assert_eq!(last.env.0["COMMONS_ARRAY_COUNT"], "10000");
        assert_eq!(last.env.0["COMMONS_ARRAY_ID"], v.id.to_string());
        assert_eq!((last.array_id, last.array_index), (Some(v.id), Some(9999)));
        assert_eq!(db::jobs::events(&mut c, last.id).unwrap().len(), 1);
        let row = db::arrays::get(&mut c, v.id).unwrap();
        let read = read_view(&mut c, &row).unwrap();
        assert_eq!(read, v);
        // Only the throttle's worth of tasks reach the scheduler.
        let policy = commons_sched::Policy::default();
        let snap = db::snapshot::read(&mut c, &policy).unwrap();
        assert_eq!(snap.queue.len(), 8);
        assert_eq!(
            db::arrays::cancel_queued(&mut c, v.id, "alice").unwrap(),
            10_000
        );
        assert!(db::arrays::unfinished(&mut c, v.id).unwrap().is_empty());
    }

    /// Stores an array of `spec` waiting for `after`, as alice would.
    fn array_of(
        c: &mut DbConn,
        lab: &Lab,
        user: i64,
        spec_text: &str,
        after: serde_json::Value,
    ) -> ArrayView {
        let req: JobRequest = serde_json::from_value(serde_json::json!({
            "image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5,
            "command": ["true"], "array": spec_text, "after": after
        }))
        .unwrap();
        let valid = validate::job(req, &[("vision".into(), lab.id)]).unwrap();
        let parsed = spec::parse(spec_text).unwrap();
        check_per_index(c, &valid.after, spec_text, &parsed).unwrap();
        store(c, user, lab, valid, spec_text, &parsed).unwrap()
    }

    #[test]
    fn ten_thousand_tasks_waiting_per_index_settle_in_one_round() {
        use crate::db::models::JobState;
        use crate::db::schema::jobs;
        use diesel::prelude::*;
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
        let a = array_of(&mut c, &lab, user.id, "0-9999", serde_json::json!([]));
        let after = serde_json::json!([{"array": a.id, "when": "ok", "per_index": true}]);
        let b = array_of(&mut c, &lab, user.id, "0-9999", after);
        let b7 = db::jobs::get(&mut c, b.tasks[7]).unwrap();
        assert_eq!(
            b7.reason.as_deref(),
            Some(format!("waiting for task 7 of array {} to succeed", a.id).as_str())
        );
        // Nothing has ended: nothing moves, nothing is rewritten.
        let none = super::super::deps::settle(&mut c).unwrap();
        assert_eq!((none.released, none.failed), (0, 0));
        // Test setup: A's tasks end, task 7 failed.
        diesel::update(jobs::table.filter(jobs::array_id.eq(a.id)))
            .set(jobs::state.eq(JobState::Succeeded))
            .execute(&mut c)
            .unwrap();
        diesel::update(jobs::table.find(a.tasks[7]))
            .set(jobs::state.eq(JobState::Failed))
            .execute(&mut c)
            .unwrap();
        let began = std::time::Instant::now();
        let done = super::super::deps::settle(&mut c).unwrap();
        eprintln!(
            "settled 10,000 per-index waits in {:.0} ms (debug, SQLite)",
            began.elapsed().as_secs_f64() * 1000.0
        );
        assert_eq!((done.released, done.failed), (9_999, 1));
        let b7 = db::jobs::get(&mut c, b.tasks[7]).unwrap();
        let why = format!(
            "task 7 of array {} failed; this task needed it to succeed",
            a.id
        );
        assert_eq!(
            (b7.state, b7.reason.as_deref()),
            (JobState::Failed, Some(why.as_str()))
        );
        let last = db::jobs::events(&mut c, b7.id).unwrap().pop().unwrap();
        assert_eq!((last.state, last.message), (JobState::Failed, why));
        let b8 = db::jobs::get(&mut c, b.tasks[8]).unwrap();
        assert_eq!((b8.state, b8.held), (JobState::Queued, false));
        // Other indices are refused, naming the wait and saying both.
        let req: JobRequest = serde_json::from_value(serde_json::json!({
            "image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5,
            "array": "0-19", "after": [{"array": a.id, "per_index": true}]
        }))
        .unwrap();
        let valid = validate::job(req, &[("vision".into(), lab.id)]).unwrap();
        let e = check_per_index(&mut c, &valid.after, "0-19", &spec::parse("0-19").unwrap())
            .unwrap_err();
        assert_eq!(e.field(), Some("after[0].per_index"));
        assert!(
            e.to_string()
                .contains("10000 tasks (0-9999) but this array has 20 (0-19)"),
            "{e}"
        );
    }
}
