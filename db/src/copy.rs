//! Moving a campus from the embedded SQLite file to PostgreSQL
//! (`commons-portal admin migrate-db`), and the SQLite online backup.
//!
//! The copy:
//! 1. Both databases are brought to the latest schema (the embedded migrations).
//! 2. The target must be empty: every table but the migrations' own has no row (tables
//!    whose migration writes their one row, [`SEEDED`], get the source's instead).
//! 3. Tables are copied parents first (by their foreign keys), each as JSON batches:
//!    SQLite's `json_object` on the way out, PostgreSQL's `json_populate_recordset` on
//!    the way in, so every column converts by PostgreSQL's own input rules. One
//!    transaction: a failure leaves the target empty.
//! 4. Sequences continue after the largest id.
//! 5. Verified: per table, the row count and a SHA-256 over its rows in a canonical form
//!    (booleans, timestamps rounded to PostgreSQL's microseconds, numbers, text), read
//!    back from both sides, must match.

use diesel::prelude::*;
use diesel::sql_types::Text;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CopyError {
    #[error("--from must be sqlite://PATH and --to postgres://... (got {0})")]
    Urls(String),
    #[error("the target database is not empty ({0}): migrate-db only fills an empty database")]
    NotEmpty(String),
    #[error("table {table}: the columns differ between the databases ({detail})")]
    Schema { table: String, detail: String },
    #[error("verification failed for table {table}: {detail}")]
    Verify { table: String, detail: String },
    #[error("{0} already exists: backups never overwrite a file")]
    Exists(String),
    #[error("backup needs a SQLite database; for PostgreSQL use pg_dump")]
    NotSqlite,
    #[error(transparent)]
    Db(#[from] super::DbError),
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
    #[error("{0}")]
    Data(String),
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    row: String,
}

#[derive(QueryableByName)]
struct Column {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    kind: String,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// What was copied: per table, rows and the checksum both sides agree on.
#[derive(Debug)]
pub struct Copied {
    pub tables: Vec<(String, usize, String)>,
}

const MIGRATIONS_TABLE: &str = "__diesel_schema_migrations";
/// Tables whose migration writes their one row itself (so a fresh database has it):
/// not counted when the target must be empty, and replaced by the source's row.
const SEEDED: [&str; 1] = ["notification_cursor"];
/// The scheduler's change log (`world`): not copied, and emptied in the target after the
/// copy (its triggers wrote every copied row into it); a portal reads its world in full
/// when it starts.
const CHANGE_LOG: &str = "world_changes";
/// SQLite's flag for the scheduler's own writes (empty outside its transaction; the
/// PostgreSQL side uses a session setting instead).
const NOTED_FLAG: &str = "world_noted";
const BATCH: usize = 500;

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Copies everything from the SQLite database at `from` into the empty PostgreSQL
/// database at `to`, and verifies it (see the module's list).
pub fn sqlite_to_postgres(from: &str, to: &str) -> Result<Copied, CopyError> {
    if super::backend_of(from).ok() != Some(super::Backend::Sqlite)
        || super::backend_of(to).ok() != Some(super::Backend::Postgres)
    {
        return Err(CopyError::Urls(format!(
            "--from {from:?} --to <postgres url>"
        )));
    }
    if !std::path::Path::new(from.trim_start_matches("sqlite://")).exists() {
        return Err(CopyError::Data(format!("{from}: no such database file")));
    }
    // 1. Latest schema on both.
    super::run_migrations(&mut super::establish(from)?)?;
    super::run_migrations(&mut super::establish(to)?)?;
    let mut src = diesel::SqliteConnection::establish(from.trim_start_matches("sqlite://"))
        .map_err(super::DbError::from)?;
    let mut dst = diesel::PgConnection::establish(to).map_err(super::DbError::from)?;

    let tables = sqlite_tables(&mut src)?;
    // 2. The target must be empty.
    ensure_empty(&mut dst, &tables)?;
    let order = parents_first(&mut src, &tables)?;
    let columns = matching_columns(&mut src, &mut dst, &order)?;
    // 3, 4. Copy in one transaction.
    dst.transaction::<_, CopyError, _>(|dst| {
        for t in &order {
            copy_table(&mut src, dst, t, &columns[t].0)?;
        }
        diesel::sql_query(format!("DELETE FROM {CHANGE_LOG}")).execute(dst)?;
        Ok(())
    })?;
    // 5. Verify.
    let mut out = Vec::new();
    for t in &order {
        let (rows, sum) = verify_table(&mut src, &mut dst, t, &columns[t])?;
        out.push((t.clone(), rows, sum));
    }
    Ok(Copied { tables: out })
}

/// A table's columns: SQLite's names in order, and PostgreSQL's names with their types.
type Columns = (Vec<String>, BTreeMap<String, String>);

fn ensure_empty(dst: &mut diesel::PgConnection, tables: &[String]) -> Result<(), CopyError> {
    let mut full = Vec::new();
    for t in tables.iter().filter(|t| !SEEDED.contains(&t.as_str())) {
        let n = diesel::sql_query(format!("SELECT COUNT(*) AS n FROM {}", quote(t)))
            .get_result::<Count>(dst)?
            .n;
        if n > 0 {
            full.push(format!("{t}: {n} rows"));
        }
    }
    if full.is_empty() {
        Ok(())
    } else {
        Err(CopyError::NotEmpty(full.join(", ")))
    }
}

/// Each table's columns on both sides, which must be the same names.
fn matching_columns(
    src: &mut diesel::SqliteConnection,
    dst: &mut diesel::PgConnection,
    order: &[String],
) -> Result<BTreeMap<String, Columns>, CopyError> {
    let mut columns = BTreeMap::new();
    for t in order {
        let cols = sqlite_columns(src, t)?;
        let pg = pg_columns(dst, t)?;
        let a: BTreeSet<&String> = cols.iter().collect();
        let b: BTreeSet<&String> = pg.keys().collect();
        if a != b {
            return Err(CopyError::Schema {
                table: t.clone(),
                detail: format!("sqlite {a:?}, postgres {b:?}"),
            });
        }
        columns.insert(t.clone(), (cols, pg));
    }
    Ok(columns)
}

/// Copies one table's rows in batches, then moves its id sequence past them.
fn copy_table(
    src: &mut diesel::SqliteConnection,
    dst: &mut diesel::PgConnection,
    t: &str,
    cols: &[String],
) -> Result<(), CopyError> {
    let rows = sqlite_rows(src, t, cols)?;
    if SEEDED.contains(&t) {
        diesel::sql_query(format!("DELETE FROM {}", quote(t))).execute(dst)?;
    }
    for chunk in rows.chunks(BATCH) {
        let json = format!("[{}]", chunk.join(","));
        diesel::sql_query(format!(
            "INSERT INTO {q} SELECT * FROM json_populate_recordset(NULL::{q}, $1::json)",
            q = quote(t)
        ))
        .bind::<Text, _>(json)
        .execute(dst)?;
    }
    if cols.iter().any(|c| c == "id") {
        diesel::sql_query(format!(
            // COALESCE: an `id` without a sequence (a table of one row) sets nothing.
            "SELECT COALESCE(setval(pg_get_serial_sequence('{t}', 'id'), \
             COALESCE((SELECT MAX(id) FROM {q}), 0) + 1, false)::text, '') AS name",
            q = quote(t)
        ))
        .load::<Name>(dst)?;
    }
    Ok(())
}

/// Both sides' rows of one table have the same count and checksum: (rows, sha256).
fn verify_table(
    src: &mut diesel::SqliteConnection,
    dst: &mut diesel::PgConnection,
    t: &str,
    (cols, kinds): &Columns,
) -> Result<(usize, String), CopyError> {
    let a = checksum(sqlite_rows(src, t, cols)?, kinds)?;
    let pg_rows: Vec<String> = diesel::sql_query(format!(
        "SELECT row_to_json(x)::text AS row FROM {} x",
        quote(t)
    ))
    .load::<Row>(dst)?
    .into_iter()
    .map(|r| r.row)
    .collect();
    let b = checksum(pg_rows, kinds)?;
    if a != b {
        return Err(CopyError::Verify {
            table: t.to_string(),
            detail: format!(
                "sqlite {} rows (sha256 {}, first {}), postgres {} rows (sha256 {}, first {})",
                a.0, a.1, a.2, b.0, b.1, b.2
            ),
        });
    }
    Ok((a.0, a.1))
}

fn sqlite_tables(c: &mut diesel::SqliteConnection) -> Result<Vec<String>, CopyError> {
    Ok(diesel::sql_query(format!(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         AND name NOT IN ('{MIGRATIONS_TABLE}', '{CHANGE_LOG}', '{NOTED_FLAG}') ORDER BY name"
    ))
    .load::<Name>(c)?
    .into_iter()
    .map(|n| n.name)
    .collect())
}

fn sqlite_columns(c: &mut diesel::SqliteConnection, t: &str) -> Result<Vec<String>, CopyError> {
    Ok(diesel::sql_query(format!(
        "SELECT name FROM pragma_table_info('{t}') ORDER BY cid"
    ))
    .load::<Name>(c)?
    .into_iter()
    .map(|n| n.name)
    .collect())
}

fn pg_columns(
    c: &mut diesel::PgConnection,
    t: &str,
) -> Result<BTreeMap<String, String>, CopyError> {
    Ok(diesel::sql_query(
        "SELECT column_name::text AS name, data_type::text AS kind FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = $1",
    )
    .bind::<Text, _>(t)
    .load::<Column>(c)?
    .into_iter()
    .map(|c| (c.name, c.kind))
    .collect())
}

/// Tables ordered so that every table comes after those its foreign keys name.
fn parents_first(
    c: &mut diesel::SqliteConnection,
    tables: &[String],
) -> Result<Vec<String>, CopyError> {
    let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in tables {
        let p = diesel::sql_query(format!(
            "SELECT \"table\" AS name FROM pragma_foreign_key_list('{t}')"
        ))
        .load::<Name>(c)?
        .into_iter()
        .map(|n| n.name)
        .filter(|p| p != t && tables.contains(p))
        .collect();
        parents.insert(t.clone(), p);
    }
    let mut order: Vec<String> = Vec::new();
    while order.len() < tables.len() {
        let ready: Vec<String> = parents
            .iter()
            .filter(|(t, ps)| !order.contains(t) && ps.iter().all(|p| order.contains(p)))
            .map(|(t, _)| t.clone())
            .collect();
        if ready.is_empty() {
            return Err(CopyError::Data("the foreign keys form a cycle".into()));
        }
        order.extend(ready);
    }
    Ok(order)
}

fn sqlite_rows(
    c: &mut diesel::SqliteConnection,
    t: &str,
    cols: &[String],
) -> Result<Vec<String>, CopyError> {
    let pairs: Vec<String> = cols
        .iter()
        .map(|c| format!("'{c}', {}", quote(c)))
        .collect();
    Ok(diesel::sql_query(format!(
        "SELECT json_object({}) AS row FROM {} ORDER BY rowid",
        pairs.join(", "),
        quote(t)
    ))
    .load::<Row>(c)?
    .into_iter()
    .map(|r| r.row)
    .collect())
}

/// (rows, SHA-256, the first canonical row) over the rows in canonical form, sorted.
fn checksum(
    rows: Vec<String>,
    kinds: &BTreeMap<String, String>,
) -> Result<(usize, String, String), CopyError> {
    let mut canon = Vec::with_capacity(rows.len());
    for r in &rows {
        let v: serde_json::Map<String, Value> =
            serde_json::from_str(r).map_err(|e| CopyError::Data(format!("{e}: {r}")))?;
        let mut out = serde_json::Map::new();
        for (k, v) in v {
            let kind = kinds.get(&k).map(String::as_str).unwrap_or("");
            out.insert(k, canonical(kind, v)?);
        }
        canon.push(Value::Object(out).to_string());
    }
    canon.sort();
    let mut h = Sha256::new();
    for r in &canon {
        h.update(r.as_bytes());
        h.update(b"\n");
    }
    let first = canon.first().cloned().unwrap_or_default();
    Ok((rows.len(), hex::encode(h.finalize()), first))
}

fn canonical(kind: &str, v: Value) -> Result<Value, CopyError> {
    if v.is_null() {
        return Ok(v);
    }
    Ok(match kind {
        "boolean" => Value::Bool(match &v {
            Value::Bool(b) => *b,
            Value::Number(n) => n.as_i64() != Some(0),
            _ => return Err(CopyError::Data(format!("not a boolean: {v}"))),
        }),
        k if k.starts_with("timestamp") => {
            let s = v.as_str().unwrap_or_default().replace('T', " ");
            let t = chrono::NaiveDateTime::parse_from_str(&s, "%Y-%m-%d %H:%M:%S%.f")
                .map_err(|e| CopyError::Data(format!("not a time ({e}): {s}")))?;
            let t = t.and_utc();
            Value::from(t.timestamp() * 1_000_000 + pg_micros(t.timestamp_subsec_nanos()))
        }
        "double precision" | "real" => Value::from(v.as_f64().unwrap_or(f64::NAN).to_string()),
        _ => v,
    })
}

/// The microseconds PostgreSQL keeps of a time's fraction of a second given to the
/// nanosecond: it reads the fraction as a double and rounds it with `rint` (ties to
/// even, on the double's value), so `.886406500` becomes `.886406`, not `.886407`.
/// Anything else makes the copy's check fail on about one time in a thousand.
fn pg_micros(nanos: u32) -> i64 {
    let fraction: f64 = format!("0.{nanos:09}").parse().unwrap_or(0.0);
    (fraction * 1_000_000.0).round_ties_even() as i64
}

/// An online backup of the SQLite database at `url` into the new file `to`
/// (`VACUUM INTO`: a consistent snapshot while the portal keeps running).
pub fn sqlite_backup(url: &str, to: &std::path::Path) -> Result<u64, CopyError> {
    if super::backend_of(url)? != super::Backend::Sqlite {
        return Err(CopyError::NotSqlite);
    }
    if to.exists() {
        return Err(CopyError::Exists(to.display().to_string()));
    }
    let mut c = diesel::SqliteConnection::establish(url.trim_start_matches("sqlite://"))
        .map_err(super::DbError::from)?;
    diesel::sql_query("PRAGMA busy_timeout = 10000").execute(&mut c)?;
    diesel::sql_query("VACUUM INTO ?")
        .bind::<Text, _>(to.display().to_string())
        .execute(&mut c)?;
    Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_round_to_microseconds_as_postgresql_rounds_them() {
        // What PostgreSQL answers for '2026-12-05 10:00:00.<fraction>'::timestamp.
        for (nanos, micros) in [
            (500, 0),
            (1_500, 2),
            (886_406_500, 886_406),
            (886_407_500, 886_408),
            (123_456_500, 123_456),
            (123_456_501, 123_457),
            (999_999_999, 1_000_000),
        ] {
            assert_eq!(pg_micros(nanos), micros, "{nanos} ns");
        }
    }
}
