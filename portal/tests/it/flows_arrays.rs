//! Job arrays (issue 30): `"array": "0-19%3"` makes 20 tasks from one request, with a
//! real agent (fake GPUs, the real Docker Engine). The throttle is judged on the
//! engine's own timeline (`docker events`): never more than 3 containers of the array at
//! once; each task sees its index; a job waiting for the whole array starts when it has
//! succeeded, and fails at once when it was cancelled; cancelling the array stops every
//! task; bad specs are refused naming `array`. An ignored test times a 10,000-task submission.

use crate::support::harness::{wait_for, Backend, TestPortal};
use crate::support::session::BrowserSession;
use crate::support::timeline::Timeline;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(240);

fn array(cmd: &str, spec: &str) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 5, "cpus": 0.1, "memory_gb": 0.125, "array": spec,
           "env": {"RUN": "run-{index}"}})
}

async fn submit_array(p: &TestPortal, body: Value) -> Value {
    let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &body).await;
    assert_eq!(status, 201, "[{:?}] {v}", p.backend);
    v
}

fn ids(v: &Value) -> Vec<i64> {
    v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

/// The most containers of `tasks` that ran at the same time, from the engine's events.
fn most_at_once(t: &Timeline, tasks: &[i64]) -> (usize, usize) {
    let mut edges: Vec<(u128, i32)> = Vec::new();
    let mut seen = 0;
    for &job in tasks {
        for (_, start, end) in t.intervals(job) {
            seen += 1;
            edges.push((start, 1));
            edges.push((end, -1));
        }
    }
    // An end before a start at the same instant.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    (most as usize, seen)
}

per_backend! {
    async fn an_array_runs_at_most_its_throttle_and_cancels_whole(backend: Backend) {
        let p = TestPortal::start(backend).await;
        // The timeline knows containers by job id alone: ids no other test uses.
        p.spread_job_ids().await;
        let timeline = Timeline::start();
        let _agent = p.agent("vision", "fake:8xA100-80GB").await;
        let v = submit_array(&p, array(
            "echo task={index} index=$COMMONS_ARRAY_INDEX of=$COMMONS_ARRAY_COUNT \
             array=$COMMONS_ARRAY_ID run=$RUN; sleep 2", "0-19%3")).await;
        let tasks = ids(&v);
        assert_eq!((v["count"].as_i64(), tasks.len(), v["throttle"].as_i64()),
            (Some(20), 20, Some(3)), "[{backend:?}] {v}");
        let id = v["id"].as_i64().unwrap();
        // An evaluation that waits for the whole sweep.
        let mut eval = json!({"image": "commons-demo:latest", "command": ["echo", "eval"],
            "gpus": 1, "time_limit_minutes": 5, "cpus": 0.1, "memory_gb": 0.125,
            "after": [{"array": id, "when": "ok"}]});
        let evaluation = p.submit(&p.alice, eval.clone()).await;
        let j = p.job(&p.alice, evaluation).await;
        assert_eq!(j["reason"], format!("waiting for array {id} to succeed"), "[{backend:?}] {j}");

        // While it runs, the array's counts never show more than 3 started or running.
        let mut most_seen = 0;
        let deadline = Instant::now() + T;
        loop {
            let a = p.get_json(&p.alice, &format!("/api/v1/arrays/{id}")).await;
            let active: i64 = ["starting", "running", "preempting"].iter()
                .filter_map(|s| a["states"][*s].as_i64()).sum();
            most_seen = most_seen.max(active);
            assert!(active <= 3, "[{backend:?}] {active} tasks at once: {a}");
            if a["finished"] == true {
                assert_eq!(a["states"]["succeeded"], 20, "[{backend:?}] {a}");
                break;
            }
            assert!(Instant::now() < deadline, "[{backend:?}] the array did not end: {a}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The engine agrees: 20 containers, never more than 3 at once.
        wait_for(Duration::from_secs(30), "20 containers on the timeline", || async {
            most_at_once(&timeline, &tasks).1 >= 20
        }).await;
        let (most, seen) = most_at_once(&timeline, &tasks);
        eprintln!("[{backend:?}] 20 tasks, %3: at most {most} containers at once \
                   (the API's counts showed {most_seen})");
        assert_eq!(seen, 20, "[{backend:?}]");
        assert!((1..=3).contains(&most), "[{backend:?}] {most} at once");
        // Each task saw its index, in its command, its environment and its variables.
        for (i, job) in tasks.iter().enumerate() {
            let log = p.logs(&p.alice, *job).await;
            let want = format!("task={i} index={i} of=20 array={id} run=run-{i}");
            assert!(log.contains(&want), "[{backend:?}] task {job}: {log:?}, not {want:?}");
        }

        let j = p.wait_state(&p.alice, evaluation, &["succeeded", "failed"], T).await;
        assert_eq!(j["state"], "succeeded", "[{backend:?}] the wait on the array was met: {j}");

        // A second array, cancelled whole while two run: every task ends cancelled and
        // the running containers stop.
        let v = submit_array(&p, array("sleep 300", "1,3,5-9%2")).await;
        let (id, tasks) = (v["id"].as_i64().unwrap(), ids(&v));
        assert_eq!(tasks.len(), 7, "[{backend:?}] {v}");
        wait_for(T, "two tasks running", || async {
            let a = p.get_json(&p.alice, &format!("/api/v1/arrays/{id}")).await;
            a["states"]["running"] == 2
        }).await;
        let (status, a) = p.post_json(&p.alice, &format!("/api/v1/arrays/{id}/cancel"), &json!({})).await;
        assert_eq!(status, 200, "[{backend:?}] {a}");
        assert_eq!(a["states"]["cancelled"], 7, "[{backend:?}] {a}");
        assert_eq!(a["finished"], true, "[{backend:?}] {a}");
        for job in &tasks {
            let j = p.job(&p.alice, *job).await;
            assert_eq!(j["state"], "cancelled", "[{backend:?}] {j}");
        }
        // A wait on it can no longer be met; a wait on a stranger's array is refused.
        eval["after"] = json!([{"array": id, "when": "ok"}]);
        let late = p.submit(&p.alice, eval.clone()).await;
        let j = p.wait_state(&p.alice, late, &["failed"], Duration::from_secs(30)).await;
        assert_eq!(j["reason"], format!("array {id} was cancelled; this job needed it to succeed"),
            "[{backend:?}] {j}");
        let (status, v) = p.post_json(&p.bob, "/api/v1/jobs", &eval).await;
        assert_eq!((status, v["field"].as_str()), (422, Some("after")), "[{backend:?}] {v}");
        wait_for(Duration::from_secs(90), "the running tasks' containers to stop", || async {
            let ran: Vec<_> = tasks.iter().flat_map(|j| timeline.intervals(*j)).collect();
            ran.len() == 2 && ran.iter().all(|(_, _, end)| *end != u128::MAX)
        }).await;
        // Another user cannot see or cancel it.
        let (status, _) = p.post_json(&p.bob, &format!("/api/v1/arrays/{id}/cancel"), &json!({})).await;
        assert_eq!(status, 404, "[{backend:?}]");
        p.stop().await;
    }
}

per_backend! {
    async fn bad_array_specs_are_refused_naming_array(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let before = p.get_json(&p.alice, "/api/v1/jobs").await.as_array().unwrap().len();
        for spec in ["0-100000", "0-99999,100000", "1-x", "9-1", "0-9:0", "0-9%0", "", "1,1"] {
            let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &array("true", spec)).await;
            assert_eq!(status, 422, "[{backend:?}] {spec:?}: {v}");
            assert_eq!(v["field"], "array", "[{backend:?}] {spec:?}: {v}");
            eprintln!("[{backend:?}] {spec:?}: {}", v["message"]);
        }
        let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &array("true", "0-100000")).await;
        assert!(status == 422 && v["message"].as_str().unwrap().contains("100001"),
            "[{backend:?}] says how many: {v}");
        // A field an array does not take, an unknown event (arrays take `notify`: their one
        // message), and an input that is not there, are named.
        for (field, value) in [
            ("app", json!({"port": 8888})),
            ("notify", json!(["end", "sometimes"])),
            ("inputs", json!(["no/such/file"])),
        ] {
            let mut body = array("true", "0-3");
            body[field] = value;
            let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &body).await;
            assert_eq!((status, v["field"].as_str()), (422, Some(field)), "[{backend:?}] {v}");
        }
        let after = p.get_json(&p.alice, "/api/v1/jobs").await.as_array().unwrap().len();
        assert_eq!(before, after, "[{backend:?}] nothing stored");

        // No server here: an array of 5 with %2 waits; beyond the throttle its tasks say
        // so; the job list shows it as one row, linking to its tasks.
        p.submit(&p.alice, json!({"image": "commons-demo:latest", "gpus": 1,
            "time_limit_minutes": 5})).await;
        let v = submit_array(&p, array("true", "10-14%2")).await;
        let (id, tasks) = (v["id"].as_i64().unwrap(), ids(&v));
        let listed = p.get_json(&p.alice, &format!("/api/v1/jobs?array={id}")).await;
        let indices: Vec<i64> = listed.as_array().unwrap().iter()
            .map(|j| j["array_index"].as_i64().unwrap()).collect();
        assert_eq!(indices, vec![10, 11, 12, 13, 14], "[{backend:?}] {listed}");
        let last = p.job(&p.alice, tasks[4]).await;
        assert_eq!(last["reason"], format!("array throttle: at most 2 tasks of array {id} run at once"),
            "[{backend:?}] {last}");
        let alice = BrowserSession::login(&p, "alice").await;
        let (status, html) = crate::pages::page(&alice, &p, "/jobs").await;
        assert_eq!(status, 200);
        assert_eq!(html.matches("<tr data-array=").count(), 1, "[{backend:?}] {html}");
        assert_eq!(html.matches("<tr data-job=").count(), 1, "[{backend:?}] the single job");
        assert!(html.contains("5 queued"), "[{backend:?}] counts by state: {html}");
        assert!(html.contains(&format!("href=\"/jobs?array={id}\"")), "[{backend:?}] {html}");
        let (_, html) = crate::pages::page(&alice, &p, &format!("/jobs?array={id}")).await;
        assert_eq!(html.matches("<tr data-job=").count(), 5, "[{backend:?}] its tasks: {html}");
        assert!(html.contains("id=\"cancel-array\""), "[{backend:?}] a cancel button: {html}");
        let r = alice.post_form(&format!("/arrays/{id}/cancel"), &[]).await;
        assert!(r.status().is_success() || r.status().is_redirection(), "[{backend:?}] {r:?}");
        let a = p.get_json(&p.alice, &format!("/api/v1/arrays/{id}")).await;
        assert_eq!(a["states"]["cancelled"], 5, "[{backend:?}] cancelled from the page: {a}");
        let (status, _) = crate::pages::page(&alice, &p, "/jobs?array=x").await;
        assert!(status >= 400, "[{backend:?}] a bad array filter is refused");

        // The CLI: `run --array` prints the array's id, `ls` shows each array as one
        // line, `cancel --array` cancels its tasks; a bad spec is refused before sending.
        let cli = crate::cli::Cli::new();
        cli.ok(&["login", &p.url, "--token", &p.alice]).await;
        let r = cli.ok(&["run", "commons-demo:latest", "--cpus", "0.1", "--memory", "0.125",
            "--array", "0-2%1", "--", "echo", "{index}"]).await;
        let from_cli: i64 = r.stdout.trim().parse().unwrap();
        assert!(r.stderr.contains("3 tasks"), "[{backend:?}] {r}");
        let r = cli.ok(&["ls"]).await;
        for a in [id, from_cli] {
            assert_eq!(r.stdout.matches(&format!("array-{a} ")).count(), 1, "[{backend:?}] {r}");
        }
        let r = cli.ok(&["cancel", "--array", &from_cli.to_string()]).await;
        assert!(r.stdout.contains("3 cancelled"), "[{backend:?}] {r}");
        let r = cli.run(&["run", "commons-demo:latest", "--array", "5-1", "--", "true"]).await;
        assert!(r.code != 0 && r.stderr.contains("array"), "[{backend:?}] {r}");
        p.stop().await;
    }
}

/// A figure, run by hand: `cargo test -p commons-portal --test it -- --ignored
/// arrays_submit_10000`.
async fn submit_10000(backend: Backend) {
    let p = TestPortal::start(backend).await;
    let mut took = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        let v = submit_array(&p, array("echo {index}", "0-9999%8")).await;
        took.push(t0.elapsed().as_millis());
        assert_eq!(ids(&v).len(), 10_000);
    }
    eprintln!("[{backend:?}] FIGURE: a 10,000-task array accepted in {took:?} ms (3 tries)");
    assert!(
        took.iter().min().unwrap() < &1000,
        "[{backend:?}] {took:?} ms"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure, run by hand"]
async fn arrays_submit_10000_sqlite() {
    submit_10000(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure, run by hand"]
async fn arrays_submit_10000_postgres() {
    submit_10000(Backend::Postgres).await
}
