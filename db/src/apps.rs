//! Web apps served by jobs: the port and origin label of each job's app, and the grants
//! (one-time codes and origin sessions) that let its owner's browser in.
//!
//! Invariants (kept by `service::apps`):
//! - A job has at most one app; its `host` label is random and unique campus-wide.
//! - Secrets are never stored, only their SHA-256; a code is taken (deleted) by the
//!   statement that checks it, so it works once.

use super::models::JobState;
use super::schema::*;
use super::{DbConn, DbError};
use chrono::NaiveDateTime;
use diesel::prelude::*;

/// A job's app.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = job_apps)]
pub struct AppRow {
    pub job_id: i64,
    pub port: i32,
    pub host: String,
    /// The app's origin, `[apps] url` with the label in it.
    pub url: String,
    pub last_activity_at: Option<NaiveDateTime>,
    /// Minutes without use after which the job ends; `None`: no idle limit.
    pub idle_minutes: Option<i32>,
    /// When the portal last warned that the app would end for want of use.
    pub idle_warned_at: Option<NaiveDateTime>,
}

/// What a grant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantKind {
    /// Minted by the portal for the job's owner; redeemed once by the app's origin.
    Code,
    /// The app origin's cookie.
    Session,
}

impl GrantKind {
    fn as_str(self) -> &'static str {
        match self {
            GrantKind::Code => "code",
            GrantKind::Session => "session",
        }
    }
}

/// What a job's app is at submission.
#[derive(Debug, Clone)]
pub struct NewApp<'a> {
    pub port: i32,
    pub host: &'a str,
    pub url: &'a str,
    pub idle_minutes: Option<i32>,
}

/// Records `job`'s app.
pub fn insert(c: &mut DbConn, job: i64, app: &NewApp) -> Result<(), DbError> {
    diesel::insert_into(job_apps::table)
        .values((
            job_apps::job_id.eq(job),
            job_apps::port.eq(app.port),
            job_apps::host.eq(app.host),
            job_apps::url.eq(app.url),
            job_apps::idle_minutes.eq(app.idle_minutes),
        ))
        .execute(c)?;
    Ok(())
}

/// The apps with an idle limit whose jobs run, with their owners (for the idle rule).
pub fn idle_limited_running(c: &mut DbConn) -> Result<Vec<(AppRow, i64)>, DbError> {
    Ok(job_apps::table
        .inner_join(jobs::table)
        .filter(jobs::state.eq(crate::domain::JobState::Running))
        .filter(job_apps::idle_minutes.is_not_null())
        .select((AppRow::as_select(), jobs::user_id))
        .load(c)?)
}

/// Notes that the app of `job` was warned at `at`, unless a warning at or after `since`
/// (its last use) is noted already; whether this one was (so a warning is written once).
pub fn set_warned(
    c: &mut DbConn,
    job: i64,
    at: NaiveDateTime,
    since: NaiveDateTime,
) -> Result<bool, DbError> {
    let n = diesel::update(
        job_apps::table.find(job).filter(
            job_apps::idle_warned_at
                .is_null()
                .or(job_apps::idle_warned_at.lt(since)),
        ),
    )
    .set(job_apps::idle_warned_at.eq(at))
    .execute(c)?;
    Ok(n > 0)
}

/// `job`'s app, if it serves one.
pub fn of_job(c: &mut DbConn, job: i64) -> Result<Option<AppRow>, DbError> {
    Ok(job_apps::table
        .find(job)
        .select(AppRow::as_select())
        .first(c)
        .optional()?)
}

/// The apps of these jobs (for lists).
pub fn of_jobs(c: &mut DbConn, jobs: &[i64]) -> Result<Vec<AppRow>, DbError> {
    let mut out = Vec::new();
    // Chunked: SQLite allows a limited number of bound parameters.
    for chunk in jobs.chunks(500) {
        out.extend(
            job_apps::table
                .filter(job_apps::job_id.eq_any(chunk))
                .select(AppRow::as_select())
                .load(c)?,
        );
    }
    Ok(out)
}

/// An app to probe: its job runs, and its app has not answered during this attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToProbe {
    pub job_id: i64,
    pub port: i32,
    pub node_id: i64,
    pub attempt: i32,
}

/// The running jobs' apps that have not answered during their current attempt.
pub fn to_probe(c: &mut DbConn) -> Result<Vec<ToProbe>, DbError> {
    let running: Vec<(i64, i32, Option<i64>, i32)> = job_apps::table
        .inner_join(jobs::table)
        .filter(jobs::state.eq(JobState::Running))
        .select((
            job_apps::job_id,
            job_apps::port,
            jobs::node_id,
            jobs::attempts,
        ))
        .load(c)?;
    let ids: Vec<i64> = running.iter().map(|r| r.0).collect();
    let ready = ready_attempts(c, &ids)?;
    Ok(running
        .into_iter()
        .filter(|(job, _, _, attempt)| ready.get(job) != Some(attempt))
        .filter_map(|(job_id, port, node, attempt)| {
            Some(ToProbe {
                job_id,
                port,
                node_id: node?,
                attempt,
            })
        })
        .collect())
}

/// `user`'s running jobs whose app answered during their current attempt: (job, its
/// name, the app's URL), newest first.
pub fn answered_of_user(
    c: &mut DbConn,
    user: i64,
) -> Result<Vec<(i64, Option<String>, String)>, DbError> {
    let running: Vec<(i64, Option<String>, String, i32)> = job_apps::table
        .inner_join(jobs::table)
        .filter(jobs::user_id.eq(user))
        .filter(jobs::state.eq(JobState::Running))
        .order(jobs::id.desc())
        .select((job_apps::job_id, jobs::name, job_apps::url, jobs::attempts))
        .load(c)?;
    let ids: Vec<i64> = running.iter().map(|r| r.0).collect();
    let ready = ready_attempts(c, &ids)?;
    Ok(running
        .into_iter()
        .filter(|(job, _, _, attempt)| ready.get(job) == Some(attempt))
        .map(|(job, name, url, _)| (job, name, url))
        .collect())
}

/// The attempt during which each of `jobs`' apps last answered.
pub fn ready_attempts(
    c: &mut DbConn,
    jobs: &[i64],
) -> Result<std::collections::BTreeMap<i64, i32>, DbError> {
    let mut out = std::collections::BTreeMap::new();
    for chunk in jobs.chunks(500) {
        out.extend(
            app_ready::table
                .filter(app_ready::job_id.eq_any(chunk))
                .select((app_ready::job_id, app_ready::attempt))
                .load::<(i64, i32)>(c)?,
        );
    }
    Ok(out)
}

/// Records that `job`'s app answered during `attempt`.
pub fn set_ready(c: &mut DbConn, job: i64, attempt: i32, at: NaiveDateTime) -> Result<(), DbError> {
    diesel::delete(app_ready::table.find(job)).execute(c)?;
    diesel::insert_into(app_ready::table)
        .values((
            app_ready::job_id.eq(job),
            app_ready::attempt.eq(attempt),
            app_ready::at.eq(at),
        ))
        .execute(c)?;
    Ok(())
}

/// The app whose origin label is `host`.
pub fn by_host(c: &mut DbConn, host: &str) -> Result<Option<AppRow>, DbError> {
    Ok(job_apps::table
        .filter(job_apps::host.eq(host))
        .select(AppRow::as_select())
        .first(c)
        .optional()?)
}

/// Notes traffic through the app's proxy at `at`, unless it was noted after `since`
/// already (a write at most that often).
pub fn touch(
    c: &mut DbConn,
    job: i64,
    at: NaiveDateTime,
    since: NaiveDateTime,
) -> Result<(), DbError> {
    diesel::update(
        job_apps::table.find(job).filter(
            job_apps::last_activity_at
                .is_null()
                .or(job_apps::last_activity_at.lt(since)),
        ),
    )
    .set(job_apps::last_activity_at.eq(at))
    .execute(c)?;
    Ok(())
}

/// Stores a grant (its secret's SHA-256, hex).
pub fn grant(
    c: &mut DbConn,
    kind: GrantKind,
    secret_sha256: &str,
    job: i64,
    user: i64,
    expires_at: NaiveDateTime,
) -> Result<(), DbError> {
    diesel::insert_into(app_grants::table)
        .values((
            app_grants::secret_sha256.eq(secret_sha256),
            app_grants::kind.eq(kind.as_str()),
            app_grants::job_id.eq(job),
            app_grants::user_id.eq(user),
            app_grants::expires_at.eq(expires_at),
        ))
        .execute(c)?;
    Ok(())
}

/// Takes (deletes) a code grant: `(job, user)` when it existed and was still good at
/// `now`. A second take of the same code finds nothing.
pub fn take_code(
    c: &mut DbConn,
    secret_sha256: &str,
    now: NaiveDateTime,
) -> Result<Option<(i64, i64)>, DbError> {
    let taken: Option<(i64, i64, NaiveDateTime)> = diesel::delete(
        app_grants::table
            .filter(app_grants::secret_sha256.eq(secret_sha256))
            .filter(app_grants::kind.eq(GrantKind::Code.as_str())),
    )
    .returning((
        app_grants::job_id,
        app_grants::user_id,
        app_grants::expires_at,
    ))
    .get_result(c)
    .optional()?;
    Ok(taken.and_then(|(job, user, until)| (until > now).then_some((job, user))))
}

/// A session grant: `(job, user)` while it is good at `now`.
pub fn session(
    c: &mut DbConn,
    secret_sha256: &str,
    now: NaiveDateTime,
) -> Result<Option<(i64, i64)>, DbError> {
    Ok(app_grants::table
        .filter(app_grants::secret_sha256.eq(secret_sha256))
        .filter(app_grants::kind.eq(GrantKind::Session.as_str()))
        .filter(app_grants::expires_at.gt(now))
        .select((app_grants::job_id, app_grants::user_id))
        .first(c)
        .optional()?)
}

/// Deletes grants past their expiry; returns how many.
pub fn expire(c: &mut DbConn, now: NaiveDateTime) -> Result<usize, DbError> {
    Ok(diesel::delete(app_grants::table.filter(app_grants::expires_at.le(now))).execute(c)?)
}
