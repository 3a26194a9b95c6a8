//! The idle rule of web apps: a running job whose app has an idle limit (from its
//! preset, or `app.idle_minutes`) and has not been used for that long ends, with a
//! warning first. Use is a request through the app's proxy, an open WebSocket to it, or
//! an SSH session into the job (both noted every 20 s while they stay open), written
//! down in `job_apps.last_activity_at` (requests at most every 30 s). GPU idleness is the agent's separate rule.
//!
//! The check ([`check`]) runs on the scheduling replica only, every few seconds:
//! 1. Read the running jobs whose app has an idle limit, and when their attempts started
//!    (an app is idle since its last use, or since its attempt started).
//! 2. Judge each ([`judge`], pure): an app idle for its limit less the warning time
//!    (`min(10 min, limit / 4)`) is warned: a line in its history ("idle for N min: this
//!    app ends at HH:MM UTC unless used"), and its page says so while it stays idle.
//!    Once the limit is reached, and never before the warning time has passed since the
//!    warning (a late check moves the end, never skips the warning), the job ends as
//!    cancelled, "ended after M idle minutes" (its history and its reason).
//! 3. Use after a warning clears it (the warning is older than the last use).
//!
//! Idempotent: a warning is written only where none is noted since the last use (a
//! conditional update), and ending an ended job is a no-op.

use super::Ctx;
use crate::db::{self, DbConn};
use crate::error::AppError;
use chrono::{Duration, NaiveDateTime};
use commons_proto::PortalMsg;

/// The longest warning before an idle app ends.
pub const MAX_WARNING_S: i64 = 600;

/// How long before the end an idle app is warned: a quarter of its limit, at most 10
/// minutes.
pub fn warning_s(limit_s: i64) -> i64 {
    (limit_s / 4).min(MAX_WARNING_S)
}

/// What the rule says of one app now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// In use, or warned already and not yet at its end.
    Fine,
    /// Warn now: it ends at `ends_at` unless used.
    Warn { ends_at: NaiveDateTime },
    /// End it now.
    End,
}

/// When a warned app ends: its limit after its last use, but never sooner than the
/// warning time after the warning.
fn end_of(since: NaiveDateTime, limit_s: i64, warned: NaiveDateTime) -> NaiveDateTime {
    (since + Duration::seconds(limit_s)).max(warned + Duration::seconds(warning_s(limit_s)))
}

/// Judges an app idle since `since` (its last use, or its attempt's start) with a limit
/// of `limit_s`, warned last at `warned_at`.
pub fn judge(
    now: NaiveDateTime,
    since: NaiveDateTime,
    limit_s: i64,
    warned_at: Option<NaiveDateTime>,
) -> Verdict {
    match warned_at.filter(|w| *w >= since) {
        Some(w) if now >= end_of(since, limit_s, w) => Verdict::End,
        Some(_) => Verdict::Fine,
        None if now >= since + Duration::seconds(limit_s - warning_s(limit_s)) => Verdict::Warn {
            ends_at: end_of(since, limit_s, now),
        },
        None => Verdict::Fine,
    }
}

/// When an app that was warned ends unless used; `None` when it is not under a warning
/// (for the job's page).
pub fn ends_at(
    since: NaiveDateTime,
    limit_s: i64,
    warned_at: Option<NaiveDateTime>,
) -> Option<NaiveDateTime> {
    warned_at
        .filter(|w| *w >= since)
        .map(|w| end_of(since, limit_s, w))
}

/// Since when an app is idle: its last use, or the start of its running attempt.
pub fn idle_since(
    last_activity: Option<NaiveDateTime>,
    started: Option<NaiveDateTime>,
) -> Option<NaiveDateTime> {
    match (last_activity, started) {
        (Some(a), Some(s)) => Some(a.max(s)),
        (a, s) => a.or(s),
    }
}

fn minutes(d: Duration) -> i64 {
    d.num_minutes().max(0)
}

/// "1 minute", "5 minutes".
fn plural(n: i64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// One pass of the rule over every running app with an idle limit; returns how many
/// apps it warned and ended.
pub async fn check(ctx: &Ctx) -> Result<(usize, usize), AppError> {
    let now = db::now();
    let (warned, ended) = ctx.db.run(move |c| judge_all(c, now)).await?;
    for (job, node, attempt, why) in &ended {
        let stop = PortalMsg::Stop {
            job: *job,
            attempt: *attempt,
            grace_s: super::attempts::SHORT_GRACE_S,
            reason: commons_proto::StopReason::Cancelled,
            detail: Some(why.clone()),
        };
        if let Err(e) = super::agents::deliver(ctx, *node, stop).await {
            tracing::info!(job, "idle end not passed to the agent now: {e}");
        }
    }
    if ended.is_empty() && warned == 0 {
        return Ok((0, 0));
    }
    tracing::info!(warned, ended = ended.len(), "idle apps");
    Ok((warned, ended.len()))
}

/// An ended job's attempt to stop: (job, node, attempt, why).
type Ended = (i64, i64, i32, String);

/// Steps 1-3 in the database: the warnings written, and the ended jobs' attempts to stop.
fn judge_all(c: &mut DbConn, now: NaiveDateTime) -> Result<(usize, Vec<Ended>), AppError> {
    let apps = db::apps::idle_limited_running(c)?;
    if apps.is_empty() {
        return Ok((0, Vec::new()));
    }
    let ids: Vec<i64> = apps.iter().map(|(a, _)| a.job_id).collect();
    let started: std::collections::BTreeMap<i64, Option<NaiveDateTime>> =
        db::jobs::last_attempts(c, &ids)?
            .into_iter()
            .map(|a| (a.job_id, a.started_at))
            .collect();
    let mut warned = 0;
    let mut ended = Vec::new();
    for (app, _owner) in apps {
        let Some(limit) = app.idle_minutes else {
            continue;
        };
        let limit_s = i64::from(limit) * 60;
        let start = started.get(&app.job_id).copied().flatten();
        let Some(since) = idle_since(app.last_activity_at, start) else {
            continue;
        };
        match judge(now, since, limit_s, app.idle_warned_at) {
            Verdict::Fine => {}
            Verdict::Warn { ends_at } => {
                if warn(c, app.job_id, now, since, ends_at)? {
                    warned += 1;
                }
            }
            Verdict::End => {
                let why = format!(
                    "ended after {}",
                    plural(minutes(now - since), "idle minute")
                );
                let job = db::jobs::get(c, app.job_id)?;
                match db::jobs::end_for(c, &job, &why) {
                    Ok(Some(a)) => ended.push((job.id, a.node_id, a.attempt, why)),
                    Ok(None) => {}
                    // Ended meanwhile (its owner cancelled it, it finished).
                    Err(db::DbError::Conflict { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok((warned, ended))
}

/// Writes the warning into the job's history, once (in one transaction with the note
/// that it was warned); whether it did.
fn warn(
    c: &mut DbConn,
    job: i64,
    now: NaiveDateTime,
    since: NaiveDateTime,
    ends_at: NaiveDateTime,
) -> Result<bool, AppError> {
    db::transaction(c, |c| {
        if !db::apps::set_warned(c, job, now, since)? {
            return Ok(false);
        }
        let idle = now - since;
        let message = format!(
            "idle for {}: this app ends at {} UTC unless used",
            if idle.num_minutes() >= 1 {
                format!("{} min", idle.num_minutes())
            } else {
                format!("{} s", idle.num_seconds().max(0))
            },
            ends_at.format("%H:%M")
        );
        db::jobs::add_event(c, job, db::models::JobState::Running, &message)?;
        // The owner hears of it too (e-mail, webhooks), once per idle stretch: the
        // reason names when it began, so a later stretch is a notice of its own.
        let reason = format!("no use of the app since {} UTC", since.format("%H:%M"));
        super::notify::ending::queue_ending(c, job, &reason, ends_at)?;
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> NaiveDateTime {
        chrono::DateTime::from_timestamp(1_800_000_000 + s, 0)
            .unwrap()
            .naive_utc()
    }

    #[test]
    fn the_warning_is_a_quarter_of_the_limit_at_most_ten_minutes() {
        assert_eq!(warning_s(60), 15);
        assert_eq!(warning_s(3600), 600);
        assert_eq!(warning_s(120), 30);
    }

    #[test]
    fn an_idle_app_is_warned_then_ended() {
        let since = t(0);
        let limit = 3600;
        assert_eq!(judge(t(2999), since, limit, None), Verdict::Fine);
        assert_eq!(
            judge(t(3000), since, limit, None),
            Verdict::Warn { ends_at: t(3600) }
        );
        let warned = Some(t(3000));
        assert_eq!(judge(t(3300), since, limit, warned), Verdict::Fine);
        assert_eq!(ends_at(since, limit, warned), Some(t(3600)));
        assert_eq!(judge(t(3600), since, limit, warned), Verdict::End);
    }

    #[test]
    fn a_late_check_moves_the_end_and_never_skips_the_warning() {
        let since = t(0);
        // First seen long past the limit: warned, with the whole warning time to go.
        assert_eq!(
            judge(t(5000), since, 3600, None),
            Verdict::Warn { ends_at: t(5600) }
        );
        assert_eq!(judge(t(5599), since, 3600, Some(t(5000))), Verdict::Fine);
        assert_eq!(judge(t(5600), since, 3600, Some(t(5000))), Verdict::End);
    }

    #[test]
    fn use_after_a_warning_clears_it() {
        let warned = Some(t(3000));
        let used = t(3100);
        assert_eq!(ends_at(used, 3600, warned), None);
        assert_eq!(judge(t(3700), used, 3600, warned), Verdict::Fine);
        assert_eq!(
            judge(t(6100), used, 3600, warned),
            Verdict::Warn { ends_at: t(6700) }
        );
    }

    #[test]
    fn idle_since_the_later_of_use_and_start() {
        assert_eq!(idle_since(Some(t(5)), Some(t(9))), Some(t(9)));
        assert_eq!(idle_since(Some(t(12)), Some(t(9))), Some(t(12)));
        assert_eq!(idle_since(None, Some(t(9))), Some(t(9)));
        assert_eq!(idle_since(None, None), None);
    }
}
