//! Which agent holds a node's credential, decided in the database so that every replica
//! agrees: one agent session at a time, and a lease clock that is the database's.
//!
//! A node's row holds the session of the agent that holds its credential now
//! (`agent_session`, from its `Hello`), where it connects from, and when it was last
//! heard (`last_seen_at`, on [`db::clock`]). A `Hello` of another session takes the node
//! only when the holder is gone: offline, or silent for longer than the caller's
//! `silence`. Otherwise the newcomer is refused and kept as the node's *contender*; if
//! the holder is heard again after that, both ran at once (a cloned VM or state dir), and
//! the node is flagged with both addresses. A contender that gets in later with the same
//! session was the holder itself, restarted before the portal saw its old connection go,
//! and is forgotten. Heartbeats count only from the holder's session.
//!
//! Invariants: a claim, a heartbeat and a release are each one conditional statement on
//! the node's row (PostgreSQL locks the row and re-checks the condition), so two replicas
//! can never both let a session in; every time written here, and every lease counted from
//! it, is on [`db::clock`].
//!
//! [`db::clock`]: super::clock

use super::schema::nodes;
use super::DbError;
use super::{clock, now, DbConn, PG_NOW_UTC};
use chrono::NaiveDateTime;
use diesel::prelude::*;
use diesel::sql_types::{Nullable, Timestamp};

/// What became of a `Hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This session holds the node now; leases count from `received_at`.
    Taken { received_at: NaiveDateTime },
    /// Another session holds it and lives: connecting from `by`, last heard at `seen`.
    Held {
        by: String,
        seen: Option<NaiveDateTime>,
    },
    /// The node's credential was revoked.
    Revoked,
}

/// What became of a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beat {
    /// Counted; leases count from `received_at`. `contended`: a second agent was refused
    /// since this one was last heard (now flagged).
    Counted {
        received_at: NaiveDateTime,
        contended: bool,
    },
    /// Another session holds the node now (this one was silent too long).
    Superseded,
    /// The node's credential was revoked.
    Revoked,
}

fn revoked(c: &mut DbConn, node: i64) -> Result<bool, DbError> {
    let at: Option<Option<NaiveDateTime>> = nodes::table
        .find(node)
        .select(nodes::revoked_at)
        .first(c)
        .optional()?;
    Ok(!matches!(at, Some(None)))
}

/// A `Hello` of agent session `session` (message `seq`) from `addr`: takes the node unless
/// another session holds it and was heard within `silence`.
pub fn claim(
    c: &mut DbConn,
    node: i64,
    session: u64,
    seq: u64,
    addr: &str,
    silence: chrono::Duration,
) -> Result<Claim, DbError> {
    let session = session as i64;
    crate::transaction(c, |c| {
        let t = clock(c)?;
        let taken = diesel::update(
            nodes::table
                .find(node)
                .filter(nodes::revoked_at.is_null())
                .filter(
                    nodes::agent_session
                        .eq(session)
                        .or(nodes::online.eq(false))
                        .or(nodes::last_seen_at.is_null())
                        .or(nodes::last_seen_at.lt(t - silence)),
                ),
        )
        .set((
            nodes::agent_session.eq(session),
            nodes::agent_seq.eq(seq as i64),
            nodes::agent_seq_at.eq(Some(t)),
            nodes::online.eq(true),
            nodes::last_seen_at.eq(Some(t)),
            nodes::agent_addr.eq(addr),
        ))
        .execute(c)?;
        if taken == 1 {
            // Refused earlier as a contender, in now: it was the holder itself, restarted.
            diesel::update(
                nodes::table
                    .find(node)
                    .filter(nodes::contender_session.eq(session)),
            )
            .set((
                nodes::contender_session.eq(None::<i64>),
                nodes::contender_addr.eq(None::<String>),
                nodes::contender_at.eq(None::<NaiveDateTime>),
            ))
            .execute(c)?;
            return Ok(Claim::Taken { received_at: t });
        }
        if revoked(c, node)? {
            return Ok(Claim::Revoked);
        }
        let (by, seen): (String, Option<NaiveDateTime>) = nodes::table
            .find(node)
            .select((nodes::agent_addr, nodes::last_seen_at))
            .first(c)?;
        diesel::update(nodes::table.find(node))
            .set((
                nodes::contender_session.eq(Some(session)),
                nodes::contender_addr.eq(Some(addr)),
                nodes::contender_at.eq(Some(t)),
            ))
            .execute(c)?;
        Ok(Claim::Held { by, seen })
    })
}

/// A heartbeat (message `seq`) of agent session `session`: counted only while that
/// session holds the node. One statement, whose time is the database's.
pub fn beat(c: &mut DbConn, node: i64, session: u64, seq: u64) -> Result<Beat, DbError> {
    let target = nodes::table
        .find(node)
        .filter(nodes::revoked_at.is_null())
        .filter(nodes::agent_session.eq(session as i64));
    let back = (nodes::agent_seq_at, nodes::contender_session);
    let got: Option<(Option<NaiveDateTime>, Option<i64>)> = match c {
        DbConn::Pg(pg) => diesel::update(target)
            .set((
                nodes::agent_seq.eq(seq as i64),
                nodes::agent_seq_at.eq(diesel::dsl::sql::<Nullable<Timestamp>>(PG_NOW_UTC)),
                nodes::online.eq(true),
                nodes::last_seen_at.eq(diesel::dsl::sql::<Nullable<Timestamp>>(PG_NOW_UTC)),
            ))
            .returning(back)
            .get_result(pg)
            .optional()?,
        DbConn::Sqlite(sq) => {
            let t = now();
            diesel::update(target)
                .set((
                    nodes::agent_seq.eq(seq as i64),
                    nodes::agent_seq_at.eq(Some(t)),
                    nodes::online.eq(true),
                    nodes::last_seen_at.eq(Some(t)),
                ))
                .returning(back)
                .get_result(sq)
                .optional()?
        }
    };
    let Some((at, contender)) = got else {
        return Ok(if revoked(c, node)? {
            Beat::Revoked
        } else {
            Beat::Superseded
        });
    };
    let received_at = at.ok_or_else(|| DbError::Internal("no clock written".into()))?;
    let contended = contender.is_some_and(|s| s != session as i64);
    if contended {
        flag_shared(c, node)?;
    }
    Ok(Beat::Counted {
        received_at,
        contended,
    })
}

/// The holder was heard after a contender was refused: both ran at once. Flags the node
/// with both addresses (the flag stays until a lab admin dismisses it).
fn flag_shared(c: &mut DbConn, node: i64) -> Result<(), DbError> {
    diesel::update(
        nodes::table
            .find(node)
            .filter(nodes::contender_session.is_not_null()),
    )
    .set((
        nodes::shared_at.eq(nodes::contender_at),
        nodes::shared_connected_from.eq(nodes::agent_addr.nullable()),
        nodes::shared_refused_from.eq(nodes::contender_addr),
        nodes::contender_session.eq(None::<i64>),
        nodes::contender_addr.eq(None::<String>),
        nodes::contender_at.eq(None::<NaiveDateTime>),
    ))
    .execute(c)?;
    Ok(())
}

/// Clears the shared-credential flag (a lab admin dealt with it), and a contender not
/// flagged yet; returns what the flag said.
pub fn dismiss_shared(c: &mut DbConn, node: i64) -> Result<Option<String>, DbError> {
    let (at, from, refused): (Option<NaiveDateTime>, Option<String>, Option<String>) = nodes::table
        .find(node)
        .select((
            nodes::shared_at,
            nodes::shared_connected_from,
            nodes::shared_refused_from,
        ))
        .first(c)?;
    diesel::update(nodes::table.find(node))
        .set((
            nodes::shared_at.eq(None::<NaiveDateTime>),
            nodes::shared_connected_from.eq(None::<String>),
            nodes::shared_refused_from.eq(None::<String>),
            nodes::contender_session.eq(None::<i64>),
            nodes::contender_addr.eq(None::<String>),
            nodes::contender_at.eq(None::<NaiveDateTime>),
        ))
        .execute(c)?;
    Ok(at.map(|at| {
        format!(
            "{at}: connected from {}, refused from {}",
            from.unwrap_or_default(),
            refused.unwrap_or_default()
        )
    }))
}

/// The connection of `session` ended: the node is offline, unless another session holds
/// it by now.
pub fn release(c: &mut DbConn, node: i64, session: u64) -> Result<(), DbError> {
    let t = clock(c)?;
    diesel::update(
        nodes::table
            .find(node)
            .filter(nodes::agent_session.eq(session as i64)),
    )
    .set((nodes::online.eq(false), nodes::last_seen_at.eq(Some(t))))
    .execute(c)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{campus, postgres, sqlite};

    fn silence() -> chrono::Duration {
        chrono::Duration::seconds(20)
    }

    fn node_row(c: &mut DbConn, id: i64) -> crate::models::Node {
        crate::nodes::node_by_id(c, id).unwrap()
    }

    /// One agent holds the credential; a second is refused while the first lives; the
    /// first heard again flags the node with both addresses; the holder's own restart is
    /// no clone. On both backends.
    #[test]
    fn one_session_holds_a_node_and_a_second_is_refused_and_flagged() {
        for pg in [false, true] {
            let (_s, _p, mut c) = if pg {
                let (g, c) = postgres();
                (None, Some(g), c)
            } else {
                let (d, c) = sqlite();
                (Some(d), None, c)
            };
            let node = campus(&mut c, 0).node.id;
            // The test kit's node was heard from session 7 just now.
            let first = claim(&mut c, node, 7, 10, "10.0.0.1:5000", silence()).unwrap();
            assert!(matches!(first, Claim::Taken { .. }), "pg {pg}: {first:?}");
            let second = claim(&mut c, node, 2, 1, "10.0.0.2:6000", silence()).unwrap();
            assert_eq!(
                second,
                Claim::Held {
                    by: "10.0.0.1:5000".into(),
                    seen: node_row(&mut c, node).last_seen_at
                },
                "pg {pg}"
            );
            assert_eq!(
                beat(&mut c, node, 2, 2).unwrap(),
                Beat::Superseded,
                "pg {pg}: the refused one's heartbeats count for nothing"
            );
            let n = node_row(&mut c, node);
            assert_eq!(n.agent_session, 7);
            assert!(n.shared_at.is_none(), "pg {pg}: not flagged yet");
            let Beat::Counted { contended, .. } = beat(&mut c, node, 7, 11).unwrap() else {
                panic!("pg {pg}: the holder's heartbeat counts");
            };
            assert!(contended, "pg {pg}");
            let n = node_row(&mut c, node);
            assert_eq!(
                (
                    n.shared_connected_from.as_deref(),
                    n.shared_refused_from.as_deref()
                ),
                (Some("10.0.0.1:5000"), Some("10.0.0.2:6000")),
                "pg {pg}"
            );
            assert!(n.shared_at.is_some() && n.contender_session.is_none());

            // The holder's connection ends: the next one gets in, whoever it is.
            release(&mut c, node, 2).unwrap();
            assert!(node_row(&mut c, node).online, "pg {pg}: not its connection");
            release(&mut c, node, 7).unwrap();
            assert!(!node_row(&mut c, node).online);
            let again = claim(&mut c, node, 3, 1, "10.0.0.1:5001", silence()).unwrap();
            assert!(matches!(again, Claim::Taken { .. }), "pg {pg}");
            // A restart the portal had not noticed yet: refused, then in; no flag.
            assert!(dismiss_shared(&mut c, node).unwrap().is_some());
            let early = claim(&mut c, node, 4, 1, "10.0.0.1:5002", silence()).unwrap();
            assert!(matches!(early, Claim::Held { .. }), "pg {pg}");
            release(&mut c, node, 3).unwrap();
            let late = claim(&mut c, node, 4, 2, "10.0.0.1:5002", silence()).unwrap();
            assert!(matches!(late, Claim::Taken { .. }), "pg {pg}");
            let Beat::Counted { contended, .. } = beat(&mut c, node, 4, 3).unwrap() else {
                panic!("pg {pg}");
            };
            assert!(!contended, "pg {pg}: its own restart is no clone");
            assert!(node_row(&mut c, node).shared_at.is_none(), "pg {pg}");
            // A holder silent past `silence` is taken over.
            let long_ago = clock(&mut c).unwrap() - chrono::Duration::seconds(60);
            diesel::update(nodes::table.find(node))
                .set(nodes::last_seen_at.eq(Some(long_ago)))
                .execute(&mut c)
                .unwrap();
            let over = claim(&mut c, node, 5, 1, "10.0.0.3:7000", silence()).unwrap();
            assert!(matches!(over, Claim::Taken { .. }), "pg {pg}");
            assert_eq!(beat(&mut c, node, 4, 4).unwrap(), Beat::Superseded);
            // Revoked: refused either way.
            diesel::update(nodes::table.find(node))
                .set(nodes::revoked_at.eq(Some(now())))
                .execute(&mut c)
                .unwrap();
            assert_eq!(beat(&mut c, node, 5, 2).unwrap(), Beat::Revoked);
            assert_eq!(
                claim(&mut c, node, 6, 1, "x", silence()).unwrap(),
                Claim::Revoked
            );
        }
    }
}
