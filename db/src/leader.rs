//! The scheduler's leader lock: a PostgreSQL advisory lock held on a dedicated
//! connection, so it lives exactly as long as that connection (a replica that dies or
//! loses the database loses it, and another replica takes it).

/// Advisory lock key of the scheduler leader ("GPUC" in ASCII).
pub const LEADER_LOCK: i64 = 0x4750_5543;

#[derive(diesel::QueryableByName)]
struct Locked {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    locked: bool,
}

/// Holds (or tries to take) the leader lock on a dedicated PostgreSQL connection.
#[derive(Default)]
pub struct Leader {
    conn: Option<diesel::PgConnection>,
    leading: bool,
    terms: u64,
}

impl Leader {
    /// Whether this process leads now: keeps the lock while its connection lives, or
    /// tries to take it (connecting to `url` first when needed).
    pub fn check(&mut self, url: &str) -> bool {
        use diesel::{Connection, RunQueryDsl};
        if self.leading {
            // Still ours while the connection lives.
            let alive = self.conn.as_mut().is_some_and(|c| {
                diesel::sql_query("SELECT TRUE AS locked")
                    .get_result::<Locked>(c)
                    .is_ok()
            });
            if alive {
                return true;
            }
            tracing::warn!("lost the scheduler leader connection");
            self.conn = None;
            self.leading = false;
        }
        if self.conn.is_none() {
            self.conn = diesel::PgConnection::establish(url).ok();
        }
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        let got = diesel::sql_query(format!(
            "SELECT pg_try_advisory_lock({LEADER_LOCK}) AS locked"
        ))
        .get_result::<Locked>(c)
        .map(|l| l.locked);
        match got {
            Ok(true) => {
                tracing::info!("this portal now runs the scheduler");
                self.leading = true;
                self.terms += 1;
            }
            Ok(false) => {}
            Err(_) => self.conn = None,
        }
        self.leading
    }

    /// How many times this process has taken the lock. A new term means the lock was
    /// lost in between, however briefly: another replica may have led meanwhile (and
    /// taken changes out of the log), or the database restarted (and emptied its
    /// unlogged tables), so the scheduler reads its world afresh.
    pub fn terms(&self) -> u64 {
        self.terms
    }
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use diesel::RunQueryDsl;

    /// A leader whose connection the database ended takes the lock again in a new term,
    /// even when no check saw it without the lock.
    #[test]
    fn a_lock_taken_again_after_its_connection_ended_is_a_new_term() {
        let (guard, mut c) = crate::testkit::postgres();
        let crate::DbConn::Pg(pg) = &mut c else {
            unreachable!("testkit::postgres gives a PostgreSQL connection")
        };
        let url = guard.url();
        let mut leader = Leader::default();
        assert!(leader.check(&url));
        assert!(leader.check(&url));
        assert_eq!(leader.terms(), 1, "still the first term");
        let ended = diesel::sql_query(format!(
            "SELECT pg_terminate_backend(pid) AS locked FROM pg_locks \
             WHERE locktype = 'advisory' AND granted AND objid = {LEADER_LOCK} \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ))
        .load::<Locked>(pg)
        .unwrap();
        assert_eq!(ended.len(), 1, "the leader's connection holds the lock");
        assert!(leader.check(&url));
        assert_eq!(leader.terms(), 2);
    }
}
