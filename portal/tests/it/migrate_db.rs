//! `commons-portal admin migrate-db` from a real SQLite file (a campus that ran jobs) to a
//! real PostgreSQL database, and `admin backup` of a running portal's SQLite file.

use crate::support::cluster::portal_binary;
use crate::support::harness::{Backend, TestDb, TestPortal};
use crate::support::load::{connect_agents, job};
use serde_json::{json, Value};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn admin(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(portal_binary())
        .arg("admin")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A campus with history: labs, members, tokens, a node, jobs that ran and one queued,
/// their attempts, events and usage, a lab quota in the audit log.
async fn campus_with_history() -> (TestPortal, Vec<Value>) {
    let p = TestPortal::start(Backend::Sqlite).await;
    let (campus, tasks) = connect_agents(&p.url, vec![p.enrol_token("vision")], 2, 1).await;
    for _ in 0..3 {
        p.submit(&p.alice, job(Some(0.1))).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while campus.finished.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "jobs did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks {
        t.abort();
    }
    // Queued for good: the agent is gone.
    p.submit(&p.bob, job(None)).await;
    let (status, _) = p
        .put_json(
            &p.olga,
            "/api/v1/labs/physics/quota",
            &json!({"max_gpus": 4}),
        )
        .await;
    assert!(status < 300, "quota: {status}");
    // The agents counted their finishes when they sent them; the portal records them a
    // moment later (longer on a busy machine): wait until the API shows all three.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mine = p.get_json(&p.alice, "/api/v1/jobs").await;
        let states: Vec<&str> = mine
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|j| j["state"].as_str())
            .collect();
        if states.len() == 3 && states.iter().all(|s| *s == "succeeded") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alice's three jobs did not all succeed: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let jobs = vec![
        p.get_json(&p.alice, "/api/v1/jobs").await,
        p.get_json(&p.bob, "/api/v1/jobs").await,
    ];
    (p, jobs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_db_moves_a_sqlite_campus_to_postgres_and_refuses_a_full_target() {
    let (p, jobs) = campus_with_history().await;
    let url = p.portal.state.config.database_url.clone();
    // An online backup of the running portal's file, which is then moved.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    let copy_s = copy.display().to_string();
    let (ok, out, err) = admin(&["--database-url", &url, "backup", "--to", &copy_s]);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = admin(&["--database-url", &url, "backup", "--to", &copy_s]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let pg = TestDb::new(Backend::Postgres);
    let (ok, _, err) = admin(&["--database-url", &pg.url, "backup", "--to", "/tmp/x.db"]);
    assert!(!ok && err.contains("pg_dump"), "{err}");

    let from = format!("sqlite://{copy_s}");
    let (ok, out, err) = admin(&["migrate-db", "--from", &from, "--to", &pg.url]);
    assert!(ok, "{out}{err}");
    for table in [
        "jobs",
        "job_attempts",
        "job_events",
        "nodes",
        "gpus",
        "api_tokens",
        "audit_log",
    ] {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(table))
            .unwrap_or_else(|| panic!("{table} not in:\n{out}"));
        let rows: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(rows > 0, "{table} empty:\n{out}");
    }
    assert!(out.contains("copied and verified"), "{out}");

    // The portal on PostgreSQL serves the same campus: the same tokens, the same jobs,
    // and new ids continue after the old ones.
    let (alice, bob) = (p.alice.clone(), p.bob.clone());
    let mut config = p.portal.state.config.as_ref().clone();
    p.stop().await;
    config.database_url = pg.url.clone();
    config.listen = "127.0.0.1:0".into();
    let moved = commons_portal::start(config).await.unwrap();
    let http = reqwest::Client::new();
    let summary = |v: &Value| -> Vec<(i64, String, Option<i64>, i64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|j| {
                (
                    j["id"].as_i64().unwrap(),
                    j["state"].as_str().unwrap().to_string(),
                    j["exit_code"].as_i64(),
                    j["attempts"].as_i64().unwrap_or(0),
                )
            })
            .collect()
    };
    let mut max_id = 0;
    for (token, before) in [(&alice, &jobs[0]), (&bob, &jobs[1])] {
        let after: Value = http
            .get(format!("{}/api/v1/jobs", moved.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(summary(&after), summary(before));
        max_id = max_id.max(summary(before).iter().map(|j| j.0).max().unwrap());
    }
    assert_eq!(summary(&jobs[0]).len(), 3);
    assert!(summary(&jobs[0]).iter().all(|j| j.1 == "succeeded"));
    let new: Value = http
        .post(format!("{}/api/v1/jobs", moved.url()))
        .bearer_auth(&alice)
        .json(&job(None))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(new["id"].as_i64().unwrap() > max_id, "{new}");
    moved.scheduler.abort();
    moved.handle.stop(false).await;

    // Again into the same, now full, database: refused, nothing changed.
    let (ok, _, err) = admin(&["migrate-db", "--from", &from, "--to", &pg.url]);
    assert!(!ok && err.contains("not empty"), "{err}");
    let (ok, _, err) = admin(&["migrate-db", "--from", &pg.url, "--to", &from]);
    assert!(!ok && err.contains("--from must be sqlite"), "{err}");
}
