//! Jobs' disks end to end (portal + in-process agent + Docker, both backends): the job's
//! `disk_gb` is checked (422 naming the field), placed only where the agent gives a job
//! that much (else it waits with the reason), and enforced on the server; a server under
//! its agent's free-space floor takes no new guest, and its page says why.

use crate::support::harness::{wait_for, TestPortal};
use crate::support::session::BrowserSession;
use commons_agent::disk::Floor;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn job(cmd: &str, disk_gb: Option<i64>) -> Value {
    let mut j = json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd],
                       "gpus": 1, "time_limit_minutes": 5, "cpus": 0.5, "memory_gb": 0.25});
    if let Some(g) = disk_gb {
        j["disk_gb"] = json!(g);
    }
    j
}

/// The first node as the API shows it, once `ok` holds for it.
async fn node_when(p: &TestPortal, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let ok = &ok;
    wait_for(T, what, || async move {
        let nodes = p.get_json(&p.alice, "/api/v1/nodes").await;
        nodes.as_array().unwrap().first().is_some_and(ok)
    })
    .await;
    p.get_json(&p.alice, "/api/v1/nodes").await[0].clone()
}

/// Waits until the job's reason contains `text`; returns the job.
async fn reason_with(p: &TestPortal, token: &str, id: i64, text: &str) -> Value {
    let (token, text) = (token.to_string(), text.to_string());
    let (tk, tx) = (&token, &text);
    wait_for(T, &format!("job {id} waiting for: {text}"), || async move {
        p.job(tk, id).await["reason"]
            .as_str()
            .is_some_and(|r| r.contains(tx.as_str()))
    })
    .await;
    p.job(&token, id).await
}

per_backend! {
    async fn disk_gb_is_checked_placed_within_the_nodes_largest_and_enforced_there(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p
            .agent_with(&p.url, "vision", "fake:2xA100-80GB", |c| {
                c.disk.max_job_gb = 2;
            })
            .await;
        let n = node_when(&p, "the node's largest job disk", |n| {
            n["max_job_disk_gb"] == 2
        })
        .await;
        assert_eq!(n["max_job_disk_gb"], 2, "[{backend:?}] {n}");

        // A bad value is refused whole, naming the field.
        let before = p.get_json(&p.alice, "/api/v1/jobs").await;
        for bad in [json!(0), json!(-1), json!(100_000), json!("ten")] {
            let mut body = job("true", None);
            body["disk_gb"] = bad.clone();
            let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &body).await;
            assert!(
                status == 422 || status == 400,
                "[{backend:?}] {bad}: {status} {v}"
            );
            if status == 422 {
                assert_eq!(v["field"], "disk_gb", "[{backend:?}] {v}");
            } else {
                assert!(v.to_string().contains("disk_gb"), "[{backend:?}] {v}");
            }
        }
        assert_eq!(p.get_json(&p.alice, "/api/v1/jobs").await, before);

        // More than the only server gives: it waits, and says why.
        let big = p.submit(&p.alice, job("true", Some(500))).await;
        let j = reason_with(&p, &p.alice, big, "gives a job 500 GiB of disk").await;
        assert_eq!(j["state"], "queued", "[{backend:?}] {j}");
        assert_eq!(j["disk_gb"], 500);
        let reason = j["reason"].as_str().unwrap();
        assert!(
            reason.contains("the most any gives is 2 GiB") && reason.contains("disk_gb"),
            "[{backend:?}] {reason}"
        );

        // One that fits runs, with its cap on the server: 2 TiB of holes is over its
        // 1 GiB (counted at its apparent size), and the agent stops it with the reason.
        let small = p
            .submit(
                &p.alice,
                job(
                    "truncate -s 2048G /checkpoint/huge; echo made; sleep 120",
                    Some(1),
                ),
            )
            .await;
        let j = p
            .wait_state(&p.alice, small, &["failed", "succeeded", "cancelled"], T)
            .await;
        assert_eq!(j["state"], "failed", "[{backend:?}] {j}");
        let why = j["reason"].as_str().unwrap_or_default();
        assert!(
            why.contains("over the job's disk cap of 1.0 GiB (disk_gb)"),
            "[{backend:?}] {why}"
        );
        assert_eq!(p.job(&p.alice, big).await["state"], "queued");
        p.stop().await;
    }
}

per_backend! {
    async fn under_its_disk_floor_a_node_takes_no_new_guest_and_its_page_says_why(backend: Backend) {
        let p = TestPortal::start(backend).await;
        // A floor no disk meets: 1 EiB free.
        let _agent = p
            .agent_with(&p.url, "vision", "fake:2xA100-80GB", |c| {
                c.disk.floor = Floor::Gb(1 << 30);
            })
            .await;
        let n = node_when(&p, "the node's disk under its floor", |n| {
            n["disk_low"].is_string()
        })
        .await;
        let low = n["disk_low"].as_str().unwrap().to_string();
        assert!(
            low.contains("under its agent's floor") && low.contains("no new guests"),
            "[{backend:?}] {low}"
        );

        // bob's lab (physics) would be a guest here: it waits.
        let guest = p.submit(&p.bob, job("echo guest", None)).await;
        let j = reason_with(&p, &p.bob, guest, "low on disk space").await;
        assert_eq!(j["state"], "queued", "[{backend:?}] {j}");
        // The owner's own job still runs.
        let own = p.submit(&p.alice, job("echo own", None)).await;
        let j = p
            .wait_state(&p.alice, own, &["succeeded", "failed"], T)
            .await;
        assert_eq!(j["state"], "succeeded", "[{backend:?}] {j}");
        assert_eq!(p.job(&p.bob, guest).await["state"], "queued");

        // The node's page says why, for the node and for each GPU.
        let id = n["id"].as_i64().unwrap();
        let b = BrowserSession::login(&p, "alice").await;
        let html = b.fetch(&format!("/nodes/{id}")).await.text().await.unwrap();
        assert!(
            html.contains("id=\"node-disk-low\"") && html.contains("No new guests"),
            "[{backend:?}] {html}"
        );
        // (The free figure moves with what others write on this machine.)
        assert!(
            html.contains("under its agent&#39;s floor of 1073741824 GiB: it takes no new guests"),
            "[{backend:?}] {html}"
        );
        assert_eq!(
            html.matches("<td>no: its disk has ").count(),
            2,
            "[{backend:?}] each GPU says why: {html}"
        );
        p.stop().await;
    }
}
