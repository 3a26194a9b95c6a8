//! One message for an array instead of one per task: the tasks of an array send no
//! notifications of their own, and when its last task ends the array's owner gets
//! `array_finished`, with the tasks' counts by end state.
//!
//! Invariants:
//! - The event's id is `arr_<array id>`, the same whichever pass (or replica) sees the
//!   array finished first: the delivery queue's uniqueness by (event id, channel,
//!   target) makes queueing it again a no-op, so it is sent once per channel.
//! - An array's own `notify` list is the request's, stored once with its first task.
//!   It (or else the owner's settings) must include `array_finished` (the `end` and `all`
//!   aliases do), or `failed` when a task failed.

use super::Settings;
use crate::db::arrays::Array;
use crate::db::models::JobState;
use crate::db::notifications::NewDelivery;
use crate::db::{self, DbConn};
use crate::error::AppError;
use chrono::NaiveDateTime;
use serde_json::json;
use std::collections::BTreeMap;

/// The event's name.
pub const EVENT: &str = "array_finished";

/// An array's end, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
}

impl Counts {
    /// The counts, if every one of the array's `count` tasks has ended.
    pub fn finished(states: &BTreeMap<JobState, i64>, count: i64) -> Option<Counts> {
        let n = |s| states.get(&s).copied().unwrap_or(0);
        let c = Counts {
            succeeded: n(JobState::Succeeded),
            failed: n(JobState::Failed),
            cancelled: n(JobState::Cancelled),
        };
        (c.succeeded + c.failed + c.cancelled == count).then_some(c)
    }

    /// "48 succeeded, 2 failed, 0 cancelled".
    pub fn text(&self) -> String {
        format!(
            "{} succeeded, {} failed, {} cancelled",
            self.succeeded, self.failed, self.cancelled
        )
    }
}

/// "array 12 (sweep)".
fn title(a: &Array) -> String {
    match &a.name {
        Some(n) => format!("array {} ({n})", a.id),
        None => format!("array {}", a.id),
    }
}

/// The deliveries for those of `arrays` (id -> when its latest task ended, as the pass
/// saw it) whose tasks have all ended, for the owners whose settings (`settings`) want
/// them. Two queries for the arrays, one per array for its own list.
pub fn deliveries(
    c: &mut DbConn,
    arrays: &BTreeMap<i64, NaiveDateTime>,
    settings: &BTreeMap<i64, Settings>,
    email_on: bool,
) -> Result<Vec<NewDelivery>, AppError> {
    if arrays.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = arrays.keys().copied().collect();
    let mut counts = db::arrays::counts_of(c, &ids)?;
    let mut out = Vec::new();
    for a in db::arrays::by_ids(c, &ids)? {
        let states = counts.remove(&a.id).unwrap_or_default();
        let (Some(done), Some(s), Some(first)) = (
            Counts::finished(&states, a.task_count),
            settings.get(&a.user_id),
            a.first_job,
        ) else {
            continue;
        };
        let own: Option<Vec<String>> = db::notifications::job_events_of(c, &[first])?
            .into_iter()
            .next()
            .and_then(|(_, e)| serde_json::from_str(&e).ok());
        let own = own.as_deref();
        let wanted = s.wants(EVENT, own) || (done.failed > 0 && s.wants("failed", own));
        if !wanted || (!(s.email && email_on) && s.webhooks.is_empty()) {
            continue;
        }
        let at = arrays.get(&a.id).copied().unwrap_or_else(db::now);
        out.extend(for_array(c, &a, done, at, s, email_on)?);
    }
    Ok(out)
}

/// The message about one finished array: an e-mail and one call per webhook.
fn for_array(
    c: &mut DbConn,
    a: &Array,
    done: Counts,
    at: NaiveDateTime,
    s: &Settings,
    email_on: bool,
) -> Result<Vec<NewDelivery>, AppError> {
    let message = format!("{} finished: {}", title(a), done.text());
    let body = json!({
        "type": "array.finished",
        "timestamp": at.and_utc().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": {
            "event": EVENT,
            "message": message,
            "array": {
                "id": a.id,
                "name": a.name,
                "spec": a.spec,
                "count": a.task_count,
                "first_job": a.first_job,
                "succeeded": done.succeeded,
                "failed": done.failed,
                "cancelled": done.cancelled,
            },
        }
    })
    .to_string();
    let base = NewDelivery {
        event_id: format!("arr_{}", a.id),
        user_id: a.user_id,
        job_id: a.first_job.unwrap_or_default(),
        event: EVENT.to_string(),
        channel: String::new(),
        target: String::new(),
        payload: String::new(),
    };
    let email = if s.email && email_on {
        let user = db::users::user_by_id(c, a.user_id)?;
        let mail = super::send::Mail {
            subject: format!("[GPU Commons] {message}"),
            text: format!(
                "{message}.\n\nIts tasks: /jobs?array={}\n\nChange which notifications you get \
                 on the portal's Settings page (/settings).\n",
                a.id
            ),
        };
        Some((user.email, mail))
    } else {
        None
    };
    super::queue::per_channel(&base, email, &s.webhooks, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_is_finished_when_every_task_ended() {
        let states = BTreeMap::from([
            (JobState::Succeeded, 3),
            (JobState::Failed, 1),
            (JobState::Running, 1),
        ]);
        assert_eq!(Counts::finished(&states, 5), None);
        let states = BTreeMap::from([
            (JobState::Succeeded, 3),
            (JobState::Failed, 1),
            (JobState::Cancelled, 1),
        ]);
        let c = Counts::finished(&states, 5).unwrap();
        assert_eq!(c.text(), "3 succeeded, 1 failed, 1 cancelled");
    }
}
