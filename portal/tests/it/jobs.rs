//! Jobs through the API, end to end: portal + agent (fake GPUs) + Docker.

use crate::support::harness::{wait_for, TestPortal};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn job(cmd: &str, gpus: i64) -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": gpus,
           "time_limit_minutes": 5, "cpus": 0.5, "memory_gb": 0.25})
}

per_backend! {
    async fn failing_job_reports_exit_code_and_logs(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:2xA100-80GB").await;
        let id = p.submit(&p.alice, job("echo hello; exit 3", 1)).await;
        let j = p
            .wait_state(&p.alice, id, &["failed", "succeeded"], T)
            .await;
        assert_eq!(j["state"], "failed", "[{backend:?}] {j}");
        assert_eq!(j["exit_code"], 3, "[{backend:?}] {j}");
        assert_eq!(j["attempts"], 1);
        assert_eq!(j["node"], "vision-server");
        assert_eq!(j["gpus"].as_array().unwrap().len(), 1);
        assert!(j["started_at"].is_string() && j["finished_at"].is_string());
        // Output may trail the exit event by a moment.
        let me = &p;
        wait_for(Duration::from_secs(10), "logs", || async move {
            me.logs(&me.alice, id).await.contains("hello")
        })
        .await;
        let events = p
            .get_json(&p.alice, &format!("/api/v1/jobs/{id}/events"))
            .await;
        let states: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["state"].as_str().unwrap())
            .collect();
        assert_eq!(
            states,
            ["queued", "starting", "running", "failed"],
            "[{backend:?}]"
        );
        // Other users do not see it.
        let r = p
            .http
            .get(format!("{}/api/v1/jobs/{id}", p.url))
            .bearer_auth(&p.bob)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        p.stop().await;
    }
}

per_backend! {
    async fn two_gpu_job_waits_for_a_busy_gpu_then_starts(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:2xA100-80GB").await;
        let first = p.submit(&p.alice, job("sleep 4; echo first done", 1)).await;
        p.wait_state(&p.alice, first, &["running"], T).await;
        let second = p.submit(&p.alice, job("echo second", 2)).await;
        // While the first holds a GPU, the second waits, with a reason.
        let me = &p;
        wait_for(Duration::from_secs(10), "a waiting reason", || async move {
            let j = me.job(&me.alice, second).await;
            j["state"] == "queued"
                && j["reason"]
                    .as_str()
                    .is_some_and(|r| r != "waiting for the scheduler")
        })
        .await;
        let waiting = p.job(&p.alice, second).await;
        eprintln!("[{backend:?}] the 2-GPU job waits: {}", waiting["reason"]);
        assert_eq!(
            p.job(&p.alice, first).await["state"],
            "running",
            "[{backend:?}]"
        );
        let done = p
            .wait_state(&p.alice, second, &["succeeded", "failed"], T)
            .await;
        assert_eq!(done["state"], "succeeded", "[{backend:?}] {done}");
        assert_eq!(done["gpus"].as_array().unwrap().len(), 2);
        let first = p.job(&p.alice, first).await;
        assert_eq!(first["state"], "succeeded");
        assert!(
            done["started_at"].as_str().unwrap() >= first["finished_at"].as_str().unwrap(),
            "[{backend:?}] the 2-GPU job started before the GPU was free: {done} vs {first}"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn cancel_removes_the_running_container(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let agent = p.agent("vision", "fake:1xA100-80GB").await;
        let id = p.submit(&p.alice, job("sleep 300", 1)).await;
        p.wait_state(&p.alice, id, &["running"], T).await;
        assert_eq!(
            agent.containers(id).len(),
            1,
            "[{backend:?}] one container runs"
        );
        // Someone else may not cancel it.
        let (status, _) = p
            .post_json(&p.bob, &format!("/api/v1/jobs/{id}/cancel"), &json!({}))
            .await;
        assert_eq!(status, 404);
        let (status, v) = p
            .post_json(&p.alice, &format!("/api/v1/jobs/{id}/cancel"), &json!({}))
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["state"], "cancelled");
        let agent_ref = &agent;
        wait_for(
            Duration::from_secs(30),
            "the container to go",
            || async move { agent_ref.containers(id).is_empty() },
        )
        .await;
        // A second cancel is a conflict, not a crash.
        let (status, v) = p
            .post_json(&p.alice, &format!("/api/v1/jobs/{id}/cancel"), &json!({}))
            .await;
        assert_eq!(status, 409, "{v}");
        // The GPU is free again: a new job runs.
        let next = p.submit(&p.alice, job("true", 1)).await;
        let j = p
            .wait_state(&p.alice, next, &["succeeded", "failed"], T)
            .await;
        assert_eq!(j["state"], "succeeded", "[{backend:?}] {j}");
        p.stop().await;
    }
}

per_backend! {
    async fn bad_submissions_name_the_field_and_store_nothing(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let base = job("true", 1);
        let with = |key: &str, value: serde_json::Value| {
            let mut b = base.clone();
            b[key] = value;
            b
        };
        let without = |key: &str| {
            let mut b = base.clone();
            b.as_object_mut().unwrap().remove(key);
            b
        };
        let cases = [
            (without("image"), "image"),
            (with("image", json!("")), "image"),
            (with("image", json!("Not A/Valid:ref:")), "image"),
            (with("gpus", json!(0)), "gpus"),
            (with("gpus", json!(-2)), "gpus"),
            (with("gpus", json!(100000)), "gpus"),
            (with("gpus", json!("two")), "gpus"),
            (with("time_limit_minutes", json!(0)), "time_limit_minutes"),
            (
                with("command", json!(["sh", "-c", "x".repeat(70 * 1024)])),
                "command",
            ),
            (with("gpu_count", json!(1)), "gpu_count"),
            (with("lab", json!("physics")), "lab"),
            (with("kind", json!("forever")), "kind"),
        ];
        for (body, field) in cases {
            let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &body).await;
            assert!(
                (400..500).contains(&status),
                "[{backend:?}] {field}: {status} {v}"
            );
            assert_eq!(v["field"], field, "[{backend:?}] {v}");
            assert!(v["error"].is_string() && v["message"].is_string(), "{v}");
        }
        let (status, v) = p
            .post_json(&p.alice, "/api/v1/jobs", &json!("not an object"))
            .await;
        assert_eq!(status, 400, "{v}");
        let r = p
            .http
            .post(format!("{}/api/v1/jobs", p.url))
            .bearer_auth("gcp_wrong")
            .json(&base)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/jobs").await,
            json!([]),
            "[{backend:?}] nothing stored"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn missing_image_fails_with_the_reason(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        // Allowed (at a digest no image here has), but not on the server.
        let (status, _) = p
            .post_json(
                &p.olga,
                "/api/v1/images",
                &json!({"name_tag": "commons-no-such-image:v1", "digest": format!("sha256:{}", "e".repeat(64))}),
            )
            .await;
        assert_eq!(status, 201);
        let mut body = job("true", 1);
        body["image"] = json!("commons-no-such-image:v1");
        let id = p.submit(&p.alice, body).await;
        let j = p
            .wait_state(&p.alice, id, &["failed", "succeeded"], T)
            .await;
        assert_eq!(j["state"], "failed");
        let reason = j["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("not on this server"), "[{backend:?}] {j}");
        p.stop().await;
    }
}

per_backend! {
    async fn an_enrolment_token_works_once(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let agent = p.agent("vision", "fake:1xA100-80GB").await;
        // The same token again, straight at the endpoint ...
        let r = p
            .http
            .post(format!("{}/api/agent/v1/enrol", p.url))
            .json(&json!({"token": agent.token, "hostname": "intruder", "agent_version": "0"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(
            v["message"].as_str().unwrap().contains("used already"),
            "{v}"
        );
        // ... and through a second agent with a fresh state dir.
        let dir = tempfile::tempdir().unwrap();
        let mut config = agent.config.clone();
        config.state_dir = dir.path().into();
        let err = commons_agent::run(config).await.unwrap_err();
        assert!(format!("{err:#}").contains("used already"), "{err:#}");
        let nodes = p.get_json(&p.alice, "/api/v1/nodes").await;
        assert_eq!(
            nodes.as_array().unwrap().len(),
            1,
            "[{backend:?}] no second node"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn agent_restart_re_adopts_its_running_container(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let agent = p.agent("vision", "fake:1xA100-80GB").await;
        let id = p.submit(&p.alice, job("sleep 3; echo survived", 1)).await;
        p.wait_state(&p.alice, id, &["running"], T).await;
        // Kill the agent (not its container) and start it again with the same state dir.
        agent.task.abort();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            agent.containers(id).len(),
            1,
            "the container outlives the agent"
        );
        let mut config = agent.config.clone();
        config.enrol_token = None;
        let again = tokio::spawn(commons_agent::run(config));
        let j = p
            .wait_state(&p.alice, id, &["succeeded", "failed", "queued"], T)
            .await;
        assert_eq!(j["state"], "succeeded", "[{backend:?}] {j}");
        assert_eq!(j["attempts"], 1, "it ran once, not twice");
        again.abort();
        p.stop().await;
    }
}
