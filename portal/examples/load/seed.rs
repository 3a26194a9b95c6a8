//! Test setup of the load test, straight into its PostgreSQL database: counting jobs,
//! and seeding a queue of jobs like a template one (see `seed_queue`).

/// Jobs in the database at `url`.
pub fn count_jobs(url: &str) -> i64 {
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query("SELECT count(*) AS n FROM jobs")
        .get_result::<N>(&mut c)
        .unwrap()
        .n
}

/// Adds `n` queued jobs like job `template` (its pinned image; `sleep run_s`), spread
/// over the users round robin, with their `submitted` history rows: two `INSERT ...
/// SELECT`s and an `ANALYZE` (test setup, documented in
/// docs/src/development/benchmarks.md). Returns how many were added.
pub fn seed_queue(url: &str, template: i64, n: u64, run_s: u64) -> usize {
    seed_queue_of(url, template, n, run_s, false)
}

/// [`seed_queue`], all for the template's user when `one_user`.
pub fn seed_queue_of(url: &str, template: i64, n: u64, run_s: u64, one_user: bool) -> usize {
    use diesel::{Connection, RunQueryDsl};
    let mut c = diesel::PgConnection::establish(url).unwrap();
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let last = |c: &mut diesel::PgConnection| {
        diesel::sql_query("SELECT COALESCE(MAX(id), 0) AS id FROM jobs")
            .get_result::<Id>(c)
            .unwrap()
            .id
    };
    let before = last(&mut c);
    let added = diesel::sql_query(format!(
        "WITH m AS (SELECT user_id, lab_id, row_number() OVER (ORDER BY user_id) - 1 AS k, \
                           count(*) OVER () AS n FROM memberships {who}) \
         INSERT INTO jobs (user_id, lab_id, image, command, env, gpus, gpu_models, \
             min_gpu_memory_mb, cpus, memory_mb, time_limit_s, kind, state, reason, \
             attempts, log_bytes, created_at, image_digest, image_signature) \
         SELECT m.user_id, m.lab_id, t.image, '[\"sleep\",\"{run_s}\"]', t.env, t.gpus, \
             t.gpu_models, t.min_gpu_memory_mb, t.cpus, t.memory_mb, t.time_limit_s, t.kind, \
             'queued', 'waiting for the scheduler', 0, 0, now() AT TIME ZONE 'UTC', \
             t.image_digest, t.image_signature \
         FROM generate_series(0, {n} - 1) AS g(i) \
         JOIN m ON m.k = g.i % m.n \
         JOIN jobs t ON t.id = {template} \
         ORDER BY g.i",
        who = if one_user {
            format!("WHERE user_id = (SELECT user_id FROM jobs WHERE id = {template})")
        } else {
            String::new()
        }
    ))
    .execute(&mut c)
    .unwrap();
    diesel::sql_query(format!(
        "INSERT INTO job_events (job_id, at, state, message) \
         SELECT id, created_at, 'queued', 'submitted (seeded by the load test)' \
         FROM jobs WHERE id > {before}"
    ))
    .execute(&mut c)
    .unwrap();
    // Fresh statistics, as autovacuum keeps them on a campus's database (it would analyze
    // these tables within its naptime; until then the planner believes the 50,000 rows
    // are not there).
    diesel::sql_query("ANALYZE jobs, job_events")
        .execute(&mut c)
        .unwrap();
    added
}
