//! Whose output a node may write into a job's log: the attempt placed on it now, and, for
//! a short while after the node itself reported that attempt's end, the attempt's last
//! lines.
//!
//! Why the short while: an honest agent drains a container's output before it reports
//! the end, but the end can still arrive first: a heartbeat carrying it may overtake
//! output queued behind it, and after a reconnect the `Hello` (which reports it) comes
//! before the output queued while the link was down.
//!
//! Invariants:
//! - Output for an attempt another node holds, or ever held, is refused (the broker
//!   counts it towards disconnecting the agent).
//! - Output for an attempt of this node that is over (beyond [`LATE_OUTPUT_S`], or lost:
//!   the portal ended it without the node's report, and the job may run elsewhere) is
//!   dropped and not counted: an agent with a backlog is not disconnected for it.

use crate::db::models::{Attempt, AttemptStatus};
use crate::db::{self, DbConn};
use crate::error::AppError;
use chrono::NaiveDateTime;

/// How long after an attempt's reported end its node's output for it is still taken.
pub const LATE_OUTPUT_S: i64 = 120;

/// What becomes of a node's output for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Appended to the job's log.
    Written,
    /// The node's own attempt, over: dropped.
    Over,
    /// Not the node's attempt: refused.
    Foreign,
}

/// The verdict on `node`'s output for attempt `a` (`None`: no such attempt) at `now`.
pub fn judge(a: Option<&Attempt>, node: i64, now: NaiveDateTime) -> Verdict {
    let Some(a) = a.filter(|a| a.node_id == node) else {
        return Verdict::Foreign;
    };
    if a.state.is_active() {
        return Verdict::Written;
    }
    let reported = a.state != AttemptStatus::Lost;
    let recent = a
        .ended_at
        .is_some_and(|t| now - t <= chrono::Duration::seconds(LATE_OUTPUT_S));
    if reported && recent {
        Verdict::Written
    } else {
        Verdict::Over
    }
}

/// Appends `chunk` to the log of `job` if `node` may write it (see [`judge`]).
pub fn append(
    c: &mut DbConn,
    node: i64,
    job: i64,
    attempt: i32,
    chunk: &str,
    now: NaiveDateTime,
) -> Result<Verdict, AppError> {
    let a = db::attempts::find(c, job, attempt)?;
    let verdict = judge(a.as_ref(), node, now);
    if verdict == Verdict::Written {
        db::jobs::append_log(c, job, attempt, chunk)?;
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::types::Json;

    fn attempt(node: i64, state: AttemptStatus, ended_s_ago: Option<i64>) -> Attempt {
        let now = db::now();
        Attempt {
            id: 1,
            job_id: 7,
            attempt: 1,
            node_id: node,
            gpu_ids: Json(vec![]),
            state,
            lease_until: now,
            created_at: now,
            started_at: Some(now),
            ended_at: ended_s_ago.map(|s| now - chrono::Duration::seconds(s)),
            exit_code: None,
            share_milli: None,
            share_memory_mb: None,
            gpu_memory_used_mb: None,
            reason: None,
        }
    }

    #[test]
    fn only_the_node_placed_now_writes_and_its_last_lines_a_short_while_after() {
        let now = db::now();
        use AttemptStatus::*;
        for state in [Starting, Running, Stopping] {
            assert_eq!(
                judge(Some(&attempt(3, state, None)), 3, now),
                Verdict::Written
            );
            assert_eq!(
                judge(Some(&attempt(4, state, None)), 3, now),
                Verdict::Foreign
            );
        }
        assert_eq!(judge(None, 3, now), Verdict::Foreign);
        for state in [Exited, Stopped, Failed] {
            let just = attempt(3, state, Some(5));
            assert_eq!(judge(Some(&just), 3, now), Verdict::Written, "{state:?}");
            let long = attempt(3, state, Some(LATE_OUTPUT_S + 1));
            assert_eq!(judge(Some(&long), 3, now), Verdict::Over, "{state:?}");
            let elsewhere = attempt(4, state, Some(5));
            assert_eq!(judge(Some(&elsewhere), 3, now), Verdict::Foreign);
        }
        // Lost: the portal ended it without the node's word; the job may run elsewhere.
        assert_eq!(
            judge(Some(&attempt(3, Lost, Some(1))), 3, now),
            Verdict::Over
        );
    }
}
