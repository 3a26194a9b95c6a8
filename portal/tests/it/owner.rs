//! The owner stays in charge of the server (issue 11), on a campus of separate processes
//! (see `cluster`): the portal, and agents with fake GPUs in network namespaces, real
//! Docker. Guests are physics (bob) jobs on vision's (alice's) servers. The campus grace
//! period is 5 s.
//!
//! Hosts 150..=179 are this file's.

use crate::support::cluster::{
    agent_binary, remove_containers, AgentProcess, Api, Host, PortalOpts, PortalProcess,
};
use crate::support::harness::{Backend, TestDb};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const GRACE_S: u64 = 5;

fn sleeper() -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
           "gpus": 1, "time_limit_minutes": 30})
}

fn containers(job: i64) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=commons.job={job}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Runs `commons-agent ARGS --state-dir DIR` on the agent's server: (success, output).
fn ctl(agent: &AgentProcess, args: &[&str]) -> (bool, String) {
    ctl_in(agent.state.path(), args)
}

fn ctl_in(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(agent_binary())
        .args(args)
        .arg("--state-dir")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A portal (on `backend`), alice's and bob's APIs, and the database kept alive.
struct Campus {
    portal: PortalProcess,
    alice: Api,
    bob: Api,
    _db: Option<TestDb>,
}

fn campus(backend: Backend) -> Campus {
    let db = (backend == Backend::Postgres).then(|| TestDb::new(Backend::Postgres));
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        db_url: db.as_ref().map(|d| d.url.clone()),
        ..Default::default()
    });
    let bob = portal.admin(&["api-token", "bob"]);
    Campus {
        alice: Api::new(portal.url(), alice),
        bob: Api::new(portal.url(), bob),
        portal,
        _db: db,
    }
}

/// The node called `name`, once it is online: its JSON.
async fn node(api: &Api, name: &str, agent: &AgentProcess) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(nodes) = api.get("/api/v1/nodes").await {
            if let Some(n) = nodes
                .as_array()
                .and_then(|a| a.iter().find(|n| n["name"] == name && n["online"] == true))
            {
                return n.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "node {name} online: {}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn running(api: &Api, job: i64) -> Value {
    api.wait_job(job, Duration::from_secs(60), "running", |j| {
        j["state"] == "running" && !containers(job).is_empty()
    })
    .await
}

/// Seconds until the job's containers are gone, at most `within`.
async fn gone_within(job: i64, within: Duration) -> f64 {
    let t0 = Instant::now();
    while !containers(job).is_empty() {
        assert!(
            t0.elapsed() < within,
            "job {job}'s container still runs after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t0.elapsed().as_secs_f64()
}

async fn local_use_takes_the_gpu_back(backend: Backend, host: u8) {
    let c = campus(backend);
    let host = Host::new(host);
    let agent = AgentProcess::start_with(
        &host,
        &c.portal,
        "vision",
        "host-lu",
        "fake:1xA100-80GB",
        &["--capacity", "16,64"],
    );
    let n = node(&c.alice, "host-lu", &agent).await;
    assert_eq!(n["cpus"].as_f64(), Some(16.0), "capacity reported: {n}");
    assert_eq!(n["memory_mb"].as_i64(), Some(64 * 1024), "{n}");
    // A job larger than the server waits with that reason, never gets less.
    let big = c
        .bob
        .submit(
            json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1,
                       "cpus": 32, "time_limit_minutes": 30}),
        )
        .await;
    let j = c
        .bob
        .wait_job(big, Duration::from_secs(20), "a reason", |j| {
            j["reason"].as_str().is_some_and(|r| r.contains("32 CPUs"))
        })
        .await;
    assert_eq!(j["state"], "queued");
    reqwest::Client::new()
        .post(format!("{}/api/v1/jobs/{big}/cancel", c.portal.url()))
        .bearer_auth(&c.bob.token)
        .send()
        .await
        .unwrap();
    let id = n["id"].as_i64().unwrap();
    // Lent only after a minute of idleness.
    let status = c
        .alice
        .put(
            &format!("/api/v1/nodes/{id}/lending"),
            json!({"mode": "always", "min_idle_minutes": 1}),
        )
        .await;
    assert_eq!(status, 200);
    let job = c.bob.submit(sleeper()).await;
    running(&c.bob, job).await;

    let t0 = Instant::now();
    let (ok, out) = ctl(
        &agent,
        &["fake", "--gpu", "0", "--local-use", "on", "--util", "90"],
    );
    assert!(ok, "{out}");
    gone_within(job, Duration::from_secs(GRACE_S + 5)).await;
    let took = t0.elapsed().as_secs_f64();
    let j = c
        .bob
        .wait_job(job, Duration::from_secs(10), "requeued", |j| {
            j["state"] == "queued"
        })
        .await;
    let events = c
        .bob
        .get(&format!("/api/v1/jobs/{job}/events"))
        .await
        .unwrap();
    assert!(
        events.to_string().contains("using this GPU directly")
            || events.to_string().contains("using the GPU directly"),
        "the reason says the owner took it back: {events}\n{j}"
    );
    // The owner stops; the GPU is not lent again until it was idle a minute.
    let (ok, out) = ctl(
        &agent,
        &["fake", "--gpu", "0", "--local-use", "off", "--util", "0"],
    );
    assert!(ok, "{out}");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let j = c.bob.get(&format!("/api/v1/jobs/{job}")).await.unwrap();
    assert_eq!(
        j["state"], "queued",
        "not lent again before the idle minute: {j}"
    );
    assert!(containers(job).is_empty());
    assert!(
        j["reason"].as_str().unwrap_or("").contains("idle"),
        "waits for the idle time: {j}"
    );
    println!(
        "FIGURE local use -> guest container gone: {took:.2} s (grace {GRACE_S} s, {backend:?})"
    );
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_use_takes_the_gpu_back_sqlite() {
    local_use_takes_the_gpu_back(Backend::Sqlite, 150).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_use_takes_the_gpu_back_postgres() {
    local_use_takes_the_gpu_back(Backend::Postgres, 151).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_now_status_and_refusals() {
    let c = campus(Backend::Sqlite);
    let host = Host::new(152);
    let agent = AgentProcess::start(&host, &c.portal, "host-rc", "fake:1xA100-80GB");
    node(&c.alice, "host-rc", &agent).await;
    let job = c.bob.submit(sleeper()).await;
    running(&c.bob, job).await;

    // `status` tells the truth: the GPU, the guest on it, its user and lab, the link.
    let (ok, out) = ctl(&agent, &["status"]);
    assert!(ok, "{out}");
    for want in [
        "GPU-fake-00-A100-80GB",
        &format!("job {job} attempt 1: user bob, lab physics, guest"),
        "connected",
        "lending: always, lending now",
    ] {
        assert!(out.contains(want), "status shows {want:?}:\n{out}");
    }

    // Bad input is refused with a clear message, and nothing changes.
    for (args, says) in [
        (vec!["lend", "sometimes"], "unknown lending rule"),
        (vec!["lend", "windows", "weekdays 9-5"], "DAYS HH:MM-HH:MM"),
        (vec!["lend", "windows"], "at least one window"),
        (vec!["reclaim"], "--now"),
    ] {
        let (ok, out) = ctl(&agent, &args);
        assert!(!ok && out.contains(says), "{args:?}: {out}");
    }
    let nowhere = tempfile::tempdir().unwrap();
    let (ok, out) = ctl_in(nowhere.path(), &["drain"]);
    assert!(!ok && out.contains("not running"), "{out}");

    // The kill switch: the guest's container is gone within the grace (+5 s).
    let t0 = Instant::now();
    let (ok, out) = ctl(&agent, &["reclaim", "--now"]);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("job {job} stopping")), "{out}");
    gone_within(job, Duration::from_secs(GRACE_S + 5)).await;
    let took = t0.elapsed().as_secs_f64();
    c.bob
        .wait_job(job, Duration::from_secs(10), "requeued", |j| {
            j["state"] == "queued"
        })
        .await;
    let audit = c.portal.audit("reclaim");
    assert!(
        audit.iter().any(
            |(actor, target, after)| actor.contains("on host-rc (on the server)")
                && target == "node host-rc"
                && after == "true"
        ),
        "{audit:?}"
    );
    let (ok, out) = ctl(&agent, &["status"]);
    assert!(ok && out.contains("RECLAIMED"), "{out}");
    // Nothing is lent while reclaimed; `--off` lends again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(containers(job).is_empty());
    let (ok, out) = ctl(&agent, &["reclaim", "--off"]);
    assert!(ok, "{out}");
    running(&c.bob, job).await;
    println!("FIGURE reclaim --now -> guest container gone: {took:.2} s (grace {GRACE_S} s)");
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_moves_guests_and_keeps_the_owner_job() {
    let c = campus(Backend::Sqlite);
    let host = Host::new(153);
    let agent = AgentProcess::start(&host, &c.portal, "host-dr", "fake:2xA100-80GB");
    node(&c.alice, "host-dr", &agent).await;
    let own = c.alice.submit(sleeper()).await;
    let guest = c.bob.submit(sleeper()).await;
    running(&c.alice, own).await;
    running(&c.bob, guest).await;
    let (ok, out) = ctl(&agent, &["drain"]);
    assert!(ok && out.contains("drained"), "{out}");
    gone_within(guest, Duration::from_secs(GRACE_S + 10)).await;
    c.bob
        .wait_job(guest, Duration::from_secs(10), "requeued", |j| {
            j["state"] == "queued"
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let j = c.alice.get(&format!("/api/v1/jobs/{own}")).await.unwrap();
    assert_eq!(j["state"], "running", "the owner's job runs on: {j}");
    assert_eq!(containers(own).len(), 1);
    assert!(containers(guest).is_empty(), "no guest while drained");
    assert!(!c.portal.audit("drain").is_empty());
    let (ok, out) = ctl(&agent, &["undrain"]);
    assert!(ok, "{out}");
    running(&c.bob, guest).await;
    remove_containers(&[own, guest]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lending_window_closing_preempts_guests() {
    let c = campus(Backend::Sqlite);
    let host = Host::new(154);
    let agent = AgentProcess::start(&host, &c.portal, "host-lw", "fake:1xA100-80GB");
    node(&c.alice, "host-lw", &agent).await;
    let job = c.bob.submit(sleeper()).await;
    running(&c.bob, job).await;
    // A window on every day but today: lending is closed now.
    let days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let today = chrono::Utc::now().format("%a").to_string().to_lowercase();
    let others: Vec<&str> = days.iter().copied().filter(|d| *d != today).collect();
    let window = format!("{} 00:00-24:00", others.join(","));
    let (ok, out) = ctl(&agent, &["lend", "windows", &window]);
    assert!(ok, "{out}");
    let t0 = Instant::now();
    while !containers(job).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(GRACE_S + 10),
            "the guest still runs after the window closed ({window}): {out}\n{}",
            c.portal.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Requeued first with the preemption's words; the scheduler's next written round
    // (waiting reasons are written at most every few seconds) says what it waits for.
    c.bob
        .wait_job(
            job,
            Duration::from_secs(60),
            "requeued, waiting for the window",
            |j| j["state"] == "queued" && j["reason"].as_str().unwrap_or("").contains("not lent"),
        )
        .await;
    let audit = c.portal.audit("set_lending");
    assert!(
        audit
            .iter()
            .any(|(a, _, after)| a.contains("(on the server)") && after.starts_with("windows")),
        "{audit:?}"
    );
    remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_deregisters_the_node() {
    let c = campus(Backend::Sqlite);
    let host = Host::new(155);
    let mut agent = AgentProcess::start(&host, &c.portal, "host-lv", "fake:1xA100-80GB");
    node(&c.alice, "host-lv", &agent).await;
    let job = c.bob.submit(sleeper()).await;
    running(&c.bob, job).await;
    let (ok, out) = ctl(&agent, &["leave"]);
    assert!(ok, "{out}\n{}", agent.log());
    assert!(out.contains("left GPU Commons"), "{out}");
    assert!(containers(job).is_empty());
    let status = agent.exited_within(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "the agent ends: {}",
        agent.log()
    );
    let nodes = c.alice.get("/api/v1/nodes").await.unwrap();
    assert!(
        !nodes.to_string().contains("host-lv"),
        "the node and its GPUs vanish: {nodes}"
    );
    c.bob
        .wait_job(job, Duration::from_secs(10), "requeued", |j| {
            j["state"] == "queued"
        })
        .await;
    assert!(!c.portal.audit("leave").is_empty());
    // The state dir no longer holds a credential: starting again needs a new token.
    assert!(commons_agent::state::load_credential(agent.state.path())
        .unwrap()
        .is_none());
    remove_containers(&[job]);
}

async fn a_revoked_node_is_refused(backend: Backend, host: u8) {
    let c = campus(backend);
    let host = Host::new(host);
    let mut agent = AgentProcess::start(&host, &c.portal, "host-rv", "fake:1xA100-80GB");
    let id = node(&c.alice, "host-rv", &agent).await["id"]
        .as_i64()
        .unwrap();
    // Only the lab's admins may revoke.
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/nodes/{id}/revoke", c.portal.url()))
        .bearer_auth(&c.bob.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/nodes/{id}/revoke", c.portal.url()))
        .bearer_auth(&c.alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    // The connected agent is cut off and refused when it dials again: it ends.
    let status = agent.exited_within(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the agent is refused: {}",
        agent.log()
    );
    assert!(
        agent.log().contains("refused this node's credential"),
        "{}",
        agent.log()
    );
    let nodes = c.alice.get("/api/v1/nodes").await.unwrap();
    assert!(!nodes.to_string().contains("host-rv"), "{nodes}");
    assert!(!c.portal.audit("revoke_node").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_node_is_refused_sqlite() {
    a_revoked_node_is_refused(Backend::Sqlite, 156).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_node_is_refused_postgres() {
    a_revoked_node_is_refused(Backend::Postgres, 157).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_guest_is_warned_then_stopped() {
    let c = campus(Backend::Sqlite);
    let host = Host::new(158);
    let agent = AgentProcess::start_with(
        &host,
        &c.portal,
        "vision",
        "host-id",
        "fake:1xA100-80GB",
        &["--idle-guest", "12s"],
    );
    node(&c.alice, "host-id", &agent).await;
    let job = c.bob.submit(sleeper()).await;
    running(&c.bob, job).await;
    let t0 = Instant::now();
    // Fake GPUs sit at 0% unless told otherwise.
    gone_within(job, Duration::from_secs(12 + GRACE_S + 10)).await;
    assert!(
        t0.elapsed() >= Duration::from_secs(9),
        "not before its idle time"
    );
    // Requeued (and, idle as it is, placed again: the events tell).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let events = c
            .bob
            .get(&format!("/api/v1/jobs/{job}/events"))
            .await
            .unwrap();
        if events.to_string().contains("requeued") && events.to_string().contains("stayed under 5%")
        {
            break;
        }
        assert!(Instant::now() < deadline, "requeued as idle: {events}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = c.bob.logs(job).await;
    assert!(
        logs.contains("under 5%") && logs.contains("it will be stopped in"),
        "warned in its log: {logs}"
    );
    remove_containers(&[job]);
}
