//! A job's start against `docker run`, measured side by side in one run on one machine
//! (issue 33's third part: a start stays at or below `docker run --rm` of the same image).
//!
//! The portal and an agent as separate processes (the agent on a network-namespace host,
//! as in the integration tests' `cluster`), the real Docker Engine, one fake GPU. Each run,
//! alternating:
//!
//! - through GPU Commons: one client submits `sh -c true` (the demo image, one GPU) and
//!   polls the job every 10 ms until it is `succeeded`; the time from the submission's
//!   request to the first answer that says so;
//! - directly: `docker run --rm commons-demo:latest sh -c true` (the CLI's whole run).
//!
//! ```sh
//! cargo run --release -p commons-portal --example start_figures -- --runs 15 [--host 241]
//! ```
//! Needs root (network namespaces), Docker, the demo image (built if missing). Prints both
//! medians (and the quartiles) and the ratio.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a measuring program: a failure is a crash

#[path = "../tests/it/support/cluster.rs"]
#[allow(dead_code)] // the tests' helpers; this program uses some of them
mod cluster;

use cluster::{remove_containers, AgentProcess, Api, Host, PortalOpts, PortalProcess};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

/// The sorted sample's value at quantile `q`.
fn quantile(v: &[Duration], q: f64) -> Duration {
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

/// Submits `sh -c true` and polls every 10 ms until it succeeded: the time it took.
async fn through_commons(api: &Api, http: &reqwest::Client) -> (i64, Duration) {
    let t = Instant::now();
    let job = api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", "true"],
                       "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    let url = format!("{}/api/v1/jobs/{job}", api.url);
    loop {
        let j: serde_json::Value = http
            .get(&url)
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match j["state"].as_str() {
            Some("succeeded") => return (job, t.elapsed()),
            Some("failed" | "cancelled") => panic!("job {job} ended otherwise: {j}"),
            _ => {}
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "job {job} did not succeed: {j}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn docker_run() -> Duration {
    let t = Instant::now();
    let out = Command::new("docker")
        .args(["run", "--rm", "commons-demo:latest", "sh", "-c", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

#[tokio::main]
async fn main() {
    let runs = arg("--runs", 15).max(1);
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        lease_ttl_s: 30,
        margin_s: 10,
        ..Default::default()
    });
    let api = Api::new(portal.url(), alice);
    let host = Host::new(arg("--host", 241) as u8);
    let _agent = AgentProcess::start(&host, &portal, "start-figures-1", "fake:1xA100-80GB");
    api.wait_online(1, Duration::from_secs(60)).await;
    let http = reqwest::Client::new();

    // Warm both paths once (the image's layers, the engine, the portal's caches).
    let mut jobs = vec![through_commons(&api, &http).await.0];
    docker_run();
    let (mut gc, mut dr) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (job, d) = through_commons(&api, &http).await;
        jobs.push(job);
        gc.push(d);
        dr.push(docker_run());
    }
    gc.sort();
    dr.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (g, d) = (quantile(&gc, 0.5), quantile(&dr, 0.5));
    println!("Job start figures ({runs} runs, alternating; one machine, side by side)");
    println!("| measure | GPU Commons | `docker run --rm` | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| `sh -c true`: submit to `succeeded` (polled every 10 ms) / the CLI's run, median | {:.0} ms | {:.0} ms | {:.2}x |",
        ms(g),
        ms(d),
        ms(g) / ms(d)
    );
    println!(
        "| the same, quartiles | {:.0}-{:.0} ms | {:.0}-{:.0} ms | |",
        ms(quantile(&gc, 0.25)),
        ms(quantile(&gc, 0.75)),
        ms(quantile(&dr, 0.25)),
        ms(quantile(&dr, 0.75)),
    );
    remove_containers(&jobs);
    drop(portal);
}
