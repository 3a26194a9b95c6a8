//! The scheduler's world: the rows a snapshot is built from, kept in memory by the
//! leading portal between rounds and brought up to date from the change log
//! ([`changes`]) instead of read again in full every round.
//!
//! A round at 1,000 nodes x 8 GPUs with 50,000 queued jobs spent 253 of its 323 ms
//! reading every job and node (docs/src/reports/performance.md); a round now reads the
//! rows its changes name, and the few that are cheap and change by time alone (array
//! throttles, the bytes staging jobs will fetch).
//!
//! Invariants:
//! - Every write to a row the world is made of leaves a change, by trigger, in the
//!   writer's transaction; updates that change nothing the world reads leave none.
//! - [`World::snapshot`] builds from the world exactly what
//!   [`crate::snapshot::read_with_waiting`] builds from a fresh read:
//!   [`World::check`] compares the two (the tests do so every round; the portal on a
//!   schedule) and, on a mismatch, replaces the world with the fresh read.
//! - A full read empties the change log first: what it reads supersedes every change
//!   committed before it; a change committed after stays for the next round.

pub mod changes;
pub(crate) mod rows;

use crate::plan::{Shown, Waiting};
use crate::{now, DbConn, DbError};
use commons_sched::{Policy, Snapshot};
use diesel::prelude::*;
use rows::Rows;
use std::collections::BTreeMap;

/// Past this many changes in one round a full read is cheaper than reading each row.
const FULL_READ_ABOVE: usize = 20_000;

/// The scheduler's world between rounds.
pub struct World {
    rows: Rows,
}

/// How a round brought the world up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Every row read.
    Full,
    /// The rows the changes named (change rows taken out of the log).
    Changes(usize),
}

impl World {
    /// Reads the whole world (one transaction), emptying the change log first.
    pub fn load(c: &mut DbConn) -> Result<World, DbError> {
        crate::transaction(c, |c| {
            crate::unflushed_commit(c)?;
            changes::clear(c)?;
            Ok(World {
                rows: Rows::load(c, now())?,
            })
        })
    }

    /// Takes in the changes committed since the last update (one transaction).
    pub fn update(&mut self, c: &mut DbConn) -> Result<Update, DbError> {
        crate::transaction(c, |c| self.update_in(c))
    }

    /// In the caller's transaction, which commits without waiting for the disk: taking
    /// changes out of the log is derived work (see [`crate::unflushed_commit`]).
    fn update_in(&mut self, c: &mut DbConn) -> Result<Update, DbError> {
        crate::unflushed_commit(c)?;
        let ch = changes::take(c)?;
        if ch.rows > FULL_READ_ABOVE {
            analyse_burst(c)?;
            self.rows = Rows::load(c, now())?;
            return Ok(Update::Full);
        }
        self.rows.reload(c, &ch, now())?;
        Ok(Update::Changes(ch.rows))
    }

    /// Takes in the changes, then reads the whole world again in the same view of the
    /// database (PostgreSQL: one repeatable-read transaction) and compares the
    /// snapshots built from both. On a mismatch the world becomes the fresh read, and
    /// what differed is returned.
    pub fn check(
        &mut self,
        c: &mut DbConn,
        policy: &Policy,
    ) -> Result<(Update, Option<String>), DbError> {
        crate::transaction(c, |c| {
            if let DbConn::Pg(pg) = c {
                diesel::sql_query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(pg)?;
            }
            // Both reads switch `by_key` back off at their end, so the fresh read
            // scans its big tables as a full read should.
            let update = self.update_in(c)?;
            let t = now();
            let fresh = Rows::load(c, t)?;
            let ours = built(&self.rows, policy, t);
            let theirs = built(&fresh, policy, t);
            let differs = describe_difference(&ours, &theirs);
            if differs.is_some() {
                self.rows = fresh;
            }
            Ok((update, differs))
        })
    }

    /// The snapshot to plan from now.
    pub fn snapshot(&self, policy: &Policy) -> Snapshot {
        crate::snapshot::build(&self.rows, policy, now())
    }

    /// What queued job `job` shows now; none for a job the world does not hold queued.
    pub fn shows(&self, job: i64) -> Option<Shown<'_>> {
        self.rows.queued.get(&job).map(|j| Shown {
            reason: j.reason.as_deref(),
            position: j.queue_position,
            estimated_start: j.estimated_start_at,
        })
    }

    /// What the scheduler wrote for waiting jobs (`plan::set_waiting`): the triggers
    /// leave no change for a place or an estimate, so the world notes them itself.
    pub fn noted_waiting(&mut self, written: &[(i64, Waiting)]) {
        for (id, w) in written {
            if let Some(j) = self.rows.queued.get_mut(id) {
                j.reason.clone_from(&w.reason);
                j.queue_position = w.position;
                j.estimated_start_at = w.estimated_start;
            }
        }
    }

    /// Queued jobs it knows (for the logs).
    pub fn queued(&self) -> usize {
        self.rows.queued.len()
    }
}

/// Whether the rest of the caller's transaction looks rows up by key whatever
/// PostgreSQL's statistics say (while `on`: `enable_seqscan` off, and every statement
/// planned for its own values, `plan_cache_mode = force_custom_plan`; then both back to
/// their defaults; SQLite: nothing).
///
/// A round's reload names a few hundred jobs and attempts, and every read of it goes by
/// a key. Statistics lag a burst: right after 50,000 submissions (or a campus's first
/// hour) PostgreSQL's statistics still describe the tables before it, and it scanned all
/// of `job_attempts` for each lookup and hashed the result (25 ms a statement in the load
/// test, against 5 by the index). A plan PostgreSQL cached for a prepared statement
/// (after five executions it may keep one generic plan) does not follow the setting it
/// was planned under, so a lookup first run elsewhere kept scanning under this one:
/// hence the custom plans (`tests::bursts_on_stale_statistics_are_read_by_key_and_in_full_once`).
/// A statement with no index to use (emptying the change log) still scans.
pub(crate) fn by_key(c: &mut DbConn, on: bool) -> Result<(), DbError> {
    use diesel::connection::SimpleConnection;
    if let DbConn::Pg(pg) = c {
        pg.batch_execute(if on {
            "SET LOCAL enable_seqscan TO off; SET LOCAL plan_cache_mode TO force_custom_plan"
        } else {
            "SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL plan_cache_mode TO DEFAULT"
        })?;
    }
    Ok(())
}

/// After a burst (more changes in one round than [`FULL_READ_ABOVE`]) PostgreSQL's
/// statistics describe the tables before it, and autovacuum analyses a table at most
/// once a minute at the defaults while a round runs every few seconds: so the tables a
/// burst grows are analysed at once, in the round's transaction, before its full read,
/// and every later statement of every replica (pages, heartbeats, the plan's commit) is
/// planned on their size after it. A role that does not own them gets PostgreSQL's
/// warning and nothing else. SQLite: nothing.
fn analyse_burst(c: &mut DbConn) -> Result<(), DbError> {
    if let DbConn::Pg(pg) = c {
        diesel::sql_query("ANALYZE jobs, job_attempts").execute(pg)?;
    }
    Ok(())
}

type Built = (Snapshot, BTreeMap<i64, Waiting>);

/// The snapshot and what the waiting jobs show, built from `rows` at `t`: what a check
/// compares.
fn built(rows: &Rows, policy: &Policy, t: chrono::NaiveDateTime) -> Built {
    (
        crate::snapshot::build(rows, policy, t),
        crate::snapshot::waiting(rows),
    )
}

/// The first difference between two built snapshots, in words; none when equal.
fn describe_difference(ours: &Built, theirs: &Built) -> Option<String> {
    let parts: [(&str, serde_json::Value, serde_json::Value); 5] = [
        ("nodes", json(&ours.0.nodes), json(&theirs.0.nodes)),
        ("running", json(&ours.0.running), json(&theirs.0.running)),
        ("queue", json(&ours.0.queue), json(&theirs.0.queue)),
        ("labs", json(&ours.0.labs), json(&theirs.0.labs)),
        ("members", json(&ours.0.members), json(&theirs.0.members)),
    ];
    for (what, a, b) in parts {
        if a == b {
            continue;
        }
        let (a, b) = (a.as_array().cloned(), b.as_array().cloned());
        let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
        if a.len() != b.len() {
            return Some(format!(
                "{what}: {} in the world, {} in a fresh read",
                a.len(),
                b.len()
            ));
        }
        let (x, y) = a.iter().zip(&b).find(|(x, y)| x != y)?;
        return Some(format!("{what}: the world has {x}, a fresh read {y}"));
    }
    if ours.1 != theirs.1 {
        let first = ours
            .1
            .iter()
            .find(|(id, w)| theirs.1.get(id) != Some(w))
            .map(|(id, w)| format!("job {id}: {w:?} in the world, {:?} fresh", theirs.1.get(id)))
            .unwrap_or_else(|| "jobs missing from the world".into());
        return Some(format!("what waiting jobs show: {first}"));
    }
    None
}

fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests;
