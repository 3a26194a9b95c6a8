//! Issue 28's figures for the book (docs/src/reports/performance.md): measurements, not
//! checks, so every test here is ignored. Each prints its figure beside what it is
//! compared with, both measured in the same run on the same machine. Run one at a time in
//! a release build, for instance
//! `cargo test -p commons-portal --test it --release -- --ignored upload_throughput --nocapture`.
//! (`staging_throughput` lives beside the staging tests in `files_inputs.rs`.)

use crate::support::files::{self as f, put};
use crate::support::harness::{Backend, TestPortal};
use bytes::Bytes;
use object_store::ObjectStoreExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// PUT `data` at `path` of alice's space; the seconds it took.
async fn timed_put(p: &TestPortal, path: &str, data: Bytes) -> f64 {
    let t = Instant::now();
    let r = p
        .http
        .put(f::url(p, "/api/v1/files", path))
        .bearer_auth(&p.alice)
        .body(data)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 201, "{path}: {body}");
    t.elapsed().as_secs_f64()
}

/// An upload through the portal (`PUT /api/v1/files/PATH`, 256 MB, over loopback HTTP:
/// the portal counts the quota, hashes and writes to the store as bytes arrive) against
/// writing the same bytes with `object_store`'s `put` to the same local store. Best of 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check"]
async fn upload_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |c| c.user_quota_gb = 10.0).await;
    p.portal.scheduler.abort();
    let size = 256 << 20;
    let data = Bytes::from(f::noise(size, 5));
    let store = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let mut best = (f64::MAX, f64::MAX, f64::MAX);
    for round in 0..3 {
        let portal = timed_put(&p, &format!("up/{round}.bin"), data.clone()).await;
        best.0 = best.0.min(portal);
        let key = object_store::path::Path::from(format!("direct/{round}.bin"));
        let t = Instant::now();
        store.put(&key, data.clone().into()).await.unwrap();
        let direct = t.elapsed().as_secs_f64();
        best.1 = best.1.min(direct);
        // The least a store of files with their digests does: hash, then write.
        let key = object_store::path::Path::from(format!("hashed/{round}.bin"));
        let t = Instant::now();
        let digest = f::sha256(&data);
        store.put(&key, data.clone().into()).await.unwrap();
        let hashed = t.elapsed().as_secs_f64();
        assert_eq!(digest.len(), 64);
        best.2 = best.2.min(hashed);
        println!(
            "round {round}: through the portal {portal:.3} s, direct {direct:.3} s, \
             direct with SHA-256 {hashed:.3} s"
        );
    }
    let mb = size as f64 / 1e6;
    println!(
        "upload {:.0} MB/s, direct {:.0} MB/s (ratio {:.2}), direct with SHA-256 {:.0} MB/s \
         (ratio {:.2})",
        mb / best.0,
        mb / best.1,
        best.1 / best.0,
        mb / best.2,
        best.2 / best.0
    );
    p.stop().await;
}

/// The latencies (ms) of `n` small requests, one after another: a GET of a 1 KiB file
/// and a listing of 20 files, alternately.
async fn small_requests(p: &TestPortal, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        if i % 2 == 0 {
            let (s, _, body) = f::get(p, &p.alice, "/api/v1/files", "small/3.txt", None).await;
            assert_eq!((s, body.len()), (200, 1024));
        } else {
            let a = f::list(p, &p.alice, "/api/v1/files", "small/").await;
            assert_eq!(a.status, 200, "{a}");
        }
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out.sort_by(f64::total_cmp);
    out
}

/// The `q` quantile of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

fn summary(v: &[f64]) -> String {
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        quantile(v, 0.5),
        quantile(v, 0.99),
        v[v.len() - 1]
    )
}

/// Eight clients that upload 32 MB again and again until `stop`; the bytes they sent.
fn uploaders(p: &TestPortal, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<u64>> {
    let data = Bytes::from(f::noise(32 << 20, 11));
    (0..8)
        .map(|i| {
            let (http, url, token) = (
                p.http.clone(),
                f::url(p, "/api/v1/files", &format!("load/{i}.bin")),
                p.alice.clone(),
            );
            let (data, stop) = (data.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sent = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = http.put(&url).bearer_auth(&token).body(data.clone());
                    let s = r.send().await.unwrap().status().as_u16();
                    assert!(s == 200 || s == 201, "an upload under load: {s}");
                    sent += data.len() as u64;
                }
                sent
            })
        })
        .collect()
}

/// The files API's small requests (a 1 KiB GET, a listing) while 8 clients upload at
/// once, against the same requests with no uploads. Portal, clients and uploaders share
/// this test's process (4 worker threads on the 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check"]
async fn files_api_latency_under_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |c| c.user_quota_gb = 10.0).await;
    p.portal.scheduler.abort();
    for n in 0..20 {
        let a = put(
            &p,
            &p.alice,
            "/api/v1/files",
            &format!("small/{n}.txt"),
            &[b'x'; 1024],
        )
        .await;
        assert_eq!(a.status, 201, "{a}");
    }
    let n = 600;
    small_requests(&p, 50).await;
    let idle = small_requests(&p, n).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = uploaders(&p, &stop);
    let t = Instant::now();
    let busy = small_requests(&p, n).await;
    stop.store(true, Ordering::Relaxed);
    let secs = t.elapsed().as_secs_f64();
    let mut sent = 0;
    for l in load {
        sent += l.await.unwrap();
    }
    println!("{n} small requests, no uploads: {}", summary(&idle));
    println!(
        "{n} small requests, 8 uploads ({:.0} MB/s in all while measured): {}",
        sent as f64 / 1e6 / secs,
        summary(&busy)
    );
    println!(
        "p99 under uploads / p99 idle: {:.2}",
        quantile(&busy, 0.99) / quantile(&idle, 0.99)
    );
    p.stop().await;
}

/// Submits a `true` job naming `datasets` as alice; the seconds until it succeeded.
async fn job_seconds(p: &TestPortal, datasets: Value) -> f64 {
    let job = json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1,
                     "time_limit_minutes": 10, "datasets": datasets});
    let t = Instant::now();
    let id = p.submit(&p.alice, job).await;
    let states = ["succeeded", "failed", "cancelled"];
    let done = p
        .wait_state(&p.alice, id, &states, Duration::from_secs(600))
        .await;
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(
        done["state"],
        "succeeded",
        "{done}\n{}",
        p.logs(&p.alice, id).await
    );
    secs
}

/// Uploads `mb` MB into lab vision's `sets/NAME/` (4 files) and registers it as dataset
/// NAME: the `datasets` field of a job that mounts it.
async fn lab_dataset(p: &TestPortal, name: &str, mb: usize, seed: u64) -> Value {
    for part in 0..4u64 {
        let data = f::noise(mb * 1_000_000 / 4, seed * 10 + part);
        let path = format!("sets/{name}/part{part}.bin");
        let a = put(p, &p.carol, "/api/v1/labs/vision/files", &path, &data).await;
        assert_eq!(a.status, 201, "{a}");
    }
    let body = json!({"name": name, "source": format!("lab:sets/{name}/"),
                      "description": "bench", "visibility": "lab"});
    let (s, v) = p
        .post_json(&p.carol, "/api/v1/labs/vision/datasets", &body)
        .await;
    assert_eq!(s, 201, "{v}");
    json!([{"lab": "vision", "name": name}])
}

/// A job's start, submitted to succeeded (`true`), with a 500 MB `lab:` dataset already
/// in the server's cache against the same job whose dataset is not yet there (a fresh
/// dataset each round), and against a job with no dataset. Best of 3; one in-process
/// agent with the real Docker Engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check"]
async fn dataset_start_cached_against_cold() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |c| c.lab_quota_gb = 10.0).await;
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let mb = std::env::var("COMMONS_BENCH_DATASET_MB").map_or(500, |v| v.parse().unwrap());
    job_seconds(&p, json!([])).await;
    let mut best = (f64::MAX, f64::MAX, f64::MAX);
    for round in 0..3 {
        let ds = lab_dataset(&p, &format!("bench{round}"), mb, round + 1).await;
        let cold = job_seconds(&p, ds.clone()).await;
        let cached = job_seconds(&p, ds).await;
        let none = job_seconds(&p, json!([])).await;
        println!("round {round}: cold {cold:.2} s, cached {cached:.2} s, no dataset {none:.2} s");
        best = (best.0.min(cold), best.1.min(cached), best.2.min(none));
    }
    println!(
        "{mb} MB dataset: cold {:.2} s, cached {:.2} s (no dataset {:.2} s); cold / cached {:.2}",
        best.0,
        best.1,
        best.2,
        best.0 / best.1
    );
    p.stop().await;
}

/// Sends `gb` GB (a 64 MiB piece of noise repeated) into alice's `path`, streamed with no
/// length, so that neither this process nor the portal holds it.
async fn put_large(p: &TestPortal, path: &str, gb: u64) -> f64 {
    let piece = Bytes::from(f::noise(64 << 20, 3));
    let pieces = (gb * 1_000_000_000).div_ceil(piece.len() as u64);
    let stream = futures_util::stream::iter(
        (0..pieces).map(move |_| Ok::<Bytes, std::io::Error>(piece.clone())),
    );
    let t = Instant::now();
    let r = p
        .http
        .put(f::url(p, "/api/v1/files", path))
        .bearer_auth(&p.alice)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 201, "{body}");
    t.elapsed().as_secs_f64()
}

/// `VmHWM` (the peak resident set) or `VmRSS` of process `pid`, in MB.
fn memory_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    kb * 1024.0 / 1e6
}

/// The `commons-agent` binary as its own process (on this machine's network, not in a
/// namespace), enrolled in lab vision of `p`, logging into its state dir.
fn agent_process(p: &TestPortal, state: &std::path::Path) -> std::process::Child {
    crate::support::harness::demo_image();
    let log = std::fs::File::create(state.join("agent.log")).unwrap();
    std::process::Command::new(crate::cluster::agent_binary())
        .args(["run", "--portal", &p.url, "--state-dir"])
        .arg(state)
        .arg("--host-id-file")
        .arg(state.join("host-id"))
        .args(["--gpus", "fake:1xA100-80GB", "--name", "bench-agent"])
        .args(["--min-free-disk", "0%", "--job-disk", "watch"])
        .env("COMMONS_ENROL_TOKEN", p.enrol_token("vision"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The agent's memory while it stages one large input (10 GB unless
/// `COMMONS_BENCH_STAGE_GB` says otherwise): the `commons-agent` process's peak resident
/// set (`VmHWM`) before the job and after it, its resident set sampled while it stages,
/// and the input's size beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check"]
async fn agent_memory_while_staging() {
    let gb: u64 = std::env::var("COMMONS_BENCH_STAGE_GB").map_or(10, |v| v.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), move |c| {
        c.user_quota_gb = gb as f64 + 5.0
    })
    .await;
    let up = put_large(&p, "large.bin", gb).await;
    println!(
        "uploaded {gb} GB in {up:.1} s ({:.0} MB/s)",
        gb as f64 * 1e3 / up
    );
    let state = tempfile::tempdir().unwrap();
    let mut agent = agent_process(&p, state.path());
    let pid = agent.id();
    p.wait_online("vision", 1).await;
    let before = memory_mb(pid, "VmHWM:");
    let job = json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1,
                     "time_limit_minutes": 10, "inputs": ["large.bin"]});
    let t = Instant::now();
    let id = p.submit(&p.alice, job).await;
    let mut sampled: f64 = 0.0;
    let done = loop {
        sampled = sampled.max(memory_mb(pid, "VmRSS:"));
        let j = p.job(&p.alice, id).await;
        if ["succeeded", "failed", "cancelled"]
            .iter()
            .any(|s| j["state"] == *s)
        {
            break j;
        }
        assert!(t.elapsed() < Duration::from_secs(1800), "still {j}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let secs = t.elapsed().as_secs_f64();
    let peak = memory_mb(pid, "VmHWM:");
    let log = p.logs(&p.alice, id).await;
    let _ = agent.kill();
    let _ = agent.wait();
    crate::cluster::remove_containers(&[id]);
    assert_eq!(done["state"], "succeeded", "{done}\n{log}");
    let staged = log
        .lines()
        .find(|l| l.contains("staged 1 input files"))
        .unwrap_or("");
    println!("{staged}");
    println!(
        "agent peak RSS {peak:.0} MB (before the job {before:.0} MB, largest sample while \
         staging {sampled:.0} MB) for a {gb} GB input; job submitted to succeeded in {secs:.1} s; \
         peak / input {:.4}",
        peak / (gb as f64 * 1e3)
    );
    p.stop().await;
}
