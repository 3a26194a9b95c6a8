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
//! 5. The scheduler at that queue: tick duration end to end and by phase over
//!    `--tick-s` seconds (from the portal's metrics).
//!
//! ```sh
//! ulimit -n 65536
//! cargo build --release -p commons-portal
//! TEST_DATABASE_URL=postgres://postgres@127.0.0.1:55432/postgres \
//!   cargo run --release -p commons-portal --example load -- --agents 2000 --gpus 8
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test program: a failure is a crash

#[path = "../tests/it/load.rs"]
#[allow(dead_code)]
mod load;

use commons_portal::db::models::Role;
use commons_portal::db::Db;
use load::{connect_agents, job, percentile, scrape, submit, total};
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
    let db = Db::open(&url).unwrap();
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
    let enrol: Vec<String> = (0..agents)
        .map(|a| commons_portal::admin::enrol_token(&db, &slugs[a % labs]).unwrap())
        .collect();
    drop(db);
    println!(
        "seeded {labs} labs, {users} users, {agents} enrolment tokens in {:.1} s",
        began.elapsed().as_secs_f64()
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("portal.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = \"{url}\"\nlisten = \"127.0.0.1:{port}\"\ninsecure_dev_login = true\n"
        ),
    )
    .unwrap();
    let bin =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/commons-portal");
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p commons-portal",
        bin.display()
    );
    let log = std::fs::File::create(dir.path().join("portal.log")).unwrap();
    let child = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
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
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(rest_s)).await;
    let (cpu1, rss) = usage(pid);
    let m1 = scrape(&portal.url).await;
    let wall = t0.elapsed().as_secs_f64();
    let hb = "commons_agent_message_handling_seconds_count{kind=\"heartbeat\"}";
    let hb_sum = "commons_agent_message_handling_seconds_sum{kind=\"heartbeat\"}";
    let beats = total(&m1, hb) - total(&m0, hb);
    let handling = total(&m1, hb_sum) - total(&m0, hb_sum);
    println!(
        "2. at rest: RSS {rss:.0} MiB, CPU {:.1} % of one core, {:.0} heartbeats/s, \
         {:.2} ms handling each (mean, database included), {:.2} ms portal CPU per heartbeat",
        100.0 * (cpu1 - cpu0) / wall,
        beats / wall,
        1000.0 * handling / beats.max(1.0),
        1000.0 * (cpu1 - cpu0) / beats.max(1.0)
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
    let (c0, _) = usage(pid);
    let s = submit(
        &portal.url,
        &user_tokens,
        submissions,
        concurrency,
        job(None),
    )
    .await;
    let (c1, _) = usage(pid);
    println!(
        "4. {} submissions ({} errors), {concurrency} in flight: {:.0}/s, p50 {}, p99 {}, \
         portal CPU {:.0} % of one core",
        s.jobs.len(),
        s.errors.len(),
        s.per_second(),
        ms(s.latency(0.5)),
        ms(s.latency(0.99)),
        100.0 * (c1 - c0) / s.elapsed.as_secs_f64()
    );
    if let Some(e) = s.errors.first() {
        println!("   first error: {e}");
    }

    // 5. The scheduler at that queue.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m0 = scrape(&portal.url).await;
    tokio::time::sleep(Duration::from_secs(tick_s)).await;
    let m1 = scrape(&portal.url).await;
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
    println!(
        "5. scheduler with {:.0} queued and {} started on {} GPUs: {ticks:.0} ticks in {tick_s} s, \
         {:.0} ms each (read {:.0}, plan {:.0}, commit {:.0}, send {:.0})",
        total(&m1, "commons_queue_jobs"),
        campus.starts.load(Ordering::SeqCst),
        agents as u64 * u64::from(gpus),
        mean("commons_scheduler_tick_duration_seconds"),
        phase("read"),
        phase("plan"),
        phase("commit"),
        phase("send"),
    );
    let (_, rss) = usage(pid);
    println!("   portal RSS {rss:.0} MiB at the end");
    drop(portal);
    {
        use diesel::{Connection, RunQueryDsl};
        let mut c = diesel::PgConnection::establish(&admin).unwrap();
        let _ = diesel::sql_query(format!("DROP DATABASE {name} WITH (FORCE)")).execute(&mut c);
    }
}
