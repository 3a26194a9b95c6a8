//! The change log the triggers of migration `2026-12-15-000100_world_changes` write: one
//! `(kind, id)` row per committed change to a row the scheduler reads.
//!
//! Only the leading portal takes rows out, and it takes exactly those committed before
//! its `DELETE` ran: a change committed later stays for the next round. Whatever is read
//! after the `DELETE` in the same round is at least as new as every change it took, so a
//! change is never lost, at worst read twice.

use crate::{DbConn, DbError};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer};
use std::collections::BTreeSet;

/// What a change names, by the trigger's kind number.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// Jobs (their rows).
    pub jobs: BTreeSet<i64>,
    /// Jobs whose attempts changed.
    pub attempts: BTreeSet<i64>,
    pub nodes: BTreeSet<i64>,
    pub gpus: BTreeSet<i64>,
    /// Jobs whose checkpoints changed.
    pub checkpoints: BTreeSet<i64>,
    pub labs: bool,
    pub memberships: bool,
    pub datasets: bool,
    /// Rows taken out of the log (before dropping repeats).
    pub rows: usize,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Integer)]
    kind: i32,
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Takes every committed change out of the log.
pub fn take(c: &mut DbConn) -> Result<Changes, DbError> {
    let rows: Vec<Row> =
        diesel::sql_query("DELETE FROM world_changes RETURNING CAST(kind AS INTEGER) AS kind, id")
            .load(c)?;
    let mut out = Changes {
        rows: rows.len(),
        ..Changes::default()
    };
    for r in rows {
        let ids = match r.kind {
            1 => &mut out.jobs,
            2 => &mut out.attempts,
            3 => &mut out.nodes,
            4 => &mut out.gpus,
            5 => &mut out.checkpoints,
            6 => {
                out.labs = true;
                continue;
            }
            7 => {
                out.memberships = true;
                continue;
            }
            8 => {
                out.datasets = true;
                continue;
            }
            _ => continue,
        };
        ids.insert(r.id);
    }
    Ok(out)
}

/// Empties the log (before a full read, which supersedes every change in it).
pub fn clear(c: &mut DbConn) -> Result<(), DbError> {
    diesel::sql_query("DELETE FROM world_changes").execute(c)?;
    Ok(())
}
