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
            *self = Leader::default();
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
            }
            Ok(false) => {}
            Err(_) => self.conn = None,
        }
        self.leading
    }
}
