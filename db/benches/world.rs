//! The scheduler's world as the campus's history grows: the snapshot built from the
//! rows the leading portal keeps in memory (`World::snapshot`), and a round's update of
//! them when nothing changed (`World::update`).
//!
//! The world keeps every attempt that used GPUs within the fair-share ledgers' reach
//! (eight weeks), and each round's snapshot walks them all to total the labs' and
//! members' usage. A campus's history grows with its age, not with its queue: this
//! measures the build with 10,000 queued jobs and 0, 50,000 and 200,000 ended attempts,
//! side by side in one run. `cargo bench -p commons-db --features testkit --bench world`.

// Benchmark code: a failed step ends the run, said where it happened.
#![allow(clippy::expect_used)]

use commons_db::{testkit, world::World, DbConn};
use commons_sched::Policy;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use diesel::connection::SimpleConnection;
use diesel::RunQueryDsl;
use std::hint::black_box;
use std::time::Duration;

#[derive(diesel::QueryableByName)]
struct Column {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

/// `n` copies of job `template` in state `state`, created over the last 50 days.
fn copy_jobs(c: &mut DbConn, template: i64, n: usize, state: &str) {
    let columns: Vec<String> = diesel::sql_query("SELECT name FROM pragma_table_info('jobs')")
        .load::<Column>(c)
        .expect("the jobs table's columns")
        .into_iter()
        .map(|c| c.name)
        .filter(|name| name != "id")
        .collect();
    let values: Vec<String> = columns
        .iter()
        .map(|name| match name.as_str() {
            "state" => format!("'{state}'"),
            "created_at" => "datetime('now', '-' || (x % 50) || ' days')".into(),
            "node_id" | "started_at" | "reason" => "NULL".into(),
            "attempts" => "0".into(),
            other => other.into(),
        })
        .collect();
    c.batch_execute(&format!(
        "WITH RECURSIVE seq(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM seq WHERE x < {n}) \
         INSERT INTO jobs ({}) SELECT {} FROM jobs, seq WHERE jobs.id = {template}",
        columns.join(", "),
        values.join(", ")
    ))
    .expect("copies of the template job");
}

/// A campus of one node whose history holds `ended` attempts of an hour each, with
/// `queued` jobs waiting.
fn campus(ended: usize, queued: usize) -> (tempfile::TempDir, DbConn) {
    let (dir, mut c) = testkit::sqlite();
    let campus = testkit::campus(&mut c, 1);
    let template = campus.jobs[0].id;
    let gpu = commons_db::nodes::list_with_gpus(&mut c).expect("the node")[0].2[0].id;
    copy_jobs(&mut c, template, ended, "succeeded");
    c.batch_execute(&format!(
        "INSERT INTO job_attempts (job_id, attempt, node_id, gpu_ids, state, lease_until, \
         created_at, started_at, ended_at) \
         SELECT id, 1, {node}, '[{gpu}]', 'exited', created_at, created_at, created_at, \
         datetime(created_at, '+1 hour') FROM jobs WHERE state = 'succeeded'",
        node = campus.node.id
    ))
    .expect("the ended attempts");
    copy_jobs(&mut c, template, queued, "queued");
    (dir, c)
}

fn bench(c: &mut Criterion) {
    let policy = Policy::default();
    let mut group = c.benchmark_group("world");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_secs(1));
    // `cargo test --all-targets` runs this once as a test: small campuses then.
    let sizes: [usize; 3] = if std::env::args().any(|a| a == "--bench") {
        [0, 50_000, 200_000]
    } else {
        [0, 500, 2_000]
    };
    for ended in sizes {
        let (_dir, mut conn) = campus(ended, 10_000);
        let mut world = World::load(&mut conn).expect("the world");
        let s = world.snapshot(&policy);
        eprintln!(
            "{ended} ended attempts: {} queued, {} running",
            s.queue.len(),
            s.running.len(),
        );
        group.bench_with_input(BenchmarkId::new("snapshot", ended), &world, |b, w| {
            b.iter(|| black_box(w.snapshot(&policy)))
        });
        // A round's update when nothing changed: what it costs whatever the changes.
        group.bench_function(BenchmarkId::new("update", ended), |b| {
            b.iter(|| world.update(&mut conn).expect("the update"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
