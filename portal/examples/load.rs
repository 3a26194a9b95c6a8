//! The load test: a real portal process (`commons-portal serve`, release build) on a fresh
//! PostgreSQL database, N simulated agents over the real agent protocol (enrolment,
//! WebSocket, heartbeats, attempt events; fake GPUs, no Docker) and M users submitting
//! through the REST API, all from this one process on the same machine.
//!
//! Phases, each printed as it ends:
//! 1. Connect: every agent enrols and says `Hello`.
//! 2. At rest: the portal's RSS and CPU over `--rest-s` seconds with only heartbeats,
//!    and the heartbeat handling time (from the portal's own metrics).
//! 3. Idle campus: `--idle-jobs` jobs one after another; time from the submission
//!    being sent to the agent receiving `Start` (p50/p99).
//! 4. Sustained submissions: `--submissions` jobs, `--concurrency` in flight, spread over
//!    `--users` users; jobs that never end, so the queue grows once the GPUs are full.
//!    With `--rate R`, R a second (open loop, latency counted from when each was due);
//!    without, as fast as the portal answers (closed loop).
//! 5. The scheduler at that queue: tick duration end to end and by phase over
//!    `--tick-s` seconds (from the portal's metrics). With `--seed-queued N`, N more
//!    queued jobs are added first as test setup, straight into the database (see
//!    [`seed_queue`]): the figure measured is the scheduler's round, not the submission
//!    path, and filling 50,000 jobs through the API would take minutes.
//!
//! 6. With `--compare-array N`: the scheduler's round with N single jobs queued (seeded as
//!    above), then, those cancelled, with one array of N tasks queued (submitted through
//!    the API, its acceptance timed), and with `--array-throttle T` also one of N tasks
//!    at most T at once: side by side in one run (see `compare.rs`).
//!
//! ```sh
//! ulimit -n 65536
//! cargo build --release -p commons-portal
//! TEST_DATABASE_URL=postgres://postgres@127.0.0.1:55432/postgres \
//!   cargo run --release -p commons-portal --example load -- --agents 2000 --gpus 8
//! # the scheduler's round at 1,000 nodes x 8 GPUs and 50,000 queued jobs:
//! TEST_DATABASE_URL=... cargo run --release -p commons-portal --example load -- \
//!   --agents 1000 --gpus 8 --idle-jobs 0 --submissions 0 --seed-queued 50000 --seed-run-s 30
//! # a 10,000-task array against 10,000 single jobs, on a full campus:
//! TEST_DATABASE_URL=... cargo run -p commons-portal --example load -- --agents 50 \
//!   --gpus 8 --idle-jobs 0 --submissions 0 --compare-array 10000 --array-throttle 100 \
//!   --seed-run-s 3600
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test program: a failure is a crash

#[path = "load/compare.rs"]
mod compare;
#[path = "../tests/it/support/load.rs"]
#[allow(dead_code)]
mod load;
#[path = "load/seed.rs"]
mod seed;

use commons_portal::db::models::Role;
use commons_portal::db::Db;
use load::{connect_agents, job, percentile, scrape, submit, submit_at, total};
use seed::{count_jobs, seed_queue, seed_queue_of};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

/// (user + system CPU seconds, resident MiB) of a process.
fn usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = 100.0; // CLK_TCK on Linux
    let cpu = (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    (cpu, rss_kb / 1024.0)
}

/// CPU seconds used so far by the PostgreSQL backends serving database `name` (those
/// alive now: the portal's pooled connections).
fn db_cpu(name: &str) -> f64 {
    let mut cpu = 0.0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read_to_string(e.path().join("cmdline")) else {
            continue;
        };
        if cmd.starts_with("postgres: ") && cmd.split_whitespace().any(|w| w == name) {
            let pid: u32 = e.file_name().to_string_lossy().parse().unwrap_or(0);
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                let after = &stat[stat.rfind(')').unwrap() + 2..];
                let f: Vec<&str> = after.split_whitespace().collect();
                cpu += (f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0))
                    / 100.0;
            }
        }
    }
    cpu
}

struct Portal {
    child: Child,
    url: String,
}

impl Drop for Portal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let agents = arg("--agents", 100) as usize;
    let gpus = arg("--gpus", 8) as u32;
    let users = arg("--users", 50).max(1) as usize;
    let labs = arg("--labs", 20).max(1) as usize;
    let submissions = arg("--submissions", 20_000) as usize;
    let concurrency = arg("--concurrency", 32) as usize;
    let idle_jobs = arg("--idle-jobs", 200) as usize;
    let rest_s = arg("--rest-s", 30);
    let tick_s = arg("--tick-s", 30);
    let seed_queued = arg("--seed-queued", 0);
    let seed_run_s = arg("--seed-run-s", 30);
    let compare = arg("--compare-array", 0);
    let throttle = arg("--array-throttle", 0);
    // Submissions a second in phase 4 (open loop); 0: as fast as `--concurrency` allows.
    let rate = Some(arg("--rate", 0) as f64).filter(|r| *r > 0.0);
    let admin = std::env::var("TEST_DATABASE_URL")
        .expect("set TEST_DATABASE_URL=postgres://USER@HOST:PORT/postgres");
    let name = format!("commons_load_{:08x}", rand::random::<u32>());
    {
        use diesel::{Connection, RunQueryDsl};
        let mut c = diesel::PgConnection::establish(&admin).unwrap();
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .unwrap();
    }
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    let url = format!("{base}/{name}");

    // Seed labs, users and tokens through the portal's own operator functions.
    let began = Instant::now();
    let db = Db::open_with(&url, commons_portal::config::DEFAULT_DATABASE_POOL_SIZE).unwrap();
    let slugs: Vec<String> = (0..labs).map(|l| format!("lab{l}")).collect();
    for s in &slugs {
        commons_portal::admin::create_lab(&db, s, s).unwrap();
    }
    let mut user_tokens = Vec::new();
    for u in 0..users {
        let username = format!("user{u}");
        commons_portal::admin::create_user(
            &db,
            &username,
            &format!("{username}@campus.test"),
            Some(&slugs[u % labs]),
            Role::Member,
            false,
        )
        .unwrap();
        user_tokens.push(commons_portal::admin::api_token(&db, &username).unwrap());
    }
    // The simulated agents run no image: a campus-wide entry with a made-up digest.
    db.run_blocking(|c| {
        commons_portal::db::images::insert(
            c,
            &commons_portal::db::images::NewEntry {
                lab_id: None,
                name_tag: "commons-demo:latest",
                digest: "sha256:10ad",
                description: "load test",
                signature: None,
                signed_by: None,
                created_by: "load",
            },
        )
    })
    .unwrap();
    let enrol: Vec<String> = (0..agents)
        .map(|a| commons_portal::admin::enrol_token(&db, &slugs[a % labs]).unwrap())
        .collect();
    // LOAD_DB_SQL runs on the fresh database before the portal starts, e.g. to measure
    // without the change log's triggers:
    // "ALTER TABLE jobs DISABLE TRIGGER USER; ALTER TABLE job_attempts DISABLE TRIGGER USER"
    if let Ok(sql) = std::env::var("LOAD_DB_SQL") {
        use diesel::connection::SimpleConnection;
        db.run_blocking(move |c| {
            match c {
                commons_portal::db::DbConn::Pg(c) => c.batch_execute(&sql),
                commons_portal::db::DbConn::Sqlite(c) => c.batch_execute(&sql),
            }
            .map_err(commons_portal::db::DbError::from)
        })
        .unwrap();
    }
    drop(db);
    println!(
        "created {labs} labs, {users} users, {agents} enrolment tokens in {:.1} s",
        began.elapsed().as_secs_f64()
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("portal.toml");
    // LOAD_PORTAL_TOML adds to the portal's configuration (after its top-level keys), e.g.
    // "[scheduler]\nincremental_world = false" to measure a full read every round.
    let extra = std::env::var("LOAD_PORTAL_TOML").unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "database_url = \"{url}\"\nlisten = \"127.0.0.1:{port}\"\ninsecure_dev_login = true\n\
             {extra}\n"
        ),
    )
    .unwrap();
    // Another build of the portal may be measured with the same generator (side by side).
    let bin = std::env::var_os("COMMONS_PORTAL_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/release/commons-portal")
        });
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p commons-portal",
        bin.display()
    );
    // LOAD_PORTAL_LOG=FILE keeps the portal's log (and LOAD_PORTAL_RUST_LOG its filter).
    let log_path = std::env::var_os("LOAD_PORTAL_LOG")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("portal.log"));
    let log = std::fs::File::create(log_path).unwrap();
    let child = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(&config)
        .env(
            "RUST_LOG",
            std::env::var("LOAD_PORTAL_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let portal = Portal {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{}/healthz", portal.url))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the portal did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, rss_empty) = usage(pid);
    println!("portal pid {pid} on PostgreSQL, RSS {rss_empty:.0} MiB before any agent");

    // 1. Connect.
    let began = Instant::now();
    let (campus, _tasks) = connect_agents(&portal.url, enrol, gpus, 64).await;
    let errors = campus.errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "{} agents failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let m = scrape(&portal.url).await;
        if total(&m, "commons_agents_connected") as usize >= agents {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the portal does not see every agent"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "1. {agents} agents x {gpus} GPUs connected in {:.1} s",
        began.elapsed().as_secs_f64()
    );

    // 2. At rest.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m0 = scrape(&portal.url).await;
    let (cpu0, _) = usage(pid);
    let db0 = db_cpu(&name);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(rest_s)).await;
    let (cpu1, rss) = usage(pid);
    let db1 = db_cpu(&name);
    let m1 = scrape(&portal.url).await;
    let wall = t0.elapsed().as_secs_f64();
    let hb = "commons_agent_message_handling_seconds_count{kind=\"heartbeat\"}";
    let hb_sum = "commons_agent_message_handling_seconds_sum{kind=\"heartbeat\"}";
    let beats = total(&m1, hb) - total(&m0, hb);
    let handling = total(&m1, hb_sum) - total(&m0, hb_sum);
    println!(
        "2. at rest: RSS {rss:.0} MiB, CPU {:.1} % of one core (PostgreSQL {:.1} %), \
         {:.0} heartbeats/s, {:.2} ms handling each (mean, database included), \
         {:.2} ms portal CPU per heartbeat, {:.1} statements per heartbeat",
        100.0 * (cpu1 - cpu0) / wall,
        100.0 * (db1 - db0) / wall,
        beats / wall,
        1000.0 * handling / beats.max(1.0),
        1000.0 * (cpu1 - cpu0) / beats.max(1.0),
        (total(&m1, "commons_db_statements_total") - total(&m0, "commons_db_statements_total"))
            / beats.max(1.0),
    );

    // 3. Idle campus: submission to Start.
    let http = reqwest::Client::new();
    let mut waits = Vec::new();
    for i in 0..idle_jobs {
        let sent = Instant::now();
        let r: serde_json::Value = http
            .post(format!("{}/api/v1/jobs", portal.url))
            .bearer_auth(&user_tokens[i % users])
            .json(&job(Some(1.0)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = r["id"].as_i64().unwrap_or_else(|| panic!("{r}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(at) = campus.started_at.lock().unwrap().get(&id) {
                waits.push(at.duration_since(sent));
                break;
            }
            assert!(Instant::now() < deadline, "job {id} did not start");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    if idle_jobs > 0 {
        println!(
            "3. idle campus, {idle_jobs} jobs one by one: submission to Start p50 {}, p99 {}",
            ms(percentile(waits.clone(), 0.5)),
            ms(percentile(waits, 0.99))
        );
    }

    // 4. Sustained submissions (jobs that hold their GPUs).
    if submissions > 0 {
        sustained(
            &portal.url,
            &user_tokens,
            submissions,
            concurrency,
            rate,
            pid,
            &url,
        )
        .await;
    }
    if seed_queued > 0 {
        let template = submit(
            &portal.url,
            &user_tokens[..1],
            1,
            1,
            job(Some(seed_run_s as f64)),
        )
        .await;
        let template = template
            .jobs
            .first()
            .expect("the template job was refused")
            .0;
        let began = Instant::now();
        let n = seed_queue(&url, template, seed_queued, seed_run_s);
        println!(
            "   seeded {n} queued jobs of {seed_run_s} s in {:.1} s (test setup, straight into the database)",
            began.elapsed().as_secs_f64()
        );
    }
    if compare > 0 {
        let c = compare::Compare {
            url: &portal.url,
            db_url: &url,
            token: &user_tokens[0],
            n: compare,
            throttle,
            run_s: seed_run_s,
            tick_s,
        };
        compare::compare_array(&c, &campus, agents, gpus).await;
    } else {
        scheduler_figures(&portal.url, tick_s, &campus, agents, gpus).await;
    }
    let (_, rss) = usage(pid);
    println!("   portal RSS {rss:.0} MiB at the end");
    drop(portal);
    {
        use diesel::{Connection, RunQueryDsl};
        let mut c = diesel::PgConnection::establish(&admin).unwrap();
        let _ = diesel::sql_query(format!("DROP DATABASE {name} WITH (FORCE)")).execute(&mut c);
    }
}

/// Phase 4: `total` submissions, `concurrency` in flight.
async fn sustained(
    url: &str,
    user_tokens: &[String],
    submissions: usize,
    concurrency: usize,
    rate: Option<f64>,
    pid: u32,
    db_url: &str,
) {
    let db = db_url.rsplit('/').next().unwrap_or(db_url);
    let jobs_before = count_jobs(db_url);
    let (c0, _) = usage(pid);
    let db0 = db_cpu(db);
    let m0 = scrape(url).await;
    let s = submit_at(url, user_tokens, submissions, concurrency, job(None), rate).await;
    let m1 = scrape(url).await;
    let (c1, _) = usage(pid);
    let db1 = db_cpu(db);
    println!(
        "4. {} submissions ({} errors), {} {concurrency} in flight: {:.0}/s, p50 {}, p99 {}, \
         portal CPU {:.0} % of one core, PostgreSQL {:.0} %",
        s.jobs.len(),
        s.errors.len(),
        rate.map_or("closed loop,".to_string(), |r| format!(
            "offered {r:.0}/s, at most"
        )),
        s.per_second(),
        ms(s.latency(0.5)),
        ms(s.latency(0.99)),
        100.0 * (c1 - c0) / s.elapsed.as_secs_f64(),
        100.0 * (db1 - db0) / s.elapsed.as_secs_f64(),
    );
    if let Some(e) = s.errors.first() {
        println!("   first error: {e}");
    }
    // Nothing accepted is lost, and nothing refused or failed in flight was stored.
    let stored = count_jobs(db_url) - jobs_before;
    println!(
        "   jobs stored: {stored} for {} accepted{}",
        s.jobs.len(),
        if stored == s.jobs.len() as i64 {
            ""
        } else {
            " (MISMATCH)"
        }
    );
    println!("   p99 by 10-s window of sending: {}", by_window(&s));
    let d = |k: &str| total(&m1, k) - total(&m0, k);
    let route = "method=\"POST\",route=\"/api/v1/jobs\",status=\"201\"";
    let n = d(&format!(
        "commons_http_request_duration_seconds_count{{{route}}}"
    ));
    let waits = d("commons_db_pool_wait_seconds_count");
    let secs = s.elapsed.as_secs_f64();
    let busy = |k: &str| d(k) / secs;
    println!(
        "   busy seconds a second: submissions {:.2}, heartbeats {:.2}, attempt events {:.2}, \
         scheduler {:.2}; {:.0} statements a second",
        busy(&format!(
            "commons_http_request_duration_seconds_sum{{{route}}}"
        )),
        busy("commons_agent_message_handling_seconds_sum{kind=\"heartbeat\"}"),
        busy("commons_agent_message_handling_seconds_sum{kind=\"attempt_event\"}"),
        busy("commons_scheduler_tick_duration_seconds_sum"),
        busy("commons_db_statements_total"),
    );
    println!(
        "   in the portal: {:.1} ms per submission (mean, handler), database pool wait {:.2} ms \
         mean over {waits:.0} uses, {:.0} agent messages/s, {:.0} ticks ({:.0} ms each)",
        1000.0
            * d(&format!(
                "commons_http_request_duration_seconds_sum{{{route}}}"
            ))
            / n.max(1.0),
        1000.0 * d("commons_db_pool_wait_seconds_sum") / waits.max(1.0),
        d("commons_agent_message_handling_seconds_count") / s.elapsed.as_secs_f64(),
        d("commons_scheduler_tick_duration_seconds_count"),
        1000.0 * d("commons_scheduler_tick_duration_seconds_sum")
            / d("commons_scheduler_tick_duration_seconds_count").max(1.0),
    );
}

/// Phase 5: the scheduler's rounds over `tick_s` seconds.
async fn scheduler_figures(
    url: &str,
    tick_s: u64,
    campus: &load::Campus,
    agents: usize,
    gpus: u32,
) {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m0 = scrape(url).await;
    let starts0 = campus.starts.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(tick_s)).await;
    let m1 = scrape(url).await;
    let d = |k: &str| total(&m1, k) - total(&m0, k);
    let ticks = d("commons_scheduler_tick_duration_seconds_count");
    let mean = |k: &str| 1000.0 * d(&format!("{k}_sum")) / ticks.max(1.0);
    let phase = |p: &str| {
        1000.0
            * d(&format!(
                "commons_scheduler_tick_phase_duration_seconds_sum{{phase=\"{p}\"}}"
            ))
            / d(&format!(
                "commons_scheduler_tick_phase_duration_seconds_count{{phase=\"{p}\"}}"
            ))
            .max(1.0)
    };
    let started = campus.starts.load(Ordering::SeqCst);
    let p99 = bucket_quantile(&m0, &m1, "commons_scheduler_tick_duration_seconds", 0.99);
    println!(
        "5. scheduler with {:.0} queued and {started} started on {} GPUs ({} in the window): \
         {ticks:.0} ticks in {tick_s} s, {:.0} ms each with the waiting jobs' rows \
         (read {:.0}, plan {:.0}, commit {:.0}, send {:.0}; round {:.0}; waiting rows {:.0})",
        total(&m1, "commons_queue_jobs"),
        agents as u64 * u64::from(gpus),
        started - starts0,
        mean("commons_scheduler_tick_duration_seconds"),
        phase("read"),
        phase("plan"),
        phase("commit"),
        phase("send"),
        phase("read") + phase("plan") + phase("commit") + phase("send"),
        phase("waiting"),
    );
    println!(
        "   {:.0} starts a tick; 99 % of ticks took at most {}",
        (started - starts0) as f64 / ticks.max(1.0),
        p99.map_or("?".into(), |s| format!("{:.0} ms", s * 1000.0)),
    );
    println!(
        "   the read: waiting for a connection {:.0} ms, judging leases and waits {:.0}, the \
         world {:.0}, the snapshot built {:.0}, its metrics {:.0}; the commit waiting for a \
         connection {:.0}",
        phase("read_wait"),
        phase("read_judge"),
        phase("read_world"),
        phase("read_build"),
        phase("read_observe"),
        phase("commit_wait"),
    );
    let events = d("commons_agent_message_handling_seconds_count{kind=\"attempt_event\"}");
    println!(
        "   {:.0} statements a second; {:.0} attempt events a second, {:.2} ms handling each \
         (mean, database included)",
        d("commons_db_statements_total") / tick_s as f64,
        events / tick_s as f64,
        1000.0 * d("commons_agent_message_handling_seconds_sum{kind=\"attempt_event\"}")
            / events.max(1.0),
    );
    let updates = |kind: &str| {
        d(&format!(
            "commons_scheduler_world_updates_total{{kind=\"{kind}\"}}"
        ))
    };
    println!(
        "   the world: {:.0} changes taken in a tick (mean); updates by changes {:.0}, \
         full reads {:.0}, checks {:.0}; mismatches {:.0}",
        d("commons_scheduler_world_changes_total") / updates("changes").max(1.0),
        updates("changes"),
        updates("full"),
        updates("check"),
        d("commons_scheduler_world_mismatches_total"),
    );
}

/// The upper bound of the histogram bucket holding the `q` quantile of what `name`
/// observed between two scrapes.
fn bucket_quantile(
    m0: &std::collections::BTreeMap<String, f64>,
    m1: &std::collections::BTreeMap<String, f64>,
    name: &str,
    q: f64,
) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = m1
        .iter()
        .filter_map(|(k, v)| {
            let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, v - m0.get(k).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    buckets
        .into_iter()
        .find(|(_, n)| *n >= q * total && total > 0.0)
        .map(|(le, _)| le)
}

/// The p99 latency of the submissions sent in each 10-s window, in order: where a tail
/// comes from (a burst at the start, a slow round, a checkpoint of the database).
fn by_window(s: &load::Submitted) -> String {
    let Some(first) = s.jobs.iter().map(|j| j.1).min() else {
        return "-".into();
    };
    let mut windows: Vec<Vec<Duration>> = Vec::new();
    for &(_, sent, took) in &s.jobs {
        let w = (sent - first).as_secs() as usize / 10;
        if windows.len() <= w {
            windows.resize(w + 1, Vec::new());
        }
        windows[w].push(took);
    }
    windows
        .into_iter()
        .map(|w| format!("{:.0}", percentile(w, 0.99).as_secs_f64() * 1000.0))
        .collect::<Vec<_>>()
        .join(", ")
        + " ms"
}
