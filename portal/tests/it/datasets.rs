//! Lab datasets: registered by a lab's admins only (bad sources, names and visibility
//! refused naming the field; a second of the same name 409), shown to whom their
//! visibility allows, checked when a job names them (422 naming `datasets`); and with
//! real agents and the Docker Engine: a `lab:` dataset fetched once into a server's cache
//! and mounted read-only, a `node:` dataset read in place on the one server that exports
//! it, and a job whose dataset no server that fits it exports waits saying so.

use crate::support::files::{self as f, put};
use crate::support::harness::TestPortal;
use serde_json::{json, Value};
use std::time::Duration;

fn dataset(name: &str, source: &str, visibility: Value) -> Value {
    json!({"name": name, "source": source, "description": "test data", "visibility": visibility})
}

fn job_with(datasets: Value, command: &str, gpus: i64) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", command], "gpus": gpus,
           "time_limit_minutes": 10, "datasets": datasets})
}

const LAB: &str = "/api/v1/labs/vision/datasets";

/// The names of the datasets `token` may use.
async fn visible(p: &TestPortal, token: &str) -> Vec<String> {
    let v = p.get_json(token, "/api/v1/datasets").await;
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["lab"].as_str().unwrap(),
                d["name"].as_str().unwrap()
            )
        })
        .collect()
}

per_backend! {
    async fn datasets_are_registered_by_lab_admins_and_checked_at_submission(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |_| {}).await;
        p.portal.scheduler.abort();
        let a = put(&p, &p.carol, "/api/v1/labs/vision/files", "sets/cifar/a.bin", b"cifar\n").await;
        assert_eq!(a.status, 201, "{a}");
        let refused = |(s, v): (u16, Value), status: u16, field: &str, needle: &str| {
            assert_eq!(s, status, "[{backend:?}] {needle}: {v}");
            if !field.is_empty() {
                assert_eq!(v["field"], field, "{v}");
            }
            assert!(v["message"].as_str().unwrap_or("").contains(needle), "{needle}: {v}");
        };
        let sha = "ab".repeat(32);
        refused(p.post_json(&p.alice, LAB, &dataset("cifar", "lab:sets/cifar", json!("lab"))).await,
                403, "", "only the lab's admins");
        refused(p.post_json(&p.carol, LAB, &dataset("cifar", "/mnt/cifar", json!("lab"))).await,
                422, "source", "lab:PREFIX");
        refused(p.post_json(&p.carol, LAB, &dataset("x", "lab:nothing/here", json!("lab"))).await,
                422, "source", "no files under");
        refused(p.post_json(&p.carol, LAB, &dataset("x", "https://h/a.tar.gz", json!("lab"))).await,
                422, "source", "#sha256=");
        refused(p.post_json(&p.carol, LAB, &dataset("Bad Name", "node:x", json!("lab"))).await,
                422, "name", "lower-case");
        refused(p.post_json(&p.carol, LAB, &dataset("x", "node:x", json!("everyone"))).await,
                422, "visibility", "campus");
        let (s, v) = p.post_json(&p.carol, LAB, &dataset("cifar", "lab:sets/cifar/", json!("lab"))).await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(v["source"], "lab:sets/cifar/");
        refused(p.post_json(&p.carol, LAB, &dataset("cifar", "node:cifar", json!("lab"))).await,
                409, "", "already");
        let https = format!("https://data.campus.test/coco.tar.gz#sha256={sha}");
        let (s, v) = p.post_json(&p.carol, LAB, &dataset("coco", &https, json!(["physics"]))).await;
        assert_eq!(s, 201, "{v}");

        // Who sees what: members, the labs named, nobody else.
        assert_eq!(visible(&p, &p.alice).await, ["vision/cifar", "vision/coco"]);
        assert_eq!(visible(&p, &p.bob).await, ["vision/coco"]);

        // Submission: registered and visible, mounts clear of the container's paths.
        let ds = |name: &str, mount: Option<&str>| json!([{"lab": "vision", "name": name, "mount": mount}]);
        let (s, v) = p.post_json(&p.alice, "/api/v1/jobs", &job_with(ds("cifar", None), "true", 1)).await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(v["datasets"], json!([{"lab": "vision", "name": "cifar"}]));
        refused(p.post_json(&p.bob, "/api/v1/jobs", &job_with(ds("cifar", None), "true", 1)).await,
                422, "datasets", "does not share it");
        refused(p.post_json(&p.alice, "/api/v1/jobs", &job_with(ds("nope", None), "true", 1)).await,
                422, "datasets", "no such dataset");
        refused(p.post_json(&p.alice, "/api/v1/jobs", &job_with(ds("cifar", Some("/proc/x")), "true", 1)).await,
                422, "datasets", "/proc");
        let (s, v) = p.post_json(&p.bob, "/api/v1/jobs", &job_with(ds("coco", Some("/data/coco")), "true", 1)).await;
        assert_eq!(s, 201, "{v}");

        // Removal: the lab's admins only.
        let del = |t: &str| {
            let (p, t) = (&p, t.to_string());
            async move {
                p.http.delete(format!("{}{LAB}/coco", p.url)).bearer_auth(t).send().await.unwrap().status().as_u16()
            }
        };
        assert_eq!(del(&p.alice).await, 403);
        assert_eq!(del(&p.carol).await, 204);
        assert_eq!(del(&p.carol).await, 404);
        assert_eq!(visible(&p, &p.bob).await, Vec::<String>::new());
        p.stop().await;
    }
}

/// Waits until `job` ends; its final view and log.
async fn finished(p: &TestPortal, job: i64) -> (Value, String) {
    let done = p
        .wait_state(
            &p.alice,
            job,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(180),
        )
        .await;
    (done, p.logs(&p.alice, job).await)
}

/// With real agents: a `lab:` dataset fetched into the server's cache by the first job
/// and found there by the second, read-only; a `node:` dataset read in place where it is
/// exported; a job whose dataset no server exports waits, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_mount_lab_and_node_datasets_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(crate::support::harness::Backend::Sqlite, dir.path(), |_| {}).await;
    let lab_files = "/api/v1/labs/vision/files";
    for (path, data) in [
        ("sets/cifar/a.txt", "alpha\n"),
        ("sets/cifar/sub/b.txt", "beta\n"),
    ] {
        let a = put(&p, &p.carol, lab_files, path, data.as_bytes()).await;
        assert_eq!(a.status, 201, "{a}");
    }
    let export = tempfile::tempdir().unwrap();
    std::fs::write(export.path().join("labels.txt"), "imagenet labels\n").unwrap();
    for (name, source) in [
        ("cifar", "lab:sets/cifar"),
        ("imagenet", "node:imagenet"),
        ("missing", "node:missing"),
    ] {
        let (s, v) = p
            .post_json(&p.carol, LAB, &dataset(name, source, json!("lab")))
            .await;
        assert_eq!(s, 201, "{v}");
    }
    let exported = export.path().to_path_buf();
    let _a = p
        .agent_with(&p.url, "vision", "fake:1xA100-80GB", move |c| {
            c.datasets.exports.insert("imagenet".into(), exported);
        })
        .await;
    let _b = p.agent("vision", "fake:2xA100-80GB").await;

    // A lab: dataset, twice on the same server (the one with two GPUs).
    let read = "cat /datasets/cifar/a.txt /datasets/cifar/sub/b.txt; \
                if touch /datasets/cifar/new 2>/dev/null; then echo WROTE; else echo read-only; fi";
    let cifar = json!([{"lab": "vision", "name": "cifar"}]);
    let mut logs = Vec::new();
    for _ in 0..2 {
        let job = p.submit(&p.alice, job_with(cifar.clone(), read, 2)).await;
        let (done, log) = finished(&p, job).await;
        assert_eq!(done["state"], "succeeded", "{done}\n{log}");
        for line in ["alpha", "beta", "read-only"] {
            assert!(log.contains(line), "{line:?} in\n{log}");
        }
        assert!(!log.contains("WROTE"), "{log}");
        logs.push(log);
    }
    assert!(
        logs[0].contains("fetched into this server's cache"),
        "{}",
        logs[0]
    );
    assert!(logs[1].contains("from this server's cache"), "{}", logs[1]);
    // Each file came from its signed URL, never through the portal's per-file route.
    let hits = |route| crate::files_signed::route_hits(&p, route);
    assert_eq!(
        hits("/api/agent/v1/datasets/{job}/{attempt}/{index}/{path:.*}"),
        0
    );
    assert!(hits(crate::files_signed::OBJECT_ROUTE) > 0);

    // A node: dataset runs where it is exported (the 1-GPU server), read in place.
    let imagenet = json!([{"lab": "vision", "name": "imagenet", "mount": "/data/imagenet"}]);
    let job = p
        .submit(
            &p.alice,
            job_with(imagenet.clone(), "cat /data/imagenet/labels.txt", 1),
        )
        .await;
    let (done, log) = finished(&p, job).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{log}");
    assert!(log.contains("imagenet labels"), "{log}");
    assert!(log.contains("the server's export imagenet"), "{log}");

    // Two GPUs and the export: no server has both; nothing exports `missing`.
    let waits = |job: i64, needle: &'static str| {
        let p = &p;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let v = p.get_json(&p.alice, &format!("/api/v1/jobs/{job}")).await;
                let reason = v["reason"].as_str().unwrap_or("").to_string();
                if reason.contains(needle) {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "{needle:?}: {v}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let big = p.submit(&p.alice, job_with(imagenet, "true", 2)).await;
    waits(big, "needs dataset vision/imagenet, exported by").await;
    let none = json!([{"lab": "vision", "name": "missing"}]);
    let gone = p.submit(&p.alice, job_with(none, "true", 1)).await;
    waits(
        gone,
        "needs dataset vision/missing, which no server exports now",
    )
    .await;
    let listed = p.get_json(&p.alice, LAB).await;
    let imagenet = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "imagenet")
        .unwrap();
    assert_eq!(
        imagenet["exported_by"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let cifar = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "cifar")
        .unwrap();
    assert_eq!(cifar["cached_on"], 1, "{listed}");

    // Checked again at the start: a dataset removed while its job waited fails the job,
    // naming it.
    let first = p.submit(&p.alice, job_with(json!([]), "sleep 3", 2)).await;
    let mut later = job_with(json!([{"lab": "vision", "name": "cifar"}]), "true", 2);
    later["after"] = json!([{"job": first, "when": "ok"}]);
    let later = p.submit(&p.alice, later).await;
    let r = p
        .http
        .delete(format!("{}{LAB}/cifar", p.url))
        .bearer_auth(&p.carol)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let (done, log) = finished(&p, later).await;
    assert_eq!(done["state"], "failed", "{done}\n{log}");
    let why = format!("{done}{log}");
    assert!(
        why.contains("dataset vision/cifar: no such dataset"),
        "{why}"
    );
    p.stop().await;
}
