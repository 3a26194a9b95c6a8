//! Notifications: users' settings, a job's own event list, and the delivery queue that
//! is also each user's delivery log.
//!
//! Invariants:
//! - A delivery is unique by (event id, channel, target): turning the same job event into
//!   deliveries twice (two replicas, a retry after a crash) adds nothing.
//! - The cursor over `job_events` only moves forward, and only with the deliveries it
//!   made (one transaction, a conditional update): no event is skipped or doubled.
//! - A replica sends a delivery only while it holds the row's claim
//!   (`claimed_until` in the future), which it takes with a conditional update.

use super::models::JobEvent;
use super::schema::job_events;
use super::{clock, now, transaction, DbConn, DbError};
use chrono::NaiveDateTime;
use diesel::prelude::*;

diesel::table! {
    notification_settings (user_id) {
        user_id -> BigInt,
        email -> Bool,
        events -> Nullable<Text>,
        webhooks -> Text,
        updated_at -> Timestamp,
    }
}

diesel::table! {
    job_notify (job_id) {
        job_id -> BigInt,
        events -> Text,
    }
}

diesel::table! {
    notification_cursor (id) {
        id -> Integer,
        last_event_id -> BigInt,
    }
}

diesel::table! {
    notification_deliveries (id) {
        id -> BigInt,
        event_id -> Text,
        user_id -> BigInt,
        job_id -> BigInt,
        event -> Text,
        channel -> Text,
        target -> Text,
        payload -> Text,
        status -> Text,
        attempts -> Integer,
        created_at -> Timestamp,
        next_at -> Timestamp,
        claimed_until -> Nullable<Timestamp>,
        last_at -> Nullable<Timestamp>,
        last_answer -> Nullable<Text>,
    }
}

diesel::table! {
    job_notices (job_id, attempt, reason) {
        job_id -> BigInt,
        attempt -> Integer,
        reason -> Text,
        ends_at -> Timestamp,
        created_at -> Timestamp,
    }
}

/// A user's stored settings (JSON columns as stored).
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = notification_settings)]
pub struct SettingsRow {
    pub user_id: i64,
    pub email: bool,
    pub events: Option<String>,
    pub webhooks: String,
    pub updated_at: NaiveDateTime,
}

/// One queued (or done) delivery.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = notification_deliveries)]
pub struct DeliveryRow {
    pub id: i64,
    pub event_id: String,
    pub user_id: i64,
    pub job_id: i64,
    pub event: String,
    pub channel: String,
    pub target: String,
    pub payload: String,
    pub status: String,
    pub attempts: i32,
    pub created_at: NaiveDateTime,
    pub next_at: NaiveDateTime,
    pub claimed_until: Option<NaiveDateTime>,
    pub last_at: Option<NaiveDateTime>,
    pub last_answer: Option<String>,
}

/// A delivery to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDelivery {
    pub event_id: String,
    pub user_id: i64,
    pub job_id: i64,
    pub event: String,
    pub channel: String,
    pub target: String,
    pub payload: String,
}

pub fn settings(c: &mut DbConn, user: i64) -> Result<Option<SettingsRow>, DbError> {
    Ok(notification_settings::table
        .find(user)
        .select(SettingsRow::as_select())
        .first(c)
        .optional()?)
}

/// The settings of several users at once.
pub fn settings_of(c: &mut DbConn, users: &[i64]) -> Result<Vec<SettingsRow>, DbError> {
    Ok(notification_settings::table
        .filter(notification_settings::user_id.eq_any(users))
        .select(SettingsRow::as_select())
        .load(c)?)
}

/// Stores a user's settings whole (insert or replace).
pub fn put_settings(
    c: &mut DbConn,
    user: i64,
    email: bool,
    events: Option<&str>,
    webhooks: &str,
) -> Result<(), DbError> {
    let t = now();
    let q = diesel::insert_into(notification_settings::table)
        .values((
            notification_settings::user_id.eq(user),
            notification_settings::email.eq(email),
            notification_settings::events.eq(events),
            notification_settings::webhooks.eq(webhooks),
            notification_settings::updated_at.eq(t),
        ))
        .on_conflict(notification_settings::user_id)
        .do_update()
        .set((
            notification_settings::email.eq(email),
            notification_settings::events.eq(events),
            notification_settings::webhooks.eq(webhooks),
            notification_settings::updated_at.eq(t),
        ));
    // Upserts are per backend (diesel's MultiConnection has none of its own).
    match c {
        DbConn::Pg(c) => q.execute(c)?,
        DbConn::Sqlite(c) => q.execute(c)?,
    };
    Ok(())
}

/// A job's own event list (JSON), set at submission.
pub fn set_job_events(c: &mut DbConn, job: i64, events: &str) -> Result<(), DbError> {
    diesel::insert_into(job_notify::table)
        .values((job_notify::job_id.eq(job), job_notify::events.eq(events)))
        .execute(c)?;
    Ok(())
}

/// (job, events JSON) for those of `jobs` that have their own list.
pub fn job_events_of(c: &mut DbConn, jobs: &[i64]) -> Result<Vec<(i64, String)>, DbError> {
    Ok(job_notify::table
        .filter(job_notify::job_id.eq_any(jobs))
        .select((job_notify::job_id, job_notify::events))
        .load(c)?)
}

/// The job events after the cursor (at most `limit`, oldest first) and the cursor.
pub fn events_after_cursor(
    c: &mut DbConn,
    limit: i64,
) -> Result<(i64, Vec<(i64, JobEvent)>), DbError> {
    let cursor: i64 = notification_cursor::table
        .find(1)
        .select(notification_cursor::last_event_id)
        .first(c)?;
    let rows: Vec<JobEvent> = job_events::table
        .filter(job_events::id.gt(cursor))
        .order(job_events::id)
        .limit(limit)
        .select(JobEvent::as_select())
        .load(c)?;
    Ok((cursor, rows.into_iter().map(|e| (e.id, e)).collect()))
}

/// Queues `deliveries` and moves the cursor from `from` to `to`, in one transaction;
/// false (and nothing written) when another replica moved the cursor first.
pub fn enqueue(
    c: &mut DbConn,
    from: i64,
    to: i64,
    deliveries: &[NewDelivery],
) -> Result<bool, DbError> {
    transaction(c, |c| {
        let moved = diesel::update(
            notification_cursor::table
                .find(1)
                .filter(notification_cursor::last_event_id.eq(from)),
        )
        .set(notification_cursor::last_event_id.eq(to))
        .execute(c)?;
        if moved == 0 {
            return Ok(false);
        }
        add_deliveries(c, deliveries)?;
        Ok(true)
    })
}

/// Queues `deliveries` (pending from now); one already queued (the same event id,
/// channel and target) is left as it is.
pub fn add_deliveries(c: &mut DbConn, deliveries: &[NewDelivery]) -> Result<(), DbError> {
    let t = now();
    for d in deliveries {
        let q = diesel::insert_into(notification_deliveries::table)
            .values((
                notification_deliveries::event_id.eq(&d.event_id),
                notification_deliveries::user_id.eq(d.user_id),
                notification_deliveries::job_id.eq(d.job_id),
                notification_deliveries::event.eq(&d.event),
                notification_deliveries::channel.eq(&d.channel),
                notification_deliveries::target.eq(&d.target),
                notification_deliveries::payload.eq(&d.payload),
                notification_deliveries::status.eq("pending"),
                notification_deliveries::created_at.eq(t),
                notification_deliveries::next_at.eq(t),
            ))
            .on_conflict_do_nothing();
        match c {
            DbConn::Pg(c) => q.execute(c)?,
            DbConn::Sqlite(c) => q.execute(c)?,
        };
    }
    Ok(())
}

/// Takes up to `limit` due deliveries for `lease_s` seconds; returns those this call
/// took (a row another replica holds, or took meanwhile, is left out).
pub fn claim_due(c: &mut DbConn, limit: i64, lease_s: i64) -> Result<Vec<DeliveryRow>, DbError> {
    let t = clock(c)?;
    let until = t + chrono::Duration::seconds(lease_s);
    let due: Vec<i64> = notification_deliveries::table
        .filter(notification_deliveries::status.eq("pending"))
        .filter(notification_deliveries::next_at.le(t))
        .filter(
            notification_deliveries::claimed_until
                .is_null()
                .or(notification_deliveries::claimed_until.lt(t)),
        )
        .order(notification_deliveries::next_at)
        .limit(limit)
        .select(notification_deliveries::id)
        .load(c)?;
    let mut taken = Vec::new();
    for id in due {
        // Still pending: another replica may have claimed, sent and released it since
        // `due` was read (a released claim alone would let it be sent twice).
        let n = diesel::update(
            notification_deliveries::table
                .find(id)
                .filter(notification_deliveries::status.eq("pending"))
                .filter(
                    notification_deliveries::claimed_until
                        .is_null()
                        .or(notification_deliveries::claimed_until.lt(t)),
                ),
        )
        .set(notification_deliveries::claimed_until.eq(until))
        .execute(c)?;
        if n == 1 {
            taken.push(id);
        }
    }
    Ok(notification_deliveries::table
        .filter(notification_deliveries::id.eq_any(&taken))
        .order(notification_deliveries::id)
        .select(DeliveryRow::as_select())
        .load(c)?)
}

/// Records an attempt: `next_at` None means done (`status` sent or failed); Some means
/// pending again from then on. The claim is released.
pub fn record_attempt(
    c: &mut DbConn,
    id: i64,
    status: &str,
    answer: &str,
    next_at: Option<NaiveDateTime>,
) -> Result<(), DbError> {
    let t = now();
    diesel::update(notification_deliveries::table.find(id))
        .set((
            notification_deliveries::status.eq(status),
            notification_deliveries::attempts.eq(notification_deliveries::attempts + 1),
            notification_deliveries::last_at.eq(t),
            notification_deliveries::last_answer.eq(answer),
            notification_deliveries::next_at.eq(next_at.unwrap_or(t)),
            notification_deliveries::claimed_until.eq(None::<NaiveDateTime>),
        ))
        .execute(c)?;
    Ok(())
}

/// A user's latest deliveries, newest first.
pub fn deliveries(c: &mut DbConn, user: i64, limit: i64) -> Result<Vec<DeliveryRow>, DbError> {
    Ok(notification_deliveries::table
        .filter(notification_deliveries::user_id.eq(user))
        .order(notification_deliveries::id.desc())
        .limit(limit)
        .select(DeliveryRow::as_select())
        .load(c)?)
}

/// Deletes finished deliveries (sent or given up) created before `before`; how many.
pub fn expire(c: &mut DbConn, before: NaiveDateTime) -> Result<usize, DbError> {
    Ok(diesel::delete(
        notification_deliveries::table
            .filter(notification_deliveries::status.ne("pending"))
            .filter(notification_deliveries::created_at.lt(before)),
    )
    .execute(c)?)
}

/// Records that attempt `attempt` of `job` was told it ends at `ends_at` for `reason`;
/// false (and nothing written) when it already was.
pub fn insert_notice(
    c: &mut DbConn,
    job: i64,
    attempt: i32,
    reason: &str,
    ends_at: NaiveDateTime,
) -> Result<bool, DbError> {
    let q = diesel::insert_into(job_notices::table)
        .values((
            job_notices::job_id.eq(job),
            job_notices::attempt.eq(attempt),
            job_notices::reason.eq(reason),
            job_notices::ends_at.eq(ends_at),
            job_notices::created_at.eq(now()),
        ))
        .on_conflict_do_nothing();
    let n = match c {
        DbConn::Pg(c) => q.execute(c)?,
        DbConn::Sqlite(c) => q.execute(c)?,
    };
    Ok(n == 1)
}

/// A running job that an `ending` notice may be for: its current attempt, when that
/// attempt started running, and its time limit.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct Running {
    pub job: i64,
    pub attempt: i32,
    pub started_at: Option<NaiveDateTime>,
    pub time_limit_s: i64,
}

/// The running interactive jobs and jobs with a web app, with their current attempt's
/// start, that have no notice for `reason` yet for that attempt (two queries).
pub fn running_without_notice(c: &mut DbConn, reason: &str) -> Result<Vec<Running>, DbError> {
    use super::domain::JobKind;
    use super::models::JobState;
    use super::schema::{job_apps, job_attempts, jobs};
    let apps = job_apps::table.select(job_apps::job_id);
    let rows: Vec<Running> = jobs::table
        .inner_join(job_attempts::table)
        .filter(jobs::state.eq(JobState::Running))
        .filter(job_attempts::attempt.eq(jobs::attempts))
        .filter(
            jobs::kind
                .eq(JobKind::Interactive)
                .or(jobs::id.eq_any(apps)),
        )
        .order(jobs::id)
        .select((
            jobs::id,
            jobs::attempts,
            job_attempts::started_at,
            jobs::time_limit_s,
        ))
        .load(c)?;
    if rows.is_empty() {
        return Ok(rows);
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.job).collect();
    let told: std::collections::BTreeSet<(i64, i32)> = job_notices::table
        .filter(job_notices::job_id.eq_any(&ids))
        .filter(job_notices::reason.eq(reason))
        .select((job_notices::job_id, job_notices::attempt))
        .load::<(i64, i32)>(c)?
        .into_iter()
        .collect();
    Ok(rows
        .into_iter()
        .filter(|r| !told.contains(&(r.job, r.attempt)))
        .collect())
}
