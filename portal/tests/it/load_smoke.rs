//! The load generator, small: a few simulated agents (the real protocol, no Docker) and
//! a few hundred submissions through the REST API, on both backends, in seconds. The
//! figures in docs/src/reports/performance.md come from the example `load` at full size.

use crate::support::harness::{Backend, TestPortal, BACKENDS};
use crate::support::load::{connect_agents, job, scrape, submit, total};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const JOBS: usize = 300;

async fn smoke(backend: Backend) {
    let p = TestPortal::start(backend).await;
    let tokens = ["vision", "vision", "physics", "physics"]
        .iter()
        .map(|lab| p.enrol_token(lab))
        .collect();
    let (campus, tasks) = connect_agents(&p.url, tokens, 4, 4).await;
    assert!(
        campus.errors.lock().unwrap().is_empty(),
        "{:?}",
        campus.errors
    );
    let users = [p.alice.clone(), p.bob.clone()];
    let s = submit(&p.url, &users, JOBS, 8, job(Some(0.2))).await;
    assert!(
        s.errors.is_empty(),
        "{:?}",
        &s.errors[..s.errors.len().min(5)]
    );
    assert_eq!(s.jobs.len(), JOBS);
    let deadline = Instant::now() + Duration::from_secs(90);
    while campus.finished.load(Ordering::SeqCst) < JOBS as u64 {
        assert!(
            Instant::now() < deadline,
            "{} of {JOBS} jobs finished; {:?}",
            campus.finished.load(Ordering::SeqCst),
            campus.errors.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every job ran once and the portal says it succeeded.
    let m = scrape(&p.url).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut succeeded = total(&m, "commons_jobs{lab=\"vision\",state=\"succeeded\"}")
        + total(&m, "commons_jobs{lab=\"physics\",state=\"succeeded\"}");
    while succeeded < JOBS as f64 {
        assert!(Instant::now() < deadline, "{succeeded} succeeded: {m:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let m = scrape(&p.url).await;
        succeeded = total(&m, "commons_jobs{lab=\"vision\",state=\"succeeded\"}")
            + total(&m, "commons_jobs{lab=\"physics\",state=\"succeeded\"}");
    }
    // Each job started once, but for guests that an owner's jobs preempted (lab A's
    // jobs take back its servers from lab B's), which started once more after a Stop.
    let restarted = campus.restarted.lock().unwrap().clone();
    assert_eq!(
        campus.starts.load(Ordering::SeqCst),
        JOBS as u64 + restarted.len() as u64,
        "restarted: {restarted:?}"
    );
    assert_eq!(campus.stops.load(Ordering::SeqCst), restarted.len() as u64);
    for (j, _) in &restarted {
        let events = p
            .get_json(&p.olga, &format!("/api/v1/jobs/{j}/events"))
            .await;
        assert!(events.to_string().contains("preempting"), "{events}");
    }
    eprintln!(
        "load smoke ({backend:?}): {JOBS} submissions at {:.0}/s, p50 {:?}, p99 {:?}",
        s.per_second(),
        s.latency(0.5),
        s.latency(0.99)
    );
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_smoke_sqlite() {
    smoke(BACKENDS[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_smoke_postgres() {
    smoke(BACKENDS[1]).await;
}
