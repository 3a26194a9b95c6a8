//! GPU Commons' database layer: diesel over SQLite (embedded default) or PostgreSQL,
//! chosen by the URL scheme, with the same queries for both; the schema, typed rows,
//! queries, the pool and the migrations (embedded from the workspace's `migrations/`).
//! No HTTP in here: errors are [`DbError`], which the portal maps to statuses.
//!
//! Invariants:
//! - Migrations are embedded and applied at start, per backend.
//! - SQLite runs with WAL, foreign keys on and a busy timeout, through a pool of one
//!   connection: SQLite serialises writers anyway, and one connection rules out
//!   `database is locked` errors under load. PostgreSQL gets as many
//!   connections as the caller asks for (the portal's `database_pool_size`, 16 by default): with `fsync` on, concurrent commits share their WAL
//!   flushes, and the load test measured 594-645 submissions/s with a pool of 8 against
//!   1,088-1,143/s with 16 (docs/src/reports/performance.md).
//! - Blocking diesel calls run on the blocking thread pool ([`Db::run`]), never on the
//!   async executor.

pub mod app_presets;
pub mod apps;
pub mod arrays;
pub mod attempts;
pub mod audit;
pub mod checkpoint_parts;
pub mod checkpoints;
pub mod cli_logins;
pub mod copy;
pub mod datasets;
pub mod deps;
pub mod domain;
pub mod files;
pub mod gateway;
pub mod gpu_stats;
pub mod images;
pub mod job_search;
pub mod job_templates;
pub mod jobs;
pub mod leader;
pub mod models;
pub mod node_link;
pub mod nodes;
pub mod notifications;
pub mod overview;
pub mod plan;
mod pool;
pub mod samples;
pub mod schema;
pub mod snapshot;
pub mod ssh_keys;
pub mod staging;
pub mod staging_size;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod types;
pub mod upload_parts;
pub mod usage;
pub mod users;
pub mod web_sessions;
pub mod world;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use pool::Manager;
use thiserror::Error;

pub const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations/sqlite");
pub const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations/postgres");

#[derive(diesel::MultiConnection)]
pub enum DbConn {
    Pg(diesel::PgConnection),
    Sqlite(diesel::SqliteConnection),
}

/// What the database layer says: a refusal it makes itself (a row that is missing, input
/// or a credential that breaks a stored rule), or a failure underneath (the pool, a
/// query, the connection). It knows nothing of HTTP; the portal maps it to a status in
/// one place (`error.rs`).
#[derive(Debug, Error)]
pub enum DbError {
    /// The row a caller named does not exist; the thing's name (`job`, `node`).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// Input that breaks a rule the database layer keeps; `field` names the culprit.
    #[error("{message}")]
    Invalid { field: String, message: String },
    /// The write clashes with what is stored; `code` says how, for scripts.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// A credential (an enrolment token) that is unknown, spent or expired.
    #[error("{0}")]
    BadCredential(String),
    /// Too many of a kind from one client; it may try again after `retry_after_s`.
    #[error("{message}")]
    TooMany {
        code: &'static str,
        message: String,
        retry_after_s: u64,
    },
    /// A table is at the limit it keeps for everyone; try again later.
    #[error("{0}")]
    Full(String),
    /// What should not happen (a row not as every writer leaves it, no free user code
    /// after several tries): never the caller's fault.
    #[error("{0}")]
    Internal(String),
    #[error("JSON column: {0}")]
    Json(#[from] serde_json::Error),
    #[error("database URL must start with sqlite:// or postgres://, got {0:?}")]
    BadUrl(String),
    #[error("cannot connect to the database: {0}")]
    Connect(#[from] diesel::ConnectionError),
    #[error("database pool: {0}")]
    Pool(#[from] r2d2::PoolError),
    #[error("database migration failed: {0}")]
    Migration(String),
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
    #[error("database task panicked or was cancelled")]
    Join,
    #[error("the database connection was lost during the request")]
    Lost,
}

impl DbError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        DbError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        DbError::Conflict {
            code,
            message: message.into(),
        }
    }
    /// No connection to be had, or the one in use went away: the server restarts, or
    /// every connection is busy past the pool's timeout. Worth trying again; the pool
    /// reconnects.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Connect(_) | DbError::Pool(_) | DbError::Lost => true,
            DbError::Query(q) => database_went_away(q),
            _ => false,
        }
    }
}

/// A broken rule from the shared request rules (`commons_api`), with its field.
impl From<commons_api::Invalid> for DbError {
    fn from(e: commons_api::Invalid) -> Self {
        DbError::invalid(&e.field, e.message)
    }
}

/// The database restarted or dropped the connection under the query (worth trying again,
/// not a bug): the connection is closed, or PostgreSQL says it is shutting down or
/// starting up (SQLSTATE 57P01-57P03, which diesel reports only by their message).
pub fn database_went_away(e: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind as K, Error as E};
    match e {
        E::DatabaseError(K::ClosedConnection | K::UnableToSendCommand, _) => true,
        E::DatabaseError(_, info) => {
            let m = info.message();
            [
                "terminating connection due to administrator command",
                "the database system is shutting down",
                "the database system is starting up",
                "the database system is in recovery mode",
                "server closed the connection unexpectedly",
            ]
            .iter()
            .any(|p| m.contains(p))
        }
        _ => false,
    }
}

/// Which backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn backend_of(url: &str) -> Result<Backend, DbError> {
    if url.starts_with("sqlite://") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(DbError::BadUrl(url.to_string()))
    }
}

/// Opens one connection for `url`, set up for our use.
pub fn establish(url: &str) -> Result<DbConn, DbError> {
    match backend_of(url)? {
        Backend::Postgres => Ok(DbConn::Pg(diesel::PgConnection::establish(url)?)),
        Backend::Sqlite => {
            let path = url.trim_start_matches("sqlite://");
            if let Some(dir) = std::path::Path::new(path).parent() {
                if !dir.as_os_str().is_empty() {
                    let _ = std::fs::create_dir_all(dir);
                }
            }
            let mut c = diesel::SqliteConnection::establish(path)?;
            // The busy timeout first: switching to WAL takes a lock that another
            // connection opening the file at the same moment may hold.
            c.batch_execute(
                "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; \
                 PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
            )?;
            Ok(DbConn::Sqlite(c))
        }
    }
}

pub fn run_migrations(conn: &mut DbConn) -> Result<(), DbError> {
    let migrations = match conn {
        DbConn::Pg(_) => POSTGRES_MIGRATIONS,
        DbConn::Sqlite(_) => SQLITE_MIGRATIONS,
    };
    conn.run_pending_migrations(migrations)
        .map_err(|e| DbError::Migration(e.to_string()))?;
    Ok(())
}

/// A pool of connections and the way to use them from async code.
#[derive(Clone)]
pub struct Db {
    pool: r2d2::Pool<Manager>,
    /// One connection kept for [`Db::run_reserved`] (PostgreSQL only), opened at its first
    /// use.
    reserved: Option<r2d2::Pool<Manager>>,
    pub backend: Backend,
    /// Where [`Db::run`] records how long it waited for a connection (set once).
    waits: std::sync::Arc<std::sync::OnceLock<prometheus_client::metrics::histogram::Histogram>>,
    /// Statements sent on the pool's connections so far.
    statements: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Db {
    /// Connects, and applies pending migrations: a pool of up to `pool_size` connections
    /// on PostgreSQL, of one on SQLite (see the module's invariants).
    pub fn open_with(url: &str, pool_size: u32) -> Result<Self, DbError> {
        let backend = backend_of(url)?;
        let size = match backend {
            Backend::Sqlite => 1,
            Backend::Postgres => pool_size.max(1),
        };
        let statements = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .connection_timeout(std::time::Duration::from_secs(30))
            .build(Manager::new(url, statements.clone()))?;
        pool::with(&mut *pool.get()?, run_migrations)?;
        let reserved = (backend == Backend::Postgres).then(|| {
            r2d2::Pool::builder()
                .max_size(1)
                .min_idle(Some(0))
                .idle_timeout(None)
                .connection_timeout(std::time::Duration::from_secs(30))
                .build_unchecked(Manager::new(url, statements.clone()))
        });
        Ok(Self {
            pool,
            reserved,
            backend,
            waits: Default::default(),
            statements,
        })
    }

    /// Records from now on, in `h`, how long each [`Db::run`] waits for a connection.
    pub fn observe_waits(&self, h: prometheus_client::metrics::histogram::Histogram) {
        let _ = self.waits.set(h);
    }

    /// Statements sent on the pool's connections since it opened.
    pub fn statements(&self) -> u64 {
        self.statements.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs blocking database work on the blocking pool. Work that fails because the
    /// connection died (the database restarted) fails with [`DbError::Lost`] (a 503).
    pub async fn run<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut DbConn) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        on(self.pool.clone(), Some(self.waits.clone()), f).await
    }

    /// [`Db::run`] on a connection of its own, kept for one caller whose every wait
    /// delays everyone (the scheduler's loop, which calls it one step at a time): it never
    /// queues behind the pool's other users, such as a burst of agents' reports just
    /// after a round's starts. On SQLite, whose one connection is shared by design, the
    /// same as [`Db::run`].
    pub async fn run_reserved<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut DbConn) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        match self.reserved.clone() {
            Some(pool) => on(pool, None, f).await,
            None => self.run(f).await,
        }
    }

    /// The pool's connections: (open, idle, most allowed).
    pub fn pool_state(&self) -> (u32, u32, u32) {
        let s = self.pool.state();
        (s.connections, s.idle_connections, self.pool.max_size())
    }

    /// The same, for code that is already on a blocking thread (the CLI).
    pub fn run_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut DbConn) -> Result<T, E>,
        E: From<DbError>,
    {
        let mut conn = self.pool.get().map_err(DbError::from)?;
        pool::with(&mut conn, f)
    }
}

/// Runs `f` on a connection of `pool`, on the blocking pool, recording in `waits` (when
/// given and set) how long it waited for the connection.
async fn on<T, E, F>(
    pool: r2d2::Pool<Manager>,
    waits: Option<
        std::sync::Arc<std::sync::OnceLock<prometheus_client::metrics::histogram::Histogram>>,
    >,
    f: F,
) -> Result<T, E>
where
    F: FnOnce(&mut DbConn) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<DbError> + Send + 'static,
{
    let asked = std::time::Instant::now();
    tokio::task::spawn_blocking(move || {
        let mut conn = pool.get().map_err(DbError::from)?;
        if let Some(h) = waits.as_deref().and_then(|w| w.get()) {
            h.observe(asked.elapsed().as_secs_f64());
        }
        pool::with(&mut conn, f)
    })
    .await
    .map_err(|_| E::from(DbError::Join))?
}

/// `INSERT ... RETURNING id` on either backend (the multi-backend has no RETURNING of its
/// own, each inner connection does).
#[macro_export]
macro_rules! insert_returning_id {
    ($conn:expr, $insert:expr, $id:expr) => {
        match $conn {
            $crate::DbConn::Pg(c) => $insert.returning($id).get_result::<i64>(c),
            $crate::DbConn::Sqlite(c) => $insert.returning($id).get_result::<i64>(c),
        }
    };
}

/// Runs `f` in a transaction (so `service/` needs no diesel traits of its own).
///
/// On SQLite an outermost transaction begins with `BEGIN IMMEDIATE`: it takes the write
/// lock first, waiting for it under `busy_timeout`. A plain `BEGIN` reads first and
/// takes the lock at its first write; if another connection (the operator's `admin`
/// command beside a running portal) committed in between, SQLite answers `database is
/// locked` at once, whatever the timeout, because the transaction's reads are stale.
/// Nested calls are savepoints, as with diesel's own `transaction`.
pub fn transaction<T, E, F>(c: &mut DbConn, f: F) -> Result<T, E>
where
    F: FnOnce(&mut DbConn) -> Result<T, E>,
    E: From<diesel::result::Error>,
{
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let DbConn::Sqlite(s) = c else {
        return c.transaction(f);
    };
    let depth = AnsiTransactionManager::transaction_manager_status_mut(s).transaction_depth()?;
    if depth.is_some() {
        return c.transaction(f);
    }
    AnsiTransactionManager::begin_transaction_sql(s, "BEGIN IMMEDIATE")?;
    match f(c) {
        Ok(v) => {
            <DbConn as TransactionManager<DbConn>>::commit_transaction(c)?;
            Ok(v)
        }
        Err(e) => match <DbConn as TransactionManager<DbConn>>::rollback_transaction(c) {
            Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(e),
            Err(rollback) => Err(rollback.into()),
        },
    }
}

/// Lets the current transaction commit without waiting for its record to reach the disk
/// (PostgreSQL's `synchronous_commit = off`, for this transaction only; SQLite: nothing).
/// For what can be lost in a crash of the database without harm, because it is derived
/// and written again: the scheduler taking changes out of its log (a full read follows
/// any failure, and a change read twice is read twice) and what waiting jobs show. A
/// later commit that waits flushes this one with it; nothing is reordered.
pub fn unflushed_commit(c: &mut DbConn) -> Result<(), DbError> {
    if let DbConn::Pg(pg) = c {
        diesel::sql_query("SET LOCAL synchronous_commit = off").execute(pg)?;
    }
    Ok(())
}

/// This replica's clock (UTC): for what people read (when a job was submitted, an event
/// happened). Leases, and whether an agent is alive, are judged on [`clock`] instead.
pub fn now() -> chrono::NaiveDateTime {
    chrono::Utc::now().naive_utc() + test_clock_offset()
}

/// The one clock every replica judges leases and agents' liveness on: the database's
/// `now()` on PostgreSQL (replicas' clocks may disagree; the database has one), this
/// portal's clock on SQLite (one portal). One statement on PostgreSQL.
pub fn clock(c: &mut DbConn) -> Result<chrono::NaiveDateTime, DbError> {
    match c {
        DbConn::Pg(pg) => Ok(
            diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamp>(PG_NOW_UTC))
                .get_result(pg)?,
        ),
        DbConn::Sqlite(_) => Ok(now()),
    }
}

/// Most ids in one `IN (...)` list (SQLite binds each one; its limit is 32,766).
pub(crate) const IDS_PER_QUERY: usize = 5000;

/// The database's time in UTC, as a `timestamp` (the type every time column has).
pub const PG_NOW_UTC: &str = "(now() AT TIME ZONE 'UTC')";

/// Environment variable that skews this process's [`now`] by that many seconds, to test
/// that replicas whose clocks disagree still judge leases alike. Honoured only by debug
/// builds (tests); a release build ignores it.
pub const TEST_CLOCK_OFFSET_ENV: &str = "COMMONS_TEST_CLOCK_OFFSET_S";

fn test_clock_offset() -> chrono::Duration {
    #[cfg(debug_assertions)]
    {
        static OFFSET: std::sync::OnceLock<chrono::Duration> = std::sync::OnceLock::new();
        *OFFSET.get_or_init(|| {
            let s = std::env::var(TEST_CLOCK_OFFSET_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .unwrap_or(0);
            if s != 0 {
                tracing::warn!(
                    "{TEST_CLOCK_OFFSET_ENV}={s}: this portal's clock is skewed (tests only)"
                );
            }
            chrono::Duration::seconds(s)
        })
    }
    #[cfg(not(debug_assertions))]
    {
        chrono::Duration::zero()
    }
}

#[cfg(test)]
mod transaction_tests;
