//! Jobs that wait for other jobs (issue 30): `after: [{"job": A, "when": "ok|fail|any"}]`
//! with a real agent (fake GPUs, the real Docker Engine). A waiting job says what it
//! waits for; a wait that can no longer be met ends the job at once as failed with the
//! reason, and so does the chain behind it; only one's own jobs (or one's lab's, for its
//! admins) may be named.

use crate::cli::Cli;
use crate::support::harness::TestPortal;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn job(cmd: &str, after: Value) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 5, "cpus": 0.5, "memory_gb": 0.25, "after": after})
}

fn finished(j: &Value) -> chrono::NaiveDateTime {
    j["finished_at"].as_str().unwrap().parse().unwrap()
}

per_backend! {
    async fn waits_start_on_time_and_unmeetable_ones_fail_at_once(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:2xA100-80GB").await;
        let a = p.submit(&p.alice, job("sleep 4; exit 1", json!([]))).await;
        let b = p.submit(&p.alice, job("echo b", json!([{"job": a, "when": "ok"}]))).await;
        let c = p.submit(&p.alice, job("echo cleanup", json!([{"job": a, "when": "fail"}]))).await;
        // The CLI's flag makes the same wait.
        let cli = Cli::new();
        cli.ok(&["login", &p.url, "--token", &p.alice]).await;
        let c_id = c.to_string();
        let r = cli.ok(&["run", "commons-demo:latest", "--cpus", "0.5", "--memory", "0.25",
            "--after-ok", &c_id, "--", "sh", "-c", "echo d"]).await;
        let d: i64 = r.stdout.trim().parse().unwrap();
        let e = p.submit(&p.alice, job("echo e", json!([{"job": b, "when": "any"}]))).await;
        let f = p.submit(&p.alice, job("echo f", json!([{"job": b}]))).await;

        // While A runs, the others say what they wait for, with no place in the queue.
        p.wait_state(&p.alice, a, &["running"], T).await;
        for (id, on, verb) in [(b, a, "succeed"), (c, a, "fail"), (d, c, "succeed"), (e, b, "end")] {
            let j = p.job(&p.alice, id).await;
            assert_eq!(j["state"], "queued", "[{backend:?}] {j}");
            assert_eq!(j["reason"], format!("waiting for job {on} to {verb}"), "[{backend:?}] {j}");
            assert!(j.get("queue_position").is_none() && j.get("estimated_start_at").is_none(),
                "[{backend:?}] a held job has no place in the queue: {j}");
        }
        assert_eq!(p.job(&p.alice, d).await["after"], json!([{"job": c, "when": "ok"}]));

        // A fails: B (after ok) fails at once, and F (after B) with it; C (after fail)
        // runs, then D; E (after any of B) runs.
        let ja = p.wait_state(&p.alice, a, &["failed"], T).await;
        let jb = p.wait_state(&p.alice, b, &["failed", "succeeded"], Duration::from_secs(15)).await;
        assert_eq!(jb["state"], "failed", "[{backend:?}] {jb}");
        assert_eq!(jb["reason"], format!("job {a} failed; this job needed it to succeed"), "[{backend:?}]");
        assert_eq!(jb["attempts"], 0, "[{backend:?}] it never ran");
        let late = (finished(&jb) - finished(&ja)).num_milliseconds();
        eprintln!("[{backend:?}] the dependent failed {late} ms after the job it needed");
        assert!(late < 5000, "[{backend:?}] failed at once, not {late} ms later");
        let jf = p.wait_state(&p.alice, f, &["failed"], Duration::from_secs(15)).await;
        assert_eq!(jf["reason"], format!("job {b} failed; this job needed it to succeed"));
        let events = p.get_json(&p.alice, &format!("/api/v1/jobs/{b}/events")).await;
        let last = events.as_array().unwrap().last().unwrap().clone();
        assert_eq!((last["state"].as_str(), last["message"].as_str()),
            (Some("failed"), jb["reason"].as_str()), "[{backend:?}] in its history too");
        for id in [c, d, e] {
            let j = p.wait_state(&p.alice, id, &["succeeded", "failed"], T).await;
            assert_eq!(j["state"], "succeeded", "[{backend:?}] {j}");
        }
        let jc = p.job(&p.alice, c).await;
        let jd = p.job(&p.alice, d).await;
        let started: chrono::NaiveDateTime = jd["started_at"].as_str().unwrap().parse().unwrap();
        assert!(started >= finished(&jc), "[{backend:?}] D started after C ended");

        // Only one's own jobs, or one's lab's for its admins; refusals name `after` and
        // store nothing.
        let bobs = p.submit(&p.bob, job("true", json!([]))).await;
        for after in [json!([{"job": bobs}]), json!([{"job": 987_654_321}]),
                      json!([{"job": a, "when": "later"}]), json!([{"job": a}, {"job": a}])] {
            let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &job("true", after.clone())).await;
            assert_eq!(status, 422, "[{backend:?}] {after}: {v}");
            assert!(v["field"].as_str().unwrap().starts_with("after"), "[{backend:?}] {after}: {v}");
        }
        let (status, v) = p.post_json(&p.carol, "/api/v1/jobs",
            &job("true", json!([{"job": a, "when": "any"}]))).await;
        assert_eq!(status, 201, "[{backend:?}] the lab's admin may wait for its jobs: {v}");
        let r = cli.run(&["run", "commons-demo:latest", "--after-ok", &bobs.to_string(), "--", "true"]).await;
        assert_ne!(r.code, 0, "[{backend:?}] {r}");
        assert!(r.stderr.contains("after"), "[{backend:?}] {r}");
        p.stop().await;
    }
}

fn array(cmd: &str, spec: &str, after: Value) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 5, "cpus": 0.1, "memory_gb": 0.125, "array": spec,
           "after": after})
}

per_backend! {
    async fn tasks_wait_per_index_and_fail_alone_when_their_own_task_fails(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:4xA100-80GB").await;
        // Array A: task 2 fails, the others succeed, task 3 last.
        let (s, a) = p.post_json(&p.alice, "/api/v1/jobs", &array(
            "sleep 3; [ {index} = 3 ] && sleep 3; [ {index} != 2 ]", "0-3", json!([]))).await;
        assert_eq!(s, 201, "[{backend:?}] {a}");
        let a_id = a["id"].as_i64().unwrap();
        let a_tasks: Vec<i64> = a["tasks"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect();
        // Array B waits per index (through the CLI's flag).
        let cli = Cli::new();
        cli.ok(&["login", &p.url, "--token", &p.alice]).await;
        let r = cli.ok(&["run", "commons-demo:latest", "--cpus", "0.1", "--memory", "0.125",
            "--array", "0-3", "--after-ok-per-index", &a_id.to_string(),
            "--", "sh", "-c", "echo b{index}"]).await;
        let b_id: i64 = r.stdout.trim().parse().unwrap();
        let b = p.get_json(&p.alice, &format!("/api/v1/arrays/{b_id}")).await;
        let b_tasks: Vec<i64> = b["tasks"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect();
        assert_eq!(b_tasks.len(), 4, "[{backend:?}] {b}");
        let j = p.job(&p.alice, b_tasks[1]).await;
        assert_eq!(j["after"], json!([{"array": a_id, "when": "ok", "per_index": true}]), "[{backend:?}] {j}");
        for (i, &t) in b_tasks.iter().enumerate() {
            let j = p.job(&p.alice, t).await;
            if j["state"] == "queued" {
                assert_eq!(j["reason"], format!("waiting for task {i} of array {a_id} to succeed"),
                    "[{backend:?}] {j}");
            }
        }

        // Task 2 of A fails: task 2 of B fails at once, alone; the others run after their
        // own task of A succeeded.
        let a2 = p.wait_state(&p.alice, a_tasks[2], &["failed"], T).await;
        let b2 = p.wait_state(&p.alice, b_tasks[2], &["failed", "succeeded"], Duration::from_secs(15)).await;
        assert_eq!(b2["state"], "failed", "[{backend:?}] {b2}");
        assert_eq!(b2["reason"], format!("task 2 of array {a_id} failed; this task needed it to succeed"),
            "[{backend:?}] {b2}");
        assert_eq!(b2["attempts"], 0, "[{backend:?}] it never ran");
        let late = (finished(&b2) - finished(&a2)).num_milliseconds();
        assert!(late < 5000, "[{backend:?}] failed at once, not {late} ms later");
        let b3 = p.job(&p.alice, b_tasks[3]).await;
        assert_eq!(b3["state"], "queued", "[{backend:?}] task 3 still waits for its own: {b3}");
        for i in [0, 1, 3] {
            let bj = p.wait_state(&p.alice, b_tasks[i], &["succeeded", "failed"], T).await;
            assert_eq!(bj["state"], "succeeded", "[{backend:?}] task {i}: {bj}");
            let aj = p.job(&p.alice, a_tasks[i]).await;
            let started: chrono::NaiveDateTime = bj["started_at"].as_str().unwrap().parse().unwrap();
            assert!(started >= finished(&aj), "[{backend:?}] task {i} of B started after task {i} of A ended");
        }
        assert_eq!(p.logs(&p.alice, b_tasks[3]).await.trim(), "b3", "[{backend:?}]");

        // Refusals name `after[i].per_index` and store nothing: a single job, and an
        // array with other indices (both counts said).
        let mut single = job("true", json!([{"array": a_id, "per_index": true}]));
        single["after"] = json!([{"job": a_tasks[0]}, {"array": a_id, "per_index": true}]);
        let (s, v) = p.post_json(&p.alice, "/api/v1/jobs", &single).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("after[1].per_index")), "[{backend:?}] {v}");
        let (s, v) = p.post_json(&p.alice, "/api/v1/jobs",
            &array("true", "0-4", json!([{"array": a_id, "when": "ok", "per_index": true}]))).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("after[0].per_index")), "[{backend:?}] {v}");
        let m = v["message"].as_str().unwrap();
        assert!(m.contains("4 tasks (0-3)") && m.contains("5 (0-4)"), "[{backend:?}] {m}");
        p.stop().await;
    }
}
