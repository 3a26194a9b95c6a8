//! Jobs that wait for other jobs (`after: [{"job": 41, "when": "ok"}]`): who may name
//! which job, and settling the waits at the start of every scheduler round.
//!
//! Held jobs are kept out of the scheduler's snapshot (`db::snapshot` skips them) rather
//! than handed to `sched` with their waits: a job that cannot start whatever the GPUs do
//! must not take a place in the queue, hold a backfill reservation or count in fair
//! share, and `sched` stays a pure function of GPUs, quotas and jobs that could run.
//! Their waiting reason is still `sched`'s (`Reason::WaitingForJob`), so every reason
//! reads alike.
//!
//! Invariants:
//! - A job may only wait for existing jobs of its user (or of a lab its user
//!   administers), so the job it names is always older: no cycle can form.
//! - Settling is level-triggered: each round looks at what the held jobs wait for now,
//!   so a wait is settled even if the job it names ended while this job was being
//!   submitted, or while no portal ran the scheduler.
//! - A wait that can no longer be met ends its job at once as failed, with the reason;
//!   no job waits forever.

use super::Actor;
use crate::db::models::{JobState, Role};
use crate::db::{self, DbConn};
use crate::error::AppError;
use commons_api::flows::{After, Ended};
use std::collections::BTreeMap;

/// What a job waiting for `a` says while it waits ("waiting for job 41 to succeed";
/// `index`: the task's, for a per-index wait: "waiting for task 3 of array 7 to
/// succeed").
pub fn waiting_text(a: &After, index: Option<i64>) -> String {
    db::deps::waiting_text(a, index)
}

/// Refuses (422, `after`) a wait for a job that does not exist or that is neither the
/// actor's own nor of a lab the actor administers (the same answer for both, so ids of
/// other people's jobs are not revealed).
pub fn check_may_wait_for(c: &mut DbConn, actor: &Actor, after: &[After]) -> Result<(), AppError> {
    if after.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = after
        .iter()
        .filter(|a| a.array.is_none())
        .map(|a| a.job)
        .collect();
    let owners = db::deps::owners(c, &ids)?;
    let arrays: Vec<i64> = after.iter().filter_map(|a| a.array).collect();
    let array_owners: BTreeMap<i64, (i64, i64)> = db::arrays::by_ids(c, &arrays)?
        .into_iter()
        .map(|a| (a.id, (a.user_id, a.lab_id)))
        .collect();
    for a in after {
        let owner = match a.array {
            Some(id) => array_owners.get(&id),
            None => owners.get(&a.job),
        };
        let allowed = owner.is_some_and(|&(user, lab)| {
            user == actor.user.id
                || actor
                    .labs
                    .iter()
                    .any(|(l, r)| l.id == lab && *r == Role::Admin)
        });
        if !allowed {
            return Err(AppError::invalid(
                "after",
                format!(
                    "{} is not one of yours (nor of a lab you administer); \
                     a job may only wait for those",
                    a.what()
                ),
            ));
        }
    }
    Ok(())
}

fn ended(s: JobState) -> Option<Ended> {
    match s {
        JobState::Succeeded => Some(Ended::Succeeded),
        JobState::Failed => Some(Ended::Failed),
        JobState::Cancelled => Some(Ended::Cancelled),
        _ => None,
    }
}

/// How an array has ended as far as wait `a` is concerned (its tasks' counts by state):
/// for `ok`, failed (or cancelled) as soon as one task is; otherwise once every task has
/// ended: failed if one failed, else cancelled if one was, else succeeded.
fn array_ended(a: &After, counts: &BTreeMap<JobState, i64>) -> Option<Ended> {
    let n = |s| counts.get(&s).copied().unwrap_or(0);
    let (failed, cancelled) = (n(JobState::Failed), n(JobState::Cancelled));
    let all_ended = failed + cancelled + n(JobState::Succeeded) == counts.values().sum::<i64>();
    let early = a.when == commons_api::flows::When::Ok && failed + cancelled > 0;
    (all_ended || early).then_some(if failed > 0 {
        Ended::Failed
    } else if cancelled > 0 {
        Ended::Cancelled
    } else {
        Ended::Succeeded
    })
}

/// What becomes of one held job, given the states of the jobs it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every wait is met: it joins the queue.
    Release,
    /// A wait can no longer be met: it fails, saying why.
    Fail(String),
    /// It still waits; for this (the first wait not yet met).
    Wait(String),
}

/// What the held jobs wait for, as one round read it.
#[derive(Debug, Default)]
pub struct Seen {
    /// Jobs by id (those named by a wait, and the tasks of arrays waited for per index).
    pub states: BTreeMap<i64, JobState>,
    /// Arrays waited for as a whole: their tasks' counts by state.
    pub arrays: BTreeMap<i64, BTreeMap<JobState, i64>>,
    /// Arrays waited for per index: `(array, index) -> job id`.
    pub tasks: BTreeMap<(i64, i64), i64>,
}

/// Judges one held job (`index`: its index, if it is an array's task). A job it waits
/// for that no longer exists cannot be waited for.
pub fn verdict(after: &[After], index: Option<i64>, seen: &Seen) -> Verdict {
    let mut first_open = None;
    for a in after {
        let end = match (a.array, index) {
            (Some(id), Some(i)) if a.per_index => seen
                .tasks
                .get(&(id, i))
                .and_then(|job| seen.states.get(job))
                .copied()
                .map(ended),
            (Some(id), _) => seen.arrays.get(&id).map(|counts| array_ended(a, counts)),
            (None, _) => seen.states.get(&a.job).copied().map(ended),
        };
        match end {
            None => return Verdict::Fail(format!("{} no longer exists", a.what_for(index))),
            Some(Some(e)) if a.met_by(e) => {}
            Some(Some(e)) => return Verdict::Fail(a.unmet_for(index, e)),
            Some(None) => {
                first_open.get_or_insert(a);
            }
        }
    }
    match first_open {
        Some(a) => Verdict::Wait(waiting_text(a, index)),
        None => Verdict::Release,
    }
}

/// What one round of settling did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub released: usize,
    pub failed: usize,
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Reads what the held jobs wait for: the jobs they name (one query per few thousand),
/// the arrays they wait for whole (one), and the tasks of those they wait for per index
/// (one).
fn read_seen(c: &mut DbConn, held: &[db::deps::Held]) -> Result<Seen, AppError> {
    let waits = || held.iter().flat_map(|h| h.after.iter());
    let ids = sorted(
        waits()
            .filter(|a| a.array.is_none())
            .map(|a| a.job)
            .collect(),
    );
    let whole = sorted(
        waits()
            .filter(|a| !a.per_index)
            .filter_map(|a| a.array)
            .collect(),
    );
    let per_index = sorted(
        waits()
            .filter(|a| a.per_index)
            .filter_map(|a| a.array)
            .collect(),
    );
    let mut seen = Seen {
        states: db::deps::states(c, &ids)?,
        arrays: db::arrays::counts_of(c, &whole)?,
        tasks: BTreeMap::new(),
    };
    for (key, (id, state)) in db::deps::task_states(c, &per_index)? {
        seen.tasks.insert(key, id);
        seen.states.insert(id, state);
    }
    Ok(seen)
}

/// Settles every held job (one transaction): releases those whose waits are met, fails
/// those whose waits can no longer be met, and updates what the others say they wait
/// for.
///
/// 1. Read the held jobs and what they wait for ([`read_seen`]): a few queries whatever
///    their number.
/// 2. Judge each in id order. A job always waits for older ones, so with the states
///    updated as jobs are judged, a whole chain settles in one round (a task of an array
///    that waits per index for another array's task is younger than it too).
/// 3. Apply the verdicts in bulk: one statement per few thousand jobs for each kind of
///    change, so a 10,000-task array waiting per index settles in a handful of them.
pub fn settle(c: &mut DbConn) -> Result<Settled, AppError> {
    db::transaction(c, |c| {
        let held = db::deps::held(c)?;
        if held.is_empty() {
            return Ok(Settled::default());
        }
        let mut seen = read_seen(c, &held)?;
        let (mut release, mut fail, mut reasons) = (Vec::new(), Vec::new(), Vec::new());
        for h in &held {
            match verdict(&h.after, h.array_index, &seen) {
                Verdict::Release => {
                    release.push(h.id);
                    seen.states.insert(h.id, JobState::Queued);
                }
                Verdict::Fail(why) => {
                    fail.push((h.id, why));
                    seen.states.insert(h.id, JobState::Failed);
                }
                Verdict::Wait(why) if h.reason.as_deref() != Some(why.as_str()) => {
                    reasons.push((h.id, why));
                }
                Verdict::Wait(_) => {}
            }
        }
        db::deps::set_reasons(c, &reasons)?;
        Ok(Settled {
            released: db::deps::release(c, &release, "waiting for the scheduler")?,
            failed: db::deps::fail(c, &fail)?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use commons_api::flows::When;

    fn after(job: i64, when: When) -> After {
        After::job(job, when)
    }

    #[test]
    fn a_held_job_is_released_fails_or_says_what_it_waits_for() {
        let states = BTreeMap::from([
            (1, JobState::Succeeded),
            (2, JobState::Failed),
            (3, JobState::Running),
            (4, JobState::Cancelled),
        ]);
        let arrays = BTreeMap::from([
            (
                7,
                BTreeMap::from([(JobState::Succeeded, 2), (JobState::Running, 1)]),
            ),
            (
                8,
                BTreeMap::from([(JobState::Failed, 1), (JobState::Running, 1)]),
            ),
            (9, BTreeMap::from([(JobState::Succeeded, 3)])),
        ]);
        let seen = Seen {
            states,
            arrays,
            tasks: BTreeMap::new(),
        };
        let v = |a: &[After]| verdict(a, None, &seen);
        let array = After::array;
        assert_eq!(v(&[array(9, When::Ok)]), Verdict::Release);
        assert_eq!(
            v(&[array(7, When::Ok)]),
            Verdict::Wait("waiting for array 7 to succeed".into())
        );
        assert_eq!(
            v(&[array(8, When::Ok)]),
            Verdict::Fail("array 8 failed; this job needed it to succeed".into()),
            "at once, while another task still runs"
        );
        assert_eq!(
            v(&[array(8, When::Fail)]),
            Verdict::Wait("waiting for array 8 to fail".into()),
            "fail and any wait for every task"
        );
        assert_eq!(
            v(&[array(5, When::Any)]),
            Verdict::Fail("array 5 no longer exists".into())
        );
        assert_eq!(v(&[after(1, When::Ok)]), Verdict::Release);
        assert_eq!(
            v(&[after(2, When::Fail), after(4, When::Any)]),
            Verdict::Release
        );
        assert_eq!(
            v(&[after(1, When::Ok), after(3, When::Ok)]),
            Verdict::Wait("waiting for job 3 to succeed".into())
        );
        // A wait that cannot be met fails the job even while another still runs.
        assert_eq!(
            v(&[after(3, When::Any), after(2, When::Ok)]),
            Verdict::Fail("job 2 failed; this job needed it to succeed".into())
        );
        assert_eq!(
            v(&[after(4, When::Fail)]),
            Verdict::Fail("job 4 was cancelled; this job needed it to fail".into())
        );
        assert_eq!(
            v(&[after(9, When::Any)]),
            Verdict::Fail("job 9 no longer exists".into())
        );
    }

    #[test]
    fn a_task_waiting_per_index_looks_at_its_own_task_only() {
        // Array 7: task 0 succeeded, 1 failed, 2 runs, 3 was cancelled (jobs 70..73).
        let states = [
            JobState::Succeeded,
            JobState::Failed,
            JobState::Running,
            JobState::Cancelled,
        ];
        let seen = Seen {
            states: (0..4).map(|i| (70 + i, states[i as usize])).collect(),
            arrays: BTreeMap::new(),
            tasks: (0..4).map(|i| ((7, i), 70 + i)).collect(),
        };
        let ok = [After::per_index(7, When::Ok)];
        let v = |a: &[After], i: i64| verdict(a, Some(i), &seen);
        assert_eq!(v(&ok, 0), Verdict::Release);
        assert_eq!(
            v(&ok, 1),
            Verdict::Fail("task 1 of array 7 failed; this task needed it to succeed".into())
        );
        assert_eq!(
            v(&ok, 2),
            Verdict::Wait("waiting for task 2 of array 7 to succeed".into())
        );
        assert_eq!(
            v(&ok, 3),
            Verdict::Fail("task 3 of array 7 was cancelled; this task needed it to succeed".into())
        );
        assert_eq!(
            v(&ok, 4),
            Verdict::Fail("task 4 of array 7 no longer exists".into())
        );
        let fail = [After::per_index(7, When::Fail)];
        assert_eq!(v(&fail, 1), Verdict::Release);
        assert!(matches!(v(&fail, 0), Verdict::Fail(_)));
        let any = [After::per_index(7, When::Any)];
        assert_eq!(v(&any, 3), Verdict::Release);
        assert_eq!(
            v(&any, 2),
            Verdict::Wait("waiting for task 2 of array 7 to end".into())
        );
    }
}
