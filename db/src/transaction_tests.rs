//! [`crate::transaction`] on SQLite beside another process's writes.

use super::{establish, transaction, DbConn, DbError};
use diesel::connection::SimpleConnection;
use diesel::RunQueryDsl;
use std::sync::mpsc;
use std::time::Duration;

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn count(c: &mut DbConn) -> Result<i64, DbError> {
    Ok(diesel::sql_query("SELECT COUNT(*) AS n FROM t")
        .get_result::<Count>(c)?
        .n)
}

/// The portal's enrolment read a token, then wrote; the operator's `admin` command
/// committed a row in between, on its own connection. With a plain `BEGIN` SQLite
/// refused the portal's write at once (`database is locked`, busy timeout or not);
/// the transaction now holds the write lock from its start, and the other writer waits
/// for it under its busy timeout instead.
#[test]
fn a_transaction_that_reads_then_writes_survives_another_connections_write() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/t.db", dir.path().display());
    establish(&url)
        .unwrap()
        .batch_execute("CREATE TABLE t (x INTEGER)")
        .unwrap();
    let (read_tx, read_rx) = mpsc::channel::<()>();
    let (wrote_tx, wrote_rx) = mpsc::channel::<()>();
    let other = {
        let url = url.clone();
        std::thread::spawn(move || {
            let mut c = establish(&url).unwrap();
            read_rx.recv().unwrap();
            let r = c.batch_execute("INSERT INTO t (x) VALUES (2)");
            let _ = wrote_tx.send(());
            r
        })
    };
    let mut c = establish(&url).unwrap();
    let ours = transaction(&mut c, |c| -> Result<i64, DbError> {
        let before = count(c)?;
        read_tx.send(()).unwrap();
        // The other writer commits now unless this transaction holds the lock (then it
        // waits for our commit, and this wait ends without it).
        let _ = wrote_rx.recv_timeout(Duration::from_millis(500));
        c.batch_execute("INSERT INTO t (x) VALUES (1)")?;
        Ok(before)
    });
    assert!(ours.is_ok(), "our transaction: {ours:?}");
    let theirs = other.join().unwrap();
    assert!(theirs.is_ok(), "the other connection's write: {theirs:?}");
    assert_eq!(count(&mut c).unwrap(), 2);
}

/// Inside a transaction, another is a savepoint: its failure undoes only its own work.
#[test]
fn a_nested_transaction_is_a_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = establish(&format!("sqlite://{}/t.db", dir.path().display())).unwrap();
    c.batch_execute("CREATE TABLE t (x INTEGER)").unwrap();
    transaction(&mut c, |c| -> Result<(), DbError> {
        c.batch_execute("INSERT INTO t (x) VALUES (1)")?;
        let inner = transaction(c, |c| -> Result<(), DbError> {
            c.batch_execute("INSERT INTO t (x) VALUES (2)")?;
            Err(DbError::Join)
        });
        assert!(inner.is_err());
        Ok(())
    })
    .unwrap();
    assert_eq!(count(&mut c).unwrap(), 1);
}

/// Processes that open the file at the same moment (the portal's pool, an operator's
/// `admin` command) each set it up; none is refused while another holds the lock.
#[test]
fn connections_opened_at_once_all_open() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        establish(&url).unwrap();
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        let opened: Vec<_> = (0..8)
            .map(|_| {
                let (url, start) = (url.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    establish(&url).map(|_| ())
                })
            })
            .collect();
        for t in opened {
            let r = t.join().unwrap();
            assert!(r.is_ok(), "{r:?}");
        }
    }
}
