//! The departure soak: a campus of separate processes (the portal, and agents on
//! network-namespace hosts, as in the integration tests' `cluster`) running counting
//! jobs that checkpoint, while providers leave one after another: half of them cleanly
//! (the owner reclaims the server, guests get their grace, then the agent leaves), half
//! abruptly (agent and containers vanish). A fresh provider joins after each departure.
//!
//! Prints, over all departures: the migration success rate (the job resumed from a
//! checkpoint no older than one checkpoint interval), GPU time lost per preemption, the
//! time from the owner's reclaim to the guest's container gone, and the number of
//! attempts that overlapped (must be 0).
//!
//! ```sh
//! cargo run -p commons-portal --example soak -- --departures 100
//! ```
//! Needs root (network namespaces), Docker, and the demo image (built if missing).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test program: a failure is a crash

#[path = "../tests/it/support/cluster.rs"]
#[allow(dead_code)] // the tests' helpers; the soak uses some of them
mod cluster;
#[path = "../tests/it/support/timeline.rs"]
#[allow(dead_code)]
mod timeline;

use cluster::{remove_containers, AgentProcess, Api, Host, PortalProcess};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use timeline::Timeline;

const GPUS: &str = "fake:2xA100-80GB";
/// Seconds between periodic checkpoints (the jobs ask for one minute).
const INTERVAL_S: u64 = 60;

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

fn counter() -> serde_json::Value {
    let script = "n=0; [ -f /checkpoint/n ] && n=$(cat /checkpoint/n); echo \"start $n\"; \
                  trap 'echo $n > /checkpoint/t; mv /checkpoint/t /checkpoint/n; exit 143' TERM; \
                  while true; do n=$((n+1)); echo $n > /checkpoint/t; mv /checkpoint/t /checkpoint/n; sleep 1; done";
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", script],
           "gpus": 1, "time_limit_minutes": 600, "checkpoint_minutes": 1})
}

/// The count each attempt started from.
fn starts(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| l.strip_prefix("start "))
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The job's running container on the engine.
fn running_container(job: i64) -> Option<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=commons.job={job}")])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(String::from)
}

struct Provider {
    _host: Host,
    agent: AgentProcess,
    name: String,
}

#[tokio::main]
async fn main() {
    let departures = arg("--departures", 100);
    let providers = arg("--providers", 4) as usize;
    let n_jobs = arg("--jobs", 6) as usize;
    let (portal, alice) = PortalProcess::start(6, 2);
    let bob = portal.admin(&["api-token", "bob"]);
    let owner = Api::new(portal.url(), alice);
    let guest = Api::new(portal.url(), bob);
    let mut next_host: u8 = 20;
    let mut join = |portal: &PortalProcess| {
        let host = Host::new(next_host);
        let name = format!("p{next_host}");
        next_host = next_host.wrapping_add(1).max(20);
        let agent = AgentProcess::start_for(&host, portal, "vision", &name, GPUS);
        Provider {
            _host: host,
            agent,
            name,
        }
    };
    let mut live: Vec<Provider> = (0..providers).map(|_| join(&portal)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while owner.nodes_online().await < providers {
        assert!(Instant::now() < deadline, "providers online");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut jobs = Vec::new();
    // Watched from before the first submission: no container starts unseen.
    let timeline = Timeline::start();
    for _ in 0..n_jobs {
        let id = guest.submit(counter()).await;
        jobs.push(id);
    }
    for &j in &jobs {
        guest
            .wait_job(j, Duration::from_secs(120), "running", |v| {
                v["state"] == "running"
            })
            .await;
    }
    eprintln!("soak: {n_jobs} jobs on {providers} providers; {departures} departures");

    let (mut ok, mut failed) = (0u64, 0u64);
    let mut lost_s: Vec<f64> = Vec::new();
    let mut reclaim_to_gone: Vec<f64> = Vec::new();
    let started = Instant::now();
    for d in 0..departures {
        // Let the jobs run a while between departures. (An abrupt departure loses what the
        // job did since its last checkpoint: the one it resumed from, or a periodic one.)
        let abrupt = d % 2 == 1;
        tokio::time::sleep(Duration::from_secs(arg("--settle", 10))).await;
        // The busiest provider leaves.
        let mut on: BTreeMap<String, Vec<(i64, u64)>> = BTreeMap::new();
        for &j in &jobs {
            let v = guest.get(&format!("/api/v1/jobs/{j}")).await.unwrap();
            if v["state"] == "running" {
                let node = v["node"].as_str().unwrap_or_default().to_string();
                let log = guest.logs(j).await;
                let last_start = starts(&log).last().copied().unwrap_or(0);
                on.entry(node).or_default().push((j, last_start));
            }
        }
        let Some((i, _)) = live
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| on.get(&p.name).map_or(0, Vec::len))
        else {
            break;
        };
        let leaving = live.remove(i);
        let moved = on.remove(&leaving.name).unwrap_or_default();
        let attempts_before: BTreeMap<i64, i64> = {
            let mut m = BTreeMap::new();
            for (j, _) in &moved {
                let v = guest.get(&format!("/api/v1/jobs/{j}")).await.unwrap();
                m.insert(*j, v["attempts"].as_i64().unwrap_or(0));
            }
            m
        };
        // The count each moved job had reached when its provider left, read from its
        // container's own /checkpoint.
        let at_departure: BTreeMap<i64, u64> = moved
            .iter()
            .map(|(j, start)| {
                let count = running_container(*j)
                    .and_then(|c| {
                        let out = std::process::Command::new("docker")
                            .args(["exec", &c, "cat", "/checkpoint/n"])
                            .output()
                            .ok()?;
                        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
                    })
                    .unwrap_or(*start);
                (*j, count)
            })
            .collect();
        if abrupt {
            let mut agent = leaving.agent;
            agent.vanish();
        } else {
            let nodes = owner.get("/api/v1/nodes").await.unwrap();
            let id = nodes
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["name"] == leaving.name.as_str())
                .and_then(|n| n["id"].as_i64())
                .unwrap();
            let containers: Vec<String> = moved
                .iter()
                .filter_map(|(j, _)| running_container(*j))
                .collect();
            let t0 = Instant::now();
            let status = owner
                .put(
                    &format!("/api/v1/nodes/{id}/lending"),
                    json!({"mode": "always", "reclaim": true, "grace_seconds": 5}),
                )
                .await;
            assert_eq!(status, 200);
            let gone_deadline = Instant::now() + Duration::from_secs(60);
            for c in &containers {
                loop {
                    let out = std::process::Command::new("docker")
                        .args(["inspect", "-f", "{{.State.Running}}", c])
                        .output()
                        .unwrap();
                    let running = String::from_utf8_lossy(&out.stdout).trim() == "true";
                    if !running || Instant::now() > gone_deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            if !containers.is_empty() {
                reclaim_to_gone.push(t0.elapsed().as_secs_f64());
            }
            // Then the provider leaves for good, once its guests are requeued.
            for (j, _) in &moved {
                let before = attempts_before[j];
                guest
                    .wait_job(*j, Duration::from_secs(120), "requeued", move |v| {
                        v["attempts"].as_i64().unwrap_or(0) > before || v["state"] == "queued"
                    })
                    .await;
            }
            let mut agent = leaving.agent;
            agent.kill9();
        }
        live.push(join(&portal));
        // Every moved job runs again; how much did it lose?
        for (j, _) in &moved {
            let before = attempts_before[j];
            let v = guest
                .wait_job(*j, Duration::from_secs(180), "running again", move |v| {
                    v["state"] == "running" && v["attempts"].as_i64().unwrap_or(0) > before
                })
                .await;
            let _ = v;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let resumed = starts(&guest.logs(*j).await).last().copied().unwrap_or(0);
            let lost = at_departure[j].saturating_sub(resumed);
            lost_s.push(lost as f64);
            if lost <= INTERVAL_S + 5 {
                ok += 1;
            } else {
                failed += 1;
                eprintln!("soak: job {j} lost {lost} s (resumed from {resumed})");
            }
        }
        eprintln!(
            "soak: departure {}/{departures} ({}), {} jobs moved, {:.0} s elapsed",
            d + 1,
            if abrupt { "abrupt" } else { "reclaim" },
            moved.len(),
            started.elapsed().as_secs_f64()
        );
    }
    let overlaps = jobs
        .iter()
        .map(|&j| {
            let iv = timeline.intervals(j);
            iv.windows(2).filter(|w| w[0].2 > w[1].1).count()
        })
        .sum::<usize>();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let p = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(((v.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0)
    };
    let migrations = ok + failed;
    println!("departures: {departures}");
    println!("migrations: {migrations} ({ok} ok, {failed} failed)");
    println!(
        "migration success rate: {:.1}%",
        if migrations > 0 {
            100.0 * ok as f64 / migrations as f64
        } else {
            0.0
        }
    );
    println!(
        "GPU time lost per preemption: mean {:.1} s, p95 {:.1} s",
        mean(&lost_s),
        p(&mut lost_s.clone(), 0.95)
    );
    println!(
        "owner's reclaim to guest container gone: mean {:.1} s, p95 {:.1} s (grace 5 s)",
        mean(&reclaim_to_gone),
        p(&mut reclaim_to_gone.clone(), 0.95)
    );
    println!("overlapping attempts: {overlaps}");
    remove_containers(&jobs);
    assert_eq!(overlaps, 0, "no job may run twice at once");
}
