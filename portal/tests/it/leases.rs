//! Leases between the portal and real agents: a portal restart longer than a lease
//! stops no job, and an agent speaking another protocol is refused with a clear reason.

use crate::harness::{TestPortal, BACKENDS};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_stopped_longer_than_a_lease_stops_no_running_job() {
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        let agent = p.agent("vision", "fake:1xA100-80GB").await;
        let job = p
            .submit(
                &p.alice,
                json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
                       "gpus": 1, "time_limit_minutes": 30}),
            )
            .await;
        p.wait_state(&p.alice, job, &["running"], Duration::from_secs(30))
            .await;
        let before = agent.containers(job);
        assert_eq!(before.len(), 1);
        // Down for a lease and a half (the tests' lease is 10 s, the margin 2 s).
        let p = p.restart_after(Duration::from_secs(15)).await;
        let me = &p;
        crate::harness::wait_for(Duration::from_secs(30), "agent back", || async move {
            me.get_json(&me.alice, "/api/v1/nodes").await[0]["online"] == true
        })
        .await;
        // The new portal judges leases only after watching a whole lease and the margin.
        tokio::time::sleep(Duration::from_secs(14)).await;
        let j = p.job(&p.alice, job).await;
        assert_eq!(j["state"], "running", "[{backend:?}] {j}");
        assert_eq!(j["attempts"], 1, "[{backend:?}] the same attempt");
        assert_eq!(
            agent.containers(job),
            before,
            "[{backend:?}] the same container"
        );
        let running = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{.State.Running}}", &before[0]])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&running.stdout).trim(), "true");
        let events = p
            .get_json(&p.alice, &format!("/api/v1/jobs/{job}/events"))
            .await;
        assert!(
            !events.to_string().contains("requeued"),
            "[{backend:?}] never requeued: {events}"
        );
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_another_protocol_is_refused_with_the_reason() {
    let p = TestPortal::start(crate::harness::Backend::Sqlite).await;
    let token = p.enrol_token("vision");
    let enrolled: serde_json::Value = p
        .http
        .post(format!("{}{}", p.url, commons_proto::ENROL_PATH))
        .json(&json!({"token": token, "hostname": "old-server", "agent_version": "0.0.1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let credential = enrolled["credential"].as_str().unwrap();
    let ws_url = format!(
        "{}{}",
        p.url.replacen("http", "ws", 1),
        commons_proto::CONNECT_PATH
    );
    let mut req = ws_url.into_client_request().unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {credential}").parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let hello = json!({"type": "hello", "agent_version": "0.0.1", "protocol": 1, "session": 1,
                       "seq": 1, "gpus": [], "attempts": []});
    ws.send(Message::text(hello.to_string())).await.unwrap();
    let close = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = ws.next().await {
            if let Ok(Message::Close(frame)) = m {
                return frame;
            }
        }
        None
    })
    .await
    .expect("the portal answers");
    let frame = close.expect("a close frame with a reason");
    assert!(
        frame
            .reason
            .contains(&format!("protocol {}", commons_proto::PROTOCOL_VERSION))
            && frame.reason.contains("agent 1"),
        "{frame:?}"
    );
    let nodes = p.get_json(&p.alice, "/api/v1/nodes").await;
    let old = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "old-server")
        .unwrap();
    assert_eq!(old["online"], false, "it stays offline");
    p.stop().await;
}
