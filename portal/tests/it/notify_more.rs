//! Notifications beyond a job's own states (issue 30), with real parts: an array sends one
//! `array_finished` message with its counts and none per task, to a real webhook
//! receiver that checks the signature; an interactive job with a one-minute limit hears
//! `ending` before the portal's time limit ends it, once.

use crate::notifications::{test_portal, Receiver, SECRET};
use crate::support::harness::Backend;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

/// Waits until the user's delivery log satisfies `check`; says what it held on timeout.
async fn wait_log(
    p: &crate::support::harness::TestPortal,
    what: &str,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + T;
    loop {
        let log = p
            .get_json(&p.alice, "/api/v1/me/notifications/deliveries")
            .await;
        let rows = log.as_array().cloned().unwrap_or_default();
        if check(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the log: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

per_backend! {
    async fn an_array_sends_one_message_with_its_counts_and_none_per_task(backend: Backend) {
        let p = test_portal(backend).start().await;
        let rx = Receiver::start(0);
        // Every event (no `events`): still nothing per task.
        let (s, v) = p.put_json(&p.alice, "/api/v1/me/notifications",
            &json!({"webhooks": [{"url": rx.url, "secret": SECRET}]})).await;
        assert_eq!(s, 200, "[{backend:?}] {v}");
        let _agent = p.agent("vision", "fake:4xA100-80GB").await;
        let (s, a) = p.post_json(&p.alice, "/api/v1/jobs", &json!({
            "image": "commons-demo:latest", "command": ["sh", "-c", "sleep 1; [ {index} != 1 ]"],
            "gpus": 1, "time_limit_minutes": 5, "cpus": 0.1, "memory_gb": 0.125,
            "array": "0-3%2", "name": "sweep"})).await;
        assert_eq!(s, 201, "[{backend:?}] {a}");
        let id = a["id"].as_i64().unwrap();
        let calls = rx.wait("the array's message", |c| !c.is_empty()).await;
        let e: Value = serde_json::from_str(&calls[0].body).unwrap();
        assert_eq!(e["type"], "array.finished", "[{backend:?}] {e}");
        assert_eq!(calls[0].id, format!("arr_{id}"), "[{backend:?}] a stable event id");
        assert_eq!(calls[0].status, 200, "[{backend:?}] the signature checked out: {calls:?}");
        let arr = &e["data"]["array"];
        assert_eq!((arr["id"].as_i64(), arr["name"].as_str(), arr["count"].as_i64()),
            (Some(id), Some("sweep"), Some(4)), "[{backend:?}] {e}");
        assert_eq!((arr["succeeded"].as_i64(), arr["failed"].as_i64(), arr["cancelled"].as_i64()),
            (Some(3), Some(1), Some(0)), "[{backend:?}] {e}");
        assert_eq!(e["data"]["message"],
            format!("array {id} (sweep) finished: 3 succeeded, 1 failed, 0 cancelled"), "[{backend:?}]");
        // The log holds that one delivery and nothing for a task: every task event was
        // read before (or with) the last one, which made the array's message.
        let log = wait_log(&p, "the delivery sent", |r| r.iter().any(|d| d["status"] == "sent")).await;
        assert_eq!(log.len(), 1, "[{backend:?}] {log:?}");
        assert_eq!(log[0]["event"], "array_finished", "[{backend:?}] {log:?}");
        assert_eq!(log[0]["job"], a["first_job"], "[{backend:?}] {log:?}");
        let a2 = p.get_json(&p.alice, &format!("/api/v1/arrays/{id}")).await;
        assert_eq!(a2["finished"], true, "[{backend:?}] {a2}");
        assert_eq!(rx.calls().len(), 1, "[{backend:?}] {:#?}", rx.calls());

        // An array's own list without array_finished (nor failed) sends nothing.
        let (s, b) = p.post_json(&p.alice, "/api/v1/jobs", &json!({
            "image": "commons-demo:latest", "command": ["true"], "gpus": 1,
            "time_limit_minutes": 5, "cpus": 0.1, "memory_gb": 0.125,
            "array": "0-1", "notify": ["start"]})).await;
        assert_eq!(s, 201, "[{backend:?}] {b}");
        // ...while one with `end` sends it: submitted after, so when its message has
        // come the first one's would have too.
        let (s, c) = p.post_json(&p.alice, "/api/v1/jobs", &json!({
            "image": "commons-demo:latest", "command": ["true"], "gpus": 1,
            "time_limit_minutes": 5, "cpus": 0.1, "memory_gb": 0.125,
            "array": "0-1", "notify": ["end"], "after": [{"array": b["id"], "when": "any"}]})).await;
        assert_eq!(s, 201, "[{backend:?}] {c}");
        let calls = rx.wait("the third array's message", |c| c.len() >= 2).await;
        assert_eq!(calls[1].id, format!("arr_{}", c["id"]), "[{backend:?}] {calls:#?}");
        let (s, v) = p.post_json(&p.alice, "/api/v1/jobs", &json!({
            "image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5,
            "array": "0-1", "notify": ["sometimes"]})).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("notify")), "[{backend:?}] {v}");
        assert_eq!(rx.calls().len(), 2, "[{backend:?}] {:#?}", rx.calls());
        p.stop().await;
    }
}

/// An interactive job with a one-minute limit hears `ending` within its last tenth (6 s)
/// of it, with when it will end and why, once; then the time limit ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_job_hears_it_is_about_to_end() {
    let p = test_portal(Backend::Sqlite).start().await;
    let rx = Receiver::start(0);
    let (s, v) = p
        .put_json(
            &p.alice,
            "/api/v1/me/notifications",
            &json!({"webhooks": [{"url": rx.url, "secret": SECRET}], "events": ["ending"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let id = p
        .submit(
            &p.alice,
            json!({"image": "commons-demo:latest", "gpus": 1, "kind": "interactive",
               "time_limit_minutes": 1, "cpus": 0.5, "memory_gb": 0.25}),
        )
        .await;
    p.wait_state(&p.alice, id, &["running"], T).await;
    let calls = rx.wait("job.ending", |c| !c.is_empty()).await;
    let got = calls[0].at;
    let e: Value = serde_json::from_str(&calls[0].body).unwrap();
    assert_eq!(e["type"], "job.ending", "{e}");
    assert_eq!(e["data"]["reason"], "time limit", "{e}");
    assert_eq!(e["data"]["job"]["id"], id, "{e}");
    assert_eq!(calls[0].id, format!("end_{id}_1_time_limit"), "{e}");
    let ends = chrono::DateTime::parse_from_rfc3339(e["data"]["ends_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let left = (ends - got).num_milliseconds();
    eprintln!("the notice came {left} ms before the time limit");
    assert!(
        (0..=6_500).contains(&left),
        "told {left} ms before its end: {e}"
    );
    assert!(
        e["data"]["message"]
            .as_str()
            .unwrap()
            .contains("(time limit)"),
        "{e}"
    );
    // The time limit ends it; the notice came before, and only once.
    let j = p
        .wait_state(&p.alice, id, &["failed", "succeeded", "cancelled"], T)
        .await;
    let finished: chrono::NaiveDateTime = j["finished_at"].as_str().unwrap().parse().unwrap();
    assert!(finished.and_utc() > got, "ended after the notice: {j}");
    let log = wait_log(&p, "the ending delivery", |r| !r.is_empty()).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(rx.calls().len(), 1, "{:#?}", rx.calls());
}
