//! The pool's connections: each counts its statements, and is checked at checkout only
//! when it has not proved itself lately.
//!
//! r2d2 asks `SELECT 1` of a connection at every checkout by default: one round trip in
//! front of every piece of database work (two of a submission's nine statements). Here a
//! connection whose last use succeeded less than [`TRUSTED_FOR`] ago is handed out as it
//! is; an older one is still asked, so a database restart while the pool was idle stays
//! invisible to requests. Work that fails on a connection that was trusted (the database
//! went away within that window) is answered with [`DbError::Lost`] (503, try again),
//! and the connection is dropped from the pool.

use super::{establish, DbConn, DbError};
use diesel::connection::{Connection, InstrumentationEvent, SimpleConnection};
use diesel::r2d2::ManageConnection;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after a successful use a connection is handed out without a check.
pub const TRUSTED_FOR: Duration = Duration::from_secs(1);

/// A pooled connection and what its last use said about it.
pub struct Pooled {
    conn: DbConn,
    /// When a use last succeeded (or a check passed).
    ok_at: Option<Instant>,
    /// The connection failed a check: the pool drops it.
    broken: bool,
}

pub struct Manager {
    url: String,
    statements: Arc<AtomicU64>,
}

impl Manager {
    pub fn new(url: &str, statements: Arc<AtomicU64>) -> Self {
        Manager {
            url: url.to_string(),
            statements,
        }
    }
}

impl ManageConnection for Manager {
    type Connection = Pooled;
    type Error = DbError;

    fn connect(&self) -> Result<Pooled, DbError> {
        let mut conn = establish(&self.url)?;
        let n = Arc::clone(&self.statements);
        conn.set_instrumentation(move |e: InstrumentationEvent<'_>| {
            if matches!(e, InstrumentationEvent::StartQuery { .. }) {
                n.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(Pooled {
            conn,
            ok_at: Some(Instant::now()),
            broken: false,
        })
    }

    fn is_valid(&self, p: &mut Pooled) -> Result<(), DbError> {
        if p.ok_at.is_some_and(|t| t.elapsed() < TRUSTED_FOR) {
            return Ok(());
        }
        p.conn.batch_execute("SELECT 1")?;
        p.ok_at = Some(Instant::now());
        Ok(())
    }

    fn has_broken(&self, p: &mut Pooled) -> bool {
        p.broken
    }
}

/// Runs `f` on a pooled connection. When `f` fails, the connection is checked: if it is
/// dead, the failure is [`DbError::Lost`] and the pool drops the connection.
pub fn with<T, E, F>(p: &mut Pooled, f: F) -> Result<T, E>
where
    F: FnOnce(&mut DbConn) -> Result<T, E>,
    E: From<DbError>,
{
    match f(&mut p.conn) {
        Ok(v) => {
            p.ok_at = Some(Instant::now());
            Ok(v)
        }
        Err(e) => {
            if p.conn.batch_execute("SELECT 1").is_ok() {
                p.ok_at = Some(Instant::now());
                Err(e)
            } else {
                p.ok_at = None;
                p.broken = true;
                Err(E::from(DbError::Lost))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Db;
    use super::*;

    #[test]
    fn a_connection_in_use_is_asked_nothing_before_each_use() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open_with(&format!("sqlite://{}/t.db", dir.path().display()), 1).unwrap();
        let work = |db: &Db| {
            db.run_blocking(|c| c.batch_execute("SELECT 2").map_err(DbError::from))
                .unwrap()
        };
        let before = db.statements();
        work(&db);
        work(&db);
        assert_eq!(db.statements() - before, 2, "no SELECT 1 in front");
        // Idle for longer than the trust: checked at checkout.
        std::thread::sleep(TRUSTED_FOR + Duration::from_millis(100));
        work(&db);
        assert_eq!(db.statements() - before, 4, "SELECT 1, then the work");
        // A failure on a live connection is the failure itself (and one check).
        let e = db
            .run_blocking(|c| c.batch_execute("SELECT nope").map_err(DbError::from))
            .unwrap_err();
        assert!(matches!(e, DbError::Query(_)), "{e:?}");
        assert_eq!(db.statements() - before, 6);
    }

    /// The scheduler's connection is its own: with every pooled connection held (a
    /// burst of agents' reports), its work still runs at once, and it is opened only
    /// when first used.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reserved_connection_does_not_queue_behind_the_pool() {
        let (guard, _c) = crate::testkit::postgres();
        let db = Db::open_with(&guard.url(), 1).unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (taken, is_taken) = tokio::sync::oneshot::channel::<()>();
        let holder = {
            let db = db.clone();
            tokio::spawn(async move {
                db.run(move |_c| {
                    let _ = taken.send(());
                    let _ = held.recv();
                    Ok::<_, DbError>(())
                })
                .await
            })
        };
        is_taken.await.unwrap();
        assert_eq!(db.pool_state().1, 0, "the pool's one connection is in use");
        let deadline = Duration::from_secs(20);
        let got = tokio::time::timeout(
            deadline,
            db.run_reserved(|c| c.batch_execute("SELECT 1").map_err(DbError::from)),
        )
        .await;
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        assert!(
            matches!(got, Ok(Ok(()))),
            "the reserved connection's work waited {deadline:?} behind the pool: {got:?}"
        );
    }
}
