//! Real failures on a campus of separate processes and hosts (see `cluster`): an agent
//! killed, an agent down past its lease, a host cut off the network, an agent restarted
//! between a job's end and the portal's acknowledgement. Whatever fails, one attempt of
//! a job never runs on two servers at once (checked on the Docker Engine's own event
//! timeline) and a finished job never runs again.

use crate::support::cluster::{remove_containers, AgentProcess, Api, Host, PortalProcess};
use crate::support::timeline::Timeline;
use serde_json::json;
use std::time::Duration;

const GPUS: &str = "fake:1xA100-80GB";

fn sleeper() -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
           "gpus": 1, "time_limit_minutes": 30})
}

fn containers(job: i64) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=commons.job={job}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_comes_back_to_the_same_container_and_attempt() {
    let (portal, token) = PortalProcess::start(8, 3);
    let api = Api::new(portal.url(), token);
    let host = Host::new(1);
    let mut agent = AgentProcess::start(&host, &portal, "host-1", GPUS);
    let job = api.submit(sleeper()).await;
    api.wait_job(job, Duration::from_secs(60), "running", |j| {
        j["state"] == "running"
    })
    .await;
    let before = containers(job);
    assert_eq!(before.len(), 1);
    agent.kill9();
    tokio::time::sleep(Duration::from_secs(2)).await;
    agent.start_again(GPUS);
    // Past a whole lease and its margin after the restart: nothing moved.
    tokio::time::sleep(Duration::from_secs(14)).await;
    let j = api
        .wait_job(job, Duration::from_secs(5), "running", |j| {
            j["state"] == "running"
        })
        .await;
    assert_eq!(j["attempts"], 1, "{j}\n{}", agent.log());
    assert_eq!(containers(job), before, "the same container runs on");
    remove_containers(&[job]);
}

/// Kills or cuts the server that runs a job, keeps it away past the lease, and checks
/// that its container stopped before the job started again on the other server.
async fn a_lost_server_never_doubles_its_job(cut_network: bool) {
    let (portal, token) = PortalProcess::start(8, 3);
    let api = Api::new(portal.url(), token);
    let hosts = [
        Host::new(2 + u8::from(cut_network) * 2),
        Host::new(3 + u8::from(cut_network) * 2),
    ];
    let mut agents = [
        AgentProcess::start(&hosts[0], &portal, "host-a", GPUS),
        AgentProcess::start(&hosts[1], &portal, "host-b", GPUS),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let online = api.nodes_online().await;
        if online >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "two agents online within 120 s: {online} are\n{}",
            portal.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let timeline = Timeline::start();
    let job = api.submit(sleeper()).await;
    let first = api
        .wait_job(job, Duration::from_secs(60), "running", |j| {
            j["state"] == "running"
        })
        .await;
    let lost = if first["node"] == "host-a" { 0 } else { 1 };
    if cut_network {
        hosts[lost].cut();
    } else {
        agents[lost].kill9();
    }
    let second = api
        .wait_job(
            job,
            Duration::from_secs(90),
            "a second attempt running",
            |j| j["state"] == "running" && j["attempts"] == 2,
        )
        .await;
    assert_ne!(second["node"], first["node"], "{second}");
    let iv = timeline
        .wait(job, Duration::from_secs(30), "both containers", |iv| {
            iv.len() >= 2
        })
        .await;
    assert!(
        iv.iter().any(|(a, _, end)| a == "1" && *end != u128::MAX),
        "attempt 1's container stopped on the lost server: {iv:?}\n{}",
        agents[lost].log()
    );
    timeline.assert_no_overlap(job, 2).await;
    if cut_network {
        // Back on the network, the old server learns its attempt is over; nothing runs twice.
        hosts[lost].restore();
        tokio::time::sleep(Duration::from_secs(5)).await;
        timeline.assert_no_overlap(job, 2).await;
        let j = api.get(&format!("/api/v1/jobs/{job}")).await.unwrap();
        assert_eq!(j["attempts"], 2, "{j}");
    }
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_down_past_its_lease_stops_its_job_before_it_runs_elsewhere() {
    a_lost_server_never_doubles_its_job(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cut_off_past_its_lease_stops_its_job_before_it_runs_elsewhere() {
    a_lost_server_never_doubles_its_job(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_before_the_portal_heard_the_end_keeps_the_exit_code() {
    let (portal, token) = PortalProcess::start(12, 5);
    let api = Api::new(portal.url(), token);
    let host = Host::new(6);
    let mut agent = AgentProcess::start(&host, &portal, "host-6", GPUS);
    let job = api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 3; exit 3"],
                       "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    api.wait_job(job, Duration::from_secs(60), "running", |j| {
        j["state"] == "running"
    })
    .await;
    // The job ends while the portal cannot hear it; the agent is then killed and
    // restarted: the result must come from its disk.
    host.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    agent.kill9();
    host.restore();
    agent.start_again(GPUS);
    let j = api
        .wait_job(job, Duration::from_secs(30), "failed", |j| {
            j["state"] == "failed"
        })
        .await;
    assert_eq!(j["exit_code"], 3, "{j}\n{}", agent.log());
    assert_eq!(j["attempts"], 1, "it did not run again");
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_stopped_past_a_lease_stops_no_job_on_separate_hosts() {
    let (mut portal, token) = PortalProcess::start(8, 3);
    let api = Api::new(portal.url(), token);
    let host = Host::new(7);
    let agent = AgentProcess::start(&host, &portal, "host-7", GPUS);
    let job = api.submit(sleeper()).await;
    api.wait_job(job, Duration::from_secs(60), "running", |j| {
        j["state"] == "running"
    })
    .await;
    let before = containers(job);
    portal.stop();
    tokio::time::sleep(Duration::from_secs(14)).await;
    portal.restart();
    tokio::time::sleep(Duration::from_secs(14)).await;
    let j = api
        .wait_job(job, Duration::from_secs(5), "running", |j| {
            j["state"] == "running"
        })
        .await;
    assert_eq!(j["attempts"], 1, "{j}\n{}", agent.log());
    assert_eq!(containers(job), before);
    remove_containers(&[job]);
}
