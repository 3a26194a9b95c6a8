//! Shares of one GPU (issue 32) with a real agent, the Docker Engine and a fake GPU that
//! models per-process memory: a lab admin turns sharing on for a server, two half-GPU
//! guests run on its one GPU (the same UUID in both job views) while a third waits with
//! its share reason, and the owner lab's whole-GPU job takes the GPU back from both.

use crate::support::harness::{wait_for, Backend, TestPortal};
use crate::support::session::BrowserSession;
use serde_json::{json, Value};
use std::time::Duration;

fn half() -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c",
           "echo \"share=$COMMONS_GPU_FRACTION mem=$COMMONS_GPU_MEMORY_LIMIT_MB\"; trap 'exit 143' TERM; while true; do sleep 1; done"],
           "gpus": 1, "gpu_fraction": 0.5, "gpu_memory_gb": 20, "time_limit_minutes": 30, "lab": "physics"})
}

async fn view(p: &TestPortal, token: &str, job: i64) -> Value {
    p.get_json(token, &format!("/api/v1/jobs/{job}")).await
}

/// Waits until `job`'s view satisfies `ok`; says what it saw otherwise.
async fn wait_view(
    p: &TestPortal,
    token: &str,
    job: i64,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let v = view(p, token, job).await;
        if ok(&v) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {job}: {what}; saw {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// vision's server with one fake A100, its agent enforcing shares by time slicing (and
/// reading GPU memory every half second), online; and its node id.
async fn sharing_server(p: &TestPortal) -> (crate::support::harness::TestAgent, i64) {
    let agent = p
        .agent_with(&p.url, "vision", "fake:1xA100-80GB", |c| {
            c.shares.mode = Some(commons_proto::ShareMode::Timeslice);
            c.shares.watch_every = Duration::from_millis(500);
        })
        .await;
    p.wait_online("vision", 1).await;
    let nodes = p.get_json(&p.carol, "/api/v1/nodes").await;
    (agent, nodes[0]["id"].as_i64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_halves_share_one_gpu_and_the_owner_takes_it_back() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let (_vision, node) = sharing_server(&p).await;

    // Sharing is off: a share waits, saying why.
    let first = p.submit(&p.bob, half()).await;
    let v = wait_view(&p, &p.bob, first, "to wait for a share", |v| {
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("does not share its GPUs"))
    })
    .await;
    assert_eq!(v["state"], "queued", "{v}");

    // The lab admin turns it on from the node page; the page says it is in force.
    let carol = BrowserSession::login(&p, "carol").await;
    let r = carol
        .post_form(&format!("/nodes/{node}/share"), &[("on", "on")])
        .await;
    assert!(
        r.status().is_success() || r.status().is_redirection(),
        "{}",
        r.status()
    );
    let page = carol.page(&format!("/nodes/{node}")).await;
    assert!(
        page.contains("(its agent enforces them: timeslice)"),
        "the node page shows sharing on"
    );
    let saved = p.get_json(&p.carol, "/api/v1/nodes").await;
    assert_eq!(saved[0]["lending"]["share_gpus"], true, "{saved}");

    // Two halves run on the one GPU; a third waits with its share reason.
    let second = p.submit(&p.bob, half()).await;
    let mut uuids = Vec::new();
    for job in [first, second] {
        let v = wait_view(&p, &p.bob, job, "to run", |v| v["state"] == "running").await;
        let g = &v["gpus"][0];
        assert_eq!(g["share"]["fraction"], 0.5, "{v}");
        assert_eq!(g["share"]["memory_mb"], 20480, "{v}");
        uuids.push(g["uuid"].as_str().unwrap().to_string());
        wait_for(
            Duration::from_secs(60),
            "the job's variables in its log",
            || async { p.logs(&p.bob, job).await.contains("share=0.5 mem=20480") },
        )
        .await;
    }
    assert_eq!(uuids[0], uuids[1], "both halves hold the same GPU");
    let third = p.submit(&p.bob, half()).await;
    let v = wait_view(&p, &p.bob, third, "to wait with the share reason", |v| {
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("waiting for 0.5 of a GPU with 20 GB free"))
    })
    .await;
    assert_eq!(v["state"], "queued", "{v}");
    let page = BrowserSession::login(&p, "bob")
        .await
        .page(&format!("/jobs/{first}"))
        .await;
    assert!(
        page.contains("(0.5 of it, 20 GB"),
        "the job page shows the share"
    );

    // The owner's whole-GPU job takes the GPU back from both guests.
    let owner = json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
                       "gpus": 1, "time_limit_minutes": 30, "lab": "vision"});
    let owner_job = p.submit(&p.carol, owner).await;
    wait_view(&p, &p.carol, owner_job, "the owner's job to run", |v| {
        v["state"] == "running"
    })
    .await;
    for job in [first, second] {
        let events = p
            .get_json(&p.bob, &format!("/api/v1/jobs/{job}/events"))
            .await
            .to_string();
        assert!(
            events.contains("preempting"),
            "job {job} was preempted: {events}"
        );
        let v = view(&p, &p.bob, job).await;
        assert_ne!(v["state"], "running", "{v}");
    }
    for job in [first, second, third] {
        let _ = p
            .post_json(&p.bob, &format!("/api/v1/jobs/{job}/cancel"), &json!({}))
            .await;
    }
    let _ = p
        .post_json(
            &p.carol,
            &format!("/api/v1/jobs/{owner_job}/cancel"),
            &json!({}),
        )
        .await;
    p.stop().await;
}

/// A share is refused at submission where its fields break a rule, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_share_requests_name_their_field() {
    let p = TestPortal::start(Backend::Sqlite).await;
    for (patch, field) in [
        (json!({"gpu_fraction": 0.33}), "gpu_fraction"),
        (json!({"gpu_fraction": 0.5, "gpus": 2}), "gpus"),
        (json!({"gpu_memory_gb": -1}), "gpu_memory_gb"),
        (
            json!({"env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}}),
            "env",
        ),
    ] {
        let mut body = half();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (s, v) = p.post_json(&p.bob, "/api/v1/jobs", &body).await;
        assert_eq!((s, v["field"].as_str()), (422, Some(field)), "{body}: {v}");
    }
    assert_eq!(p.get_json(&p.bob, "/api/v1/jobs").await, json!([]));
    p.stop().await;
}

/// The "done when", on a fake GPU that models per-process memory: a student's
/// notebook with a quarter of a GPU and 10 GB shows the share and the memory its process
/// uses (as the agent measures it) on the job page and in the API, and the lab's usage
/// counts a quarter of the GPU for the time it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarter_notebook_shows_its_memory_and_counts_a_quarter() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let (vision, node) = sharing_server(&p).await;
    let (s, v) = p
        .put_json(
            &p.carol,
            &format!("/api/v1/nodes/{node}/lending"),
            &json!({"mode": "always", "share_gpus": true}),
        )
        .await;
    assert_eq!((s, &v["lending"]["share_gpus"]), (200, &json!(true)), "{v}");

    let notebook = json!({"image": "commons-demo:latest", "gpus": 1, "gpu_fraction": 0.25,
                          "gpu_memory_gb": 10, "kind": "interactive", "time_limit_minutes": 60,
                          "lab": "vision"});
    let job = p.submit(&p.alice, notebook).await;
    let v = wait_view(&p, &p.alice, job, "to run", |v| v["state"] == "running").await;
    let uuid = v["gpus"][0]["uuid"].as_str().unwrap().to_string();
    assert_eq!(v["gpus"][0]["share"]["fraction"], 0.25, "{v}");

    // Its process holds 3 GB of the GPU, as the fake GPU reports for its real pid.
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=commons.job={job}")])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!id.is_empty(), "the notebook's container");
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}", &id])
        .output()
        .unwrap();
    let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let procs = json!({ uuid: [{"pid": pid, "used_memory_mb": 3072}] });
    std::fs::write(
        vision.config.state_dir.join("fake-gpu-processes.json"),
        procs.to_string(),
    )
    .unwrap();
    let v = wait_view(
        &p,
        &p.alice,
        job,
        "to show the memory its process uses",
        |v| v["gpus"][0]["share"]["memory_used_mb"] == 3072,
    )
    .await;
    assert_eq!(v["gpus"][0]["share"]["memory_mb"], 10240, "{v}");
    let page = BrowserSession::login(&p, "alice")
        .await
        .page(&format!("/jobs/{job}"))
        .await;
    assert!(
        page.contains("(0.25 of it, 10 GB; using 3 GB)"),
        "the job page shows the share and its use"
    );

    // After ten seconds of running, the lab's usage counts a quarter of that time.
    let started = chrono::NaiveDateTime::parse_from_str(
        v["started_at"].as_str().unwrap(),
        "%Y-%m-%dT%H:%M:%S%.f",
    )
    .unwrap();
    wait_for(
        Duration::from_secs(60),
        "ten seconds of running",
        || async { (chrono::Utc::now().naive_utc() - started).num_seconds() >= 10 },
    )
    .await;
    let usage = p.get_json(&p.alice, "/api/v1/usage").await;
    let ran_s = (chrono::Utc::now().naive_utc() - started).num_milliseconds() as f64 / 1000.0;
    let lab = usage
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lab"] == "vision")
        .unwrap();
    let alice = lab["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["username"] == "alice")
        .unwrap();
    let hours = alice["gpu_hours"][0].as_f64().unwrap();
    let ratio = hours * 3600.0 / ran_s;
    assert!(
        (0.2..=0.3).contains(&ratio),
        "a quarter of {ran_s} s of running: {hours} GPU-hours ({ratio:.3} of it)"
    );
    let _ = p
        .post_json(&p.alice, &format!("/api/v1/jobs/{job}/cancel"), &json!({}))
        .await;
    p.stop().await;
}
