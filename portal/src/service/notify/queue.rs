//! Job events into deliveries: reads the `job_events` rows after the cursor and queues
//! one delivery per channel that wants each (steps 1 and 2 of the module above).

use super::Settings;
use crate::db::models::{Job, JobEvent, JobState};
use crate::db::notifications::{self as store, NewDelivery};
use crate::db::{self, DbConn};
use crate::error::AppError;
use chrono::NaiveDateTime;
use serde_json::json;
use std::collections::BTreeMap;

/// Events read per pass.
const BATCH: i64 = 500;

/// The event a state change is notified as, if any.
pub fn event_of(state: JobState) -> Option<&'static str> {
    match state {
        JobState::Running => Some("started"),
        JobState::Preempting => Some("preempted"),
        JobState::Succeeded => Some("succeeded"),
        JobState::Failed => Some("failed"),
        JobState::Cancelled => Some("cancelled"),
        _ => None,
    }
}

/// When a preempted job's grace ends: the history row says "(grace N s)" from the moment
/// the `Stop` (SIGTERM) was sent.
pub fn grace_deadline(e: &JobEvent) -> Option<NaiveDateTime> {
    let (_, rest) = e.message.rsplit_once("(grace ")?;
    let secs: i64 = rest.split_once(" s)")?.0.trim().parse().ok()?;
    Some(e.at + chrono::Duration::seconds(secs))
}

/// How long a gap in the event ids may stay open before it is taken for a rolled-back
/// insert and passed over.
const GAP_WAIT_S: i64 = 10;

/// How many of `events` (ordered by id, after the cursor `from`) may be passed now. On
/// PostgreSQL ids are taken when a row is inserted but seen when its transaction commits,
/// so a later id can be visible before an earlier one: the cursor stops before a gap
/// until the gap is filled, or until the event after it is `GAP_WAIT_S` old (the missing
/// id then belongs to a transaction that rolled back).
pub fn settled(from: i64, events: &[(i64, JobEvent)], now: NaiveDateTime) -> usize {
    let mut expected = from + 1;
    for (i, (id, e)) in events.iter().enumerate() {
        if *id != expected && e.at > now - chrono::Duration::seconds(GAP_WAIT_S) {
            return i;
        }
        expected = id + 1;
    }
    events.len()
}

/// One pass: queues the deliveries for the events after the cursor and moves it.
/// Returns how many events it read (0: nothing new, or another replica was first).
pub fn pass(c: &mut DbConn, email_on: bool) -> Result<usize, AppError> {
    let (from, mut events) = store::events_after_cursor(c, BATCH)?;
    events.truncate(settled(from, &events, db::now()));
    let Some(&(to, _)) = events.last() else {
        return Ok(0);
    };
    let notified: Vec<&JobEvent> = events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| event_of(e.state).is_some())
        .collect();
    let mut job_ids: Vec<i64> = notified.iter().map(|e| e.job_id).collect();
    job_ids.sort_unstable();
    job_ids.dedup();
    let jobs: BTreeMap<i64, Job> = db::jobs::by_ids(c, &job_ids)?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    let mut users: Vec<i64> = jobs.values().map(|j| j.user_id).collect();
    users.sort_unstable();
    users.dedup();
    let settings: BTreeMap<i64, Settings> = store::settings_of(c, &users)?
        .into_iter()
        .map(|r| (r.user_id, Settings::from_row(Some(r))))
        .collect();
    let own: BTreeMap<i64, Vec<String>> = store::job_events_of(c, &job_ids)?
        .into_iter()
        .filter_map(|(j, e)| Some((j, serde_json::from_str(&e).ok()?)))
        .collect();
    let mut out = Vec::new();
    // Arrays whose tasks ended in this batch: when each task ended last.
    let mut arrays: BTreeMap<i64, NaiveDateTime> = BTreeMap::new();
    for e in notified {
        let (Some(job), Some(event)) = (jobs.get(&e.job_id), event_of(e.state)) else {
            continue;
        };
        // An array's tasks send nothing of their own: the array sends one message.
        if let Some(a) = job.array_id {
            if e.state.is_final() {
                let t = arrays.entry(a).or_insert(e.at);
                *t = (*t).max(e.at);
            }
            continue;
        }
        let Some(s) = settings.get(&job.user_id) else {
            continue;
        };
        if !s.wants(event, own.get(&job.id).map(Vec::as_slice)) {
            continue;
        }
        if !(s.email && email_on) && s.webhooks.is_empty() {
            continue;
        }
        out.extend(deliveries(c, e, event, job, s, email_on)?);
    }
    out.extend(super::array_done::deliveries(
        c, &arrays, &settings, email_on,
    )?);
    let n = events.len();
    if store::enqueue(c, from, to, &out)? {
        if !out.is_empty() {
            tracing::info!(events = n, deliveries = out.len(), "notifications queued");
        }
        Ok(n)
    } else {
        Ok(0)
    }
}

/// The deliveries of one event: an e-mail and one per webhook, each with the body it
/// will be sent with on every try.
fn deliveries(
    c: &mut DbConn,
    e: &JobEvent,
    event: &str,
    job: &Job,
    s: &Settings,
    email_on: bool,
) -> Result<Vec<NewDelivery>, AppError> {
    let view = crate::service::views::job_view(c, job)?;
    let event_id = format!("evt_{}", e.id);
    let deadline = (e.state == JobState::Preempting)
        .then(|| grace_deadline(e))
        .flatten();
    let body = json!({
        "type": format!("job.{event}"),
        "timestamp": e.at.and_utc().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": {
            "event": event,
            "message": e.message,
            "grace_deadline": deadline.map(|d| d.and_utc().to_rfc3339()),
            "job": view,
        }
    })
    .to_string();
    let base = NewDelivery {
        event_id,
        user_id: job.user_id,
        job_id: job.id,
        event: event.to_string(),
        channel: String::new(),
        target: String::new(),
        payload: String::new(),
    };
    let email = if s.email && email_on {
        let user = db::users::user_by_id(c, job.user_id)?;
        let mail = super::send::email_text(job, event, &e.message, deadline);
        Some((user.email, mail))
    } else {
        None
    };
    per_channel(&base, email, &s.webhooks, &body)
}

/// One delivery of `base` per channel: to `email` (the address and the message), when
/// given, and to each of `webhooks` with `body`.
pub fn per_channel(
    base: &NewDelivery,
    email: Option<(String, super::send::Mail)>,
    webhooks: &[super::Webhook],
    body: &str,
) -> Result<Vec<NewDelivery>, AppError> {
    let mut out = Vec::new();
    if let Some((address, mail)) = email {
        out.push(NewDelivery {
            channel: "email".into(),
            target: address,
            payload: serde_json::to_string(&mail).map_err(db::DbError::from)?,
            ..base.clone()
        });
    }
    out.extend(webhooks.iter().map(|w| NewDelivery {
        channel: "webhook".into(),
        target: w.id.clone(),
        payload: body.to_string(),
        ..base.clone()
    }));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_waits_at_a_fresh_gap_and_passes_an_old_one() {
        let now = chrono::NaiveDate::from_ymd_opt(2026, 12, 5)
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap();
        let ev = |id: i64, age_s: i64| {
            (
                id,
                JobEvent {
                    id,
                    job_id: 1,
                    at: now - chrono::Duration::seconds(age_s),
                    state: JobState::Running,
                    message: String::new(),
                },
            )
        };
        assert_eq!(settled(10, &[ev(11, 0), ev(12, 0), ev(14, 0)], now), 2);
        assert_eq!(settled(10, &[ev(12, 0)], now), 0);
        assert_eq!(settled(10, &[ev(11, 0), ev(13, 30), ev(14, 0)], now), 3);
    }

    #[test]
    fn the_grace_deadline_comes_from_the_preemption_row() {
        let at = chrono::NaiveDate::from_ymd_opt(2026, 12, 5)
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap();
        let e = JobEvent {
            id: 1,
            job_id: 2,
            at,
            state: JobState::Preempting,
            message: "preempting: the owner needs the GPU (grace 120 s)".into(),
        };
        assert_eq!(
            grace_deadline(&e),
            Some(at + chrono::Duration::seconds(120))
        );
    }
}
