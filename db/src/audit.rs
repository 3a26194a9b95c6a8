//! The audit log: who did what to which lab, when, with the value before and after.
//! Written in the same transaction as the change it records.

use super::models::User;
use super::schema::audit_log;
use super::DbError;
use super::{now, DbConn};
use chrono::NaiveDateTime;
use diesel::prelude::*;
use serde::Serialize;

#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = audit_log)]
pub struct AuditEntry {
    pub id: i64,
    pub at: NaiveDateTime,
    #[serde(skip)]
    pub actor_id: Option<i64>,
    pub actor: String,
    #[serde(skip)]
    pub lab_id: Option<i64>,
    pub action: String,
    pub target: String,
    pub before: String,
    pub after: String,
}

pub fn record(
    c: &mut DbConn,
    actor: &User,
    lab: Option<i64>,
    action: &str,
    target: &str,
    before: &str,
    after: &str,
) -> Result<(), DbError> {
    let by = (Some(actor.id), actor.username.as_str());
    insert(c, by, lab, action, target, before, after)
}

/// One entry; `by` is the actor's user id (none for a server or the operator CLI) and
/// name.
fn insert(
    c: &mut DbConn,
    by: (Option<i64>, &str),
    lab: Option<i64>,
    action: &str,
    target: &str,
    before: &str,
    after: &str,
) -> Result<(), DbError> {
    diesel::insert_into(audit_log::table)
        .values((
            audit_log::at.eq(now()),
            audit_log::actor_id.eq(by.0),
            audit_log::actor.eq(by.1),
            audit_log::lab_id.eq(lab),
            audit_log::action.eq(action),
            audit_log::target.eq(target),
            audit_log::before.eq(before),
            audit_log::after.eq(after),
        ))
        .execute(c)?;
    Ok(())
}

/// An entry by someone who is not a signed-in user: something done on a server rather
/// than in the portal (`commons-agent drain` and the like, the actor "alice on gpu7"), or
/// by the operator CLI (`actor` says so).
pub fn record_as(
    c: &mut DbConn,
    actor: &str,
    lab: Option<i64>,
    action: &str,
    target: &str,
    before: &str,
    after: &str,
) -> Result<(), DbError> {
    insert(c, (None, actor), lab, action, target, before, after)
}

/// The newest entries, of one lab or of all.
pub fn list(c: &mut DbConn, lab: Option<i64>, limit: i64) -> Result<Vec<AuditEntry>, DbError> {
    let mut q = audit_log::table.into_boxed();
    if let Some(l) = lab {
        q = q.filter(audit_log::lab_id.eq(l));
    }
    Ok(q.order(audit_log::id.desc())
        .limit(limit)
        .select(AuditEntry::as_select())
        .load(c)?)
}
