//! Checkpoints and migration on a campus of separate processes (see `cluster`): a guest
//! whose owner takes the server back resumes elsewhere from what it saved in its grace
//! period, and a job on a server that vanishes resumes from its last periodic
//! checkpoint. The job is a counter that saves its count to `/checkpoint` every second
//! (atomically: write, then rename) and on SIGTERM, and prints where each start begins.

use crate::support::cluster::{remove_containers, AgentProcess, Api, Host, PortalProcess};
use crate::support::timeline::Timeline;
use serde_json::json;
use std::time::Duration;

const GPUS: &str = "fake:1xA100-80GB";

/// The counting job; `checkpoint_minutes` asks for periodic uploads as well.
fn counter(checkpoint_minutes: Option<i64>) -> serde_json::Value {
    let script = "n=0; [ -f /checkpoint/n ] && n=$(cat /checkpoint/n); \
                  echo \"start $n resume=${COMMONS_RESUME:-0}\"; \
                  trap 'echo $n > /checkpoint/t; mv /checkpoint/t /checkpoint/n; exit 143' TERM; \
                  while true; do n=$((n+1)); echo $n > /checkpoint/t; mv /checkpoint/t /checkpoint/n; sleep 1; done";
    let mut j = json!({"image": "commons-demo:latest", "command": ["sh", "-c", script],
                       "gpus": 1, "time_limit_minutes": 30});
    if let Some(m) = checkpoint_minutes {
        j["checkpoint_minutes"] = json!(m);
    }
    j
}

/// Generous: CI machines are shared, and a slow one takes long to start containers.
const WITHIN: Duration = Duration::from_secs(240);

/// The tails of the portal's and the agents' logs, for a test that timed out.
fn logs_of(portal: &PortalProcess, agents: &[&AgentProcess]) -> String {
    let tail = |s: String| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    let mut out = format!("portal log:\n{}", tail(portal.log()));
    for (i, a) in agents.iter().enumerate() {
        out.push_str(&format!("\nagent {i} log:\n{}", tail(a.log())));
    }
    out
}

/// The values the counter started from, attempt by attempt.
fn starts(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| l.strip_prefix("start "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_guest_resumes_elsewhere_from_what_it_saved() {
    let (portal, alice) = PortalProcess::start(8, 3);
    let bob = portal.admin(&["api-token", "bob"]);
    let owner = Api::new(portal.url(), alice);
    let guest = Api::new(portal.url(), bob);
    let hosts = [Host::new(8), Host::new(9)];
    // Only vision's server at first: bob's job (physics) runs there as a guest.
    let vision_agent = AgentProcess::start_for(&hosts[0], &portal, "vision", "vision-1", GPUS);
    let timeline = Timeline::start();
    let job = guest.submit(counter(None)).await;
    let first = guest
        .wait_job_telling(
            job,
            WITHIN,
            "running",
            |j| j["state"] == "running",
            || logs_of(&portal, &[&vision_agent]),
        )
        .await;
    assert_eq!(first["node"], "vision-1");
    let physics_agent = AgentProcess::start_for(&hosts[1], &portal, "physics", "physics-1", GPUS);
    owner.wait_online(2, WITHIN).await;
    // A few counts saved before the owner takes its server back.
    guest
        .wait_job(job, WITHIN, "running a while", |j| {
            j["state"] == "running"
                && j["started_at"]
                    .as_str()
                    .and_then(|t| t.parse::<chrono::NaiveDateTime>().ok())
                    .is_some_and(|t| (chrono::Utc::now().naive_utc() - t).num_seconds() >= 8)
        })
        .await;
    // The owner takes every GPU back: SIGTERM, the grace, the final upload, requeue.
    let nodes = owner.get("/api/v1/nodes").await.unwrap();
    let vision = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "vision-1")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    let status = owner
        .put(
            &format!("/api/v1/nodes/{vision}/lending"),
            json!({"mode": "always", "reclaim": true, "grace_seconds": 5}),
        )
        .await;
    assert_eq!(status, 200);
    let second = guest
        .wait_job_telling(
            job,
            WITHIN,
            "attempt 2 running",
            |j| j["state"] == "running" && j["attempts"] == 2,
            || logs_of(&portal, &[&vision_agent, &physics_agent]),
        )
        .await;
    assert_eq!(second["node"], "physics-1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = guest.logs(job).await;
    let s = starts(&log);
    assert_eq!(s.len(), 2, "{log}");
    assert_eq!(s[0], 0);
    assert!(
        s[1] >= 6,
        "attempt 2 resumed from the count saved at SIGTERM: {log}"
    );
    assert!(log.contains("resume=1"), "COMMONS_RESUME was set: {log}");
    timeline.assert_no_overlap(job, 2).await;
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_server_costs_at_most_one_checkpoint_interval() {
    let (portal, alice) = PortalProcess::start(8, 3);
    let api = Api::new(portal.url(), alice);
    let hosts = [Host::new(10), Host::new(11)];
    let mut first_agent = AgentProcess::start(&hosts[0], &portal, "host-x", GPUS);
    let timeline = Timeline::start();
    let job = api.submit(counter(Some(1))).await;
    api.wait_job_telling(
        job,
        WITHIN,
        "running",
        |j| j["state"] == "running",
        || logs_of(&portal, &[&first_agent]),
    )
    .await;
    let second_agent = AgentProcess::start(&hosts[1], &portal, "host-y", GPUS);
    api.wait_online(2, WITHIN).await;
    // One periodic checkpoint (after a minute), then the server vanishes.
    api.wait_job_telling(
        job,
        WITHIN,
        "a periodic checkpoint",
        |j| j["last_checkpoint_at"].is_string(),
        || logs_of(&portal, &[&first_agent]),
    )
    .await;
    first_agent.vanish();
    let second = api
        .wait_job_telling(
            job,
            WITHIN,
            "attempt 2 running",
            |j| j["state"] == "running" && j["attempts"] == 2,
            || logs_of(&portal, &[&first_agent, &second_agent]),
        )
        .await;
    assert_eq!(second["node"], "host-y");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = api.logs(job).await;
    let s = starts(&log);
    assert_eq!(s.len(), 2, "{log}");
    assert!(
        s[1] >= 50,
        "attempt 2 resumed from the periodic checkpoint (about a minute in): {log}"
    );
    timeline.assert_no_overlap(job, 2).await;
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_server_moves_its_guests_from_their_checkpoints_and_finishes_the_owners() {
    use crate::support::harness::{Backend, TestPortal};
    let p = TestPortal::start(Backend::Sqlite).await;
    let _vision = p.agent("vision", "fake:2xA100-80GB").await;
    let sleeper = json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
                         "gpus": 1, "time_limit_minutes": 30});
    let owners = p.submit(&p.alice, sleeper.clone()).await;
    p.wait_state(&p.alice, owners, &["running"], Duration::from_secs(30))
        .await;
    // bob (physics) borrows vision's other GPU.
    let guests = p.submit(&p.bob, counter(None)).await;
    p.wait_state(&p.bob, guests, &["running"], Duration::from_secs(30))
        .await;
    let _physics = p.agent("physics", "fake:1xA100-80GB").await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let nodes = p.get_json(&p.alice, "/api/v1/nodes").await;
    let vision = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["lab"] == "vision")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    let drain = format!("/api/v1/nodes/{vision}/drain");
    let (status, _) = p.post_json(&p.bob, &drain, &json!({})).await;
    assert_eq!(status, 403, "only vision's admins drain its server");
    let (status, view) = p.post_json(&p.carol, &drain, &json!({})).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["draining"], true);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let j = p.job(&p.bob, guests).await;
        if j["state"] == "running" && j["attempts"] == 2 {
            assert_eq!(j["node"], "physics-server", "{j}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "guest moved: {j}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = p.logs(&p.bob, guests).await;
    let s = starts(&log);
    assert_eq!(s.len(), 2, "{log}");
    assert!(s[1] >= 5, "resumed from the count saved at SIGTERM: {log}");
    assert!(log.contains("resume=1"), "{log}");
    let o = p.job(&p.alice, owners).await;
    assert_eq!(
        o["state"], "running",
        "the owner's job finishes where it is: {o}"
    );
    assert_eq!(o["attempts"], 1);
    // Nothing new starts on a drained server, the owner's jobs included.
    let next = p.submit(&p.alice, sleeper.clone()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(p.job(&p.alice, next).await["state"], "queued");
    let (status, _) = p
        .post_json(
            &p.carol,
            &format!("/api/v1/nodes/{vision}/undrain"),
            &json!({}),
        )
        .await;
    assert_eq!(status, 200);
    p.wait_state(&p.alice, next, &["running"], Duration::from_secs(30))
        .await;
    p.stop().await;
}
