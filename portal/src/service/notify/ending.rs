//! About-to-end notices (`ending`): an interactive job, or a job serving a web app, is
//! told shortly before the portal ends it, so its user can save work or extend it.
//!
//! Two causes: its time limit, checked here every few seconds by the notifier's
//! background task ([`check_time_limits`]), and the app idle rule, whose owner calls
//! [`queue_ending`] with its own reason.
//!
//! Invariants:
//! - One notice per job, attempt and reason: a `job_notices` row is written with the
//!   deliveries in one transaction, and a second call finds it and does nothing. The
//!   event id (`end_<job>_<attempt>_<reason>`) is stable, so a receiver can deduplicate.
//! - A job hears of its time limit within 10 minutes of it, or within a tenth of its
//!   limit if that is shorter (a 20-minute job at 18 minutes), never after it.

use super::Settings;
use crate::db::models::Job;
use crate::db::notifications::{self as store, NewDelivery, Running};
use crate::db::{self, DbConn};
use crate::error::AppError;
use chrono::{Duration, NaiveDateTime};
use serde_json::json;

/// The event's name.
pub const EVENT: &str = "ending";
/// The reason a job ends at its time limit.
pub const TIME_LIMIT: &str = "time limit";
/// The longest warning, in seconds.
pub const MAX_NOTICE_S: i64 = 600;

/// How long before its end a job with a limit of `limit_s` seconds is told: 10
/// minutes, or a tenth of its limit if that is shorter.
pub fn notice_s(limit_s: i64) -> i64 {
    (limit_s / 10).min(MAX_NOTICE_S)
}

/// When `r` reaches its time limit, if that is within its notice at `now` (and not yet
/// past).
pub fn due(r: &Running, now: NaiveDateTime) -> Option<NaiveDateTime> {
    let ends = r.started_at? + Duration::seconds(r.time_limit_s);
    let from = ends - Duration::seconds(notice_s(r.time_limit_s));
    (from <= now && now < ends).then_some(ends)
}

/// Tells every running interactive or app job whose time limit is near, once per
/// attempt (`email_on`: whether the portal has an SMTP relay); how many were told (or
/// had nobody to tell).
pub fn check_time_limits(c: &mut DbConn, email_on: bool) -> Result<usize, AppError> {
    let now = db::now();
    let mut n = 0;
    for r in store::running_without_notice(c, TIME_LIMIT)? {
        if let Some(ends) = due(&r, now) {
            queue(c, r.job, TIME_LIMIT, ends, email_on)?;
            n += 1;
        }
    }
    Ok(n)
}

/// "time limit" -> "time_limit", for the event id.
fn slug(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Queues the `ending` notice of job `job_id`'s current attempt: it will end at
/// `ends_at` because of `reason` ("time limit", "idle"). Idempotent per job, attempt
/// and reason: a second call (from another pass or replica) queues nothing. Whether
/// anything is sent is the owner's choice (settings, or the job's `notify` list); an
/// e-mail queued on a portal without an SMTP relay is logged as failed by the sender.
pub fn queue_ending(
    c: &mut DbConn,
    job_id: i64,
    reason: &str,
    ends_at: NaiveDateTime,
) -> Result<(), AppError> {
    queue(c, job_id, reason, ends_at, true)
}

fn queue(
    c: &mut DbConn,
    job_id: i64,
    reason: &str,
    ends_at: NaiveDateTime,
    email_on: bool,
) -> Result<(), AppError> {
    db::transaction(c, |c| {
        let job = db::jobs::get(c, job_id)?;
        if !store::insert_notice(c, job.id, job.attempts, reason, ends_at)? {
            return Ok(());
        }
        let s = Settings::from_row(store::settings(c, job.user_id)?);
        let own: Option<Vec<String>> = store::job_events_of(c, &[job.id])?
            .into_iter()
            .next()
            .and_then(|(_, e)| serde_json::from_str(&e).ok());
        if !s.wants(EVENT, own.as_deref()) || (!(s.email && email_on) && s.webhooks.is_empty()) {
            return Ok(());
        }
        let out = deliveries(c, &job, reason, ends_at, &s, email_on)?;
        store::add_deliveries(c, &out)?;
        tracing::info!(job = job.id, reason, %ends_at, deliveries = out.len(), "ending notice queued");
        Ok(())
    })
}

fn deliveries(
    c: &mut DbConn,
    job: &Job,
    reason: &str,
    ends_at: NaiveDateTime,
    s: &Settings,
    email_on: bool,
) -> Result<Vec<NewDelivery>, AppError> {
    let view = crate::service::views::job_view(c, job)?;
    let when = ends_at.format("%Y-%m-%d %H:%M:%S UTC");
    let message = format!("ends at {when} ({reason})");
    let body = json!({
        "type": "job.ending",
        "timestamp": db::now().and_utc().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": {
            "event": EVENT,
            "message": message,
            "reason": reason,
            "ends_at": ends_at.and_utc().to_rfc3339(),
            "job": view,
        }
    })
    .to_string();
    let base = NewDelivery {
        event_id: format!("end_{}_{}_{}", job.id, job.attempts, slug(reason)),
        user_id: job.user_id,
        job_id: job.id,
        event: EVENT.to_string(),
        channel: String::new(),
        target: String::new(),
        payload: String::new(),
    };
    let email = if s.email && email_on {
        let user = db::users::user_by_id(c, job.user_id)?;
        let mut mail = super::send::email_text(job, EVENT, &message, None);
        mail.text.push_str(
            "\nSave what you need now; an interactive job can be extended from its page \
             (Extend) or with POST /api/v1/jobs/{id}/extend.\n",
        );
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
    fn a_job_is_told_ten_minutes_or_a_tenth_of_its_limit_before_its_end() {
        assert_eq!(notice_s(8 * 3600), 600);
        assert_eq!(notice_s(20 * 60), 120);
        assert_eq!(notice_s(60), 6);
        let t0 = chrono::NaiveDate::from_ymd_opt(2026, 12, 12)
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap();
        let r = Running {
            job: 1,
            attempt: 1,
            started_at: Some(t0),
            time_limit_s: 3 * 3600,
        };
        let at = |m: i64| t0 + Duration::minutes(m);
        assert_eq!(due(&r, at(169)), None);
        assert_eq!(due(&r, at(170)), Some(at(180)));
        assert_eq!(due(&r, at(179)), Some(at(180)));
        assert_eq!(due(&r, at(180)), None, "past its end: too late to tell");
        assert_eq!(
            due(
                &Running {
                    started_at: None,
                    ..r
                },
                at(179)
            ),
            None
        );
        assert_eq!(slug("time limit"), "time_limit");
    }
}
