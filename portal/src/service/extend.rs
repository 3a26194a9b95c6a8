//! Extending an interactive job's time limit ("extend" on the job page,
//! `POST /api/v1/jobs/{id}/extend`): who may, by how much, and how the new limit reaches
//! the agent.
//!
//! Invariants:
//! - Only the job's owner extends it, only an interactive job, only while it is queued
//!   or running (409 otherwise); a bad number of minutes is 422 naming `minutes`.
//! - The new limit never exceeds any longest-job limit that applies to the job: the
//!   campus's ([`validate::MAX_TIME_LIMIT_MIN`]), the member's quota in the job's lab (or
//!   the lab's default for members), and, while it runs as a guest, the lab's borrowing
//!   quota and the server's lending rule. A refusal says which and how much is left.
//! - The job row, its history and the audit log change in one transaction that re-reads
//!   the job; the agent learns the new limit from the next `Renew` (every heartbeat,
//!   whichever replica holds its connection), so nothing here talks to agents.

use super::views::{job_view, JobView};
use super::{Actor, Ctx};
use crate::db::models::{AttemptStatus, Job, JobState};
use crate::db::{self, DbConn};
use crate::domain::JobKind;
use crate::error::AppError;
use crate::validate;
use commons_proto::TimeLimit;
use commons_sched::{Lending, Quota};

/// The most minutes one extension may ask for (the limits above usually bind first).
pub const MAX_EXTEND_MINUTES: i64 = 7 * 24 * 60;

pub use commons_api::job_view::ExtendRequest;

/// A longest-job limit that applies to a job, and whose it is, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceiling {
    pub max_s: i64,
    pub whose: String,
}

/// The new time limit (seconds) after adding `minutes` to `current_s`, if no ceiling
/// forbids it. Pure: the rules of an extension without the database.
pub fn new_limit(current_s: i64, minutes: i64, ceilings: &[Ceiling]) -> Result<i64, AppError> {
    if !(1..=MAX_EXTEND_MINUTES).contains(&minutes) {
        return Err(AppError::invalid(
            "minutes",
            format!("extend by 1 to {MAX_EXTEND_MINUTES} minutes, not {minutes}"),
        ));
    }
    let wanted = current_s.saturating_add(minutes * 60);
    let Some(tightest) = ceilings.iter().min_by_key(|c| c.max_s) else {
        return Ok(wanted);
    };
    if wanted <= tightest.max_s {
        return Ok(wanted);
    }
    let left = (tightest.max_s - current_s).max(0) / 60;
    let message = if left == 0 {
        format!(
            "{} allows jobs of at most {}; this job already has that much: it cannot be extended",
            tightest.whose,
            minutes_text(tightest.max_s / 60)
        )
    } else {
        format!(
            "{} allows jobs of at most {}: extend by at most {left} min",
            tightest.whose,
            minutes_text(tightest.max_s / 60)
        )
    };
    Err(AppError::invalid("minutes", message))
}

/// "90 min", "36 h", "30 days" for a limit in minutes.
fn minutes_text(m: i64) -> String {
    if m >= 2 * 24 * 60 && m % (24 * 60) == 0 {
        format!("{} days", m / (24 * 60))
    } else if m >= 120 && m % 60 == 0 {
        format!("{} h", m / 60)
    } else {
        format!("{m} min")
    }
}

fn ceiling_of(quota: &Quota, whose: String) -> Option<Ceiling> {
    quota.max_time_limit_s.map(|max_s| Ceiling { max_s, whose })
}

/// Every longest-job limit that applies to `job` now.
fn ceilings(c: &mut DbConn, job: &Job) -> Result<Vec<Ceiling>, AppError> {
    let mut out = vec![Ceiling {
        max_s: validate::MAX_TIME_LIMIT_MIN * 60,
        whose: "the campus".into(),
    }];
    let lab = db::users::lab_by_id(c, job.lab_id)?;
    // A member without a quota of their own has the lab's default (as the scheduler reads it).
    let own = db::users::membership(c, lab.id, job.user_id)?
        .map(|m| m.quota.0)
        .unwrap_or_default();
    let member = if own == Quota::default() {
        lab.member_quota.0.clone()
    } else {
        own
    };
    out.extend(ceiling_of(
        &member,
        format!("your quota in lab {}", lab.slug),
    ));
    let active = db::attempts::on_job(c, job.id, &AttemptStatus::ACTIVE)?;
    if let Some(a) = active.first() {
        let node = db::nodes::node_by_id(c, a.node_id)?;
        if node.lab_id != job.lab_id {
            out.extend(ceiling_of(
                &lab.quota.0,
                format!("lab {}'s borrowing quota", lab.slug),
            ));
            let rules: Lending = node.lending_rules();
            if let Some(max_s) = rules.max_guest_time_limit_s {
                out.push(Ceiling {
                    max_s,
                    whose: format!("server {}, which lends its GPUs to guests,", node.name),
                });
            }
        }
    }
    Ok(out)
}

/// The current time limit of each of `attempts` (job, attempt), for a `Renew`: how an
/// extension reaches the agent (one query).
pub fn time_limits(c: &mut DbConn, attempts: &[(i64, i32)]) -> Result<Vec<TimeLimit>, AppError> {
    let jobs: Vec<i64> = attempts.iter().map(|(job, _)| *job).collect();
    let limits = db::jobs::time_limits(c, &jobs)?;
    Ok(attempts
        .iter()
        .filter_map(|&(job, attempt)| {
            limits.get(&job).map(|&s| TimeLimit {
                job,
                attempt,
                time_limit_s: s.max(0) as u64,
            })
        })
        .collect())
}

/// Adds `minutes` to the time limit of the actor's interactive job `id`.
pub async fn extend(
    state: &Ctx,
    actor: &Actor,
    id: i64,
    req: ExtendRequest,
) -> Result<JobView, AppError> {
    let actor = actor.clone();
    let view = state
        .db
        .run(move |c| {
            db::transaction(c, |c| {
                let job = super::jobs::visible(c, &actor, id)?;
                if job.user_id != actor.user.id {
                    return Err(AppError::Forbidden(
                        "only the job's owner may extend it".into(),
                    ));
                }
                if job.kind != JobKind::Interactive {
                    return Err(AppError::conflict(
                        "not_interactive",
                        format!("job {id} is a batch job; only interactive jobs are extended"),
                    ));
                }
                if !matches!(job.state, JobState::Queued | JobState::Running) {
                    return Err(AppError::conflict(
                        "not_extendable",
                        format!(
                            "job {id} is {}; only a queued or running job can be extended",
                            job.state
                        ),
                    ));
                }
                let limit = new_limit(job.time_limit_s, req.minutes, &ceilings(c, &job)?)?;
                db::jobs::set_time_limit(c, id, limit)?;
                let who = &actor.user.username;
                let words = format!(
                    "time limit extended by {} min to {} by {who}",
                    req.minutes,
                    minutes_text(limit / 60)
                );
                db::jobs::add_event(c, id, job.state, &words)?;
                db::audit::record(
                    c,
                    &actor.user,
                    Some(job.lab_id),
                    "extend_job",
                    &format!("job {id}"),
                    &format!("time_limit_s {}", job.time_limit_s),
                    &format!("time_limit_s {limit}"),
                )?;
                tracing::info!(job = id, by = %who, limit_s = limit, "time limit extended");
                let extended = db::jobs::get(c, id)?;
                job_view(c, &extended)
            })
        })
        .await?;
    // Backfill and GPU-hour quotas count running jobs by their limits: plan again.
    state.wake.notify_one();
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testkit::{campus, sqlite};

    #[test]
    fn a_renew_carries_the_limit_as_it_is_now() {
        let (_d, mut c) = sqlite();
        let k = campus(&mut c, 2);
        let (a, b) = (k.jobs[0].id, k.jobs[1].id);
        db::jobs::set_time_limit(&mut c, a, 3600).unwrap();
        let limits = time_limits(&mut c, &[(a, 1), (b, 1), (999, 1)]).unwrap();
        let got: Vec<(i64, u64)> = limits.iter().map(|l| (l.job, l.time_limit_s)).collect();
        assert_eq!(got, [(a, 3600), (b, 300)], "unknown jobs are left out");
    }

    fn ceiling(max_min: i64, whose: &str) -> Ceiling {
        Ceiling {
            max_s: max_min * 60,
            whose: whose.into(),
        }
    }

    #[test]
    fn an_extension_stays_under_every_ceiling() {
        let cs = [
            ceiling(30 * 24 * 60, "the campus"),
            ceiling(240, "your quota"),
        ];
        assert_eq!(new_limit(3600, 60, &cs).unwrap(), 7200);
        assert_eq!(
            new_limit(3600, 180, &cs).unwrap(),
            240 * 60,
            "exactly the rest"
        );
        let e = new_limit(3600, 181, &cs).unwrap_err();
        assert_eq!(e.field(), Some("minutes"));
        assert_eq!(
            e.to_string(),
            "your quota allows jobs of at most 4 h: extend by at most 180 min"
        );
        let e = new_limit(240 * 60, 1, &cs).unwrap_err();
        assert!(e.to_string().contains("cannot be extended"), "{e}");
        assert_eq!(new_limit(60, 5, &[]).unwrap(), 360, "no ceiling at all");
    }

    #[test]
    fn bad_minutes_name_the_field() {
        for m in [0, -5, MAX_EXTEND_MINUTES + 1] {
            assert_eq!(new_limit(60, m, &[]).unwrap_err().field(), Some("minutes"));
        }
    }

    #[test]
    fn limits_read_as_people_say_them() {
        assert_eq!(minutes_text(90), "90 min");
        assert_eq!(minutes_text(36 * 60), "36 h");
        assert_eq!(minutes_text(30 * 24 * 60), "30 days");
    }
}
