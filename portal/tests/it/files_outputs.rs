//! A job's outputs, the portal's side: the agents' outputs API (acting as the agent, with
//! real node credentials), kept in the owner's files under `jobs/{id}/`, listed for the
//! owner (`GET /api/v1/jobs/{id}/outputs`, the job page), downloaded by `commons get`,
//! and given back to the job's next attempt on another server.

use crate::checkpoints::{enrol, place, run, running_job};
use crate::cli::Cli;
use crate::support::files::{self as f, get, noise, paths, sha256};
use crate::support::harness::TestPortal;
use commons_proto::{output_file_path, outputs_path, SHA256_HEADER};
use serde_json::Value;

/// Acts as an agent: PUT one output file of `attempt`.
async fn put_output(
    p: &TestPortal,
    credential: &str,
    job: i64,
    attempt: i32,
    path: &str,
    data: &[u8],
) -> f::Answer {
    let url = output_file_path(job, attempt, &commons_api::files::encode_path(path));
    let r = p
        .http
        .put(format!("{}{url}", p.url))
        .bearer_auth(credential)
        .header(SHA256_HEADER, sha256(data))
        .body(data.to_vec())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    f::Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

/// Acts as an agent: GET `path` (the listing when it is empty) for `attempt`.
async fn get_output(
    p: &TestPortal,
    credential: &str,
    job: i64,
    attempt: i32,
    path: &str,
) -> (u16, Vec<u8>) {
    let url = if path.is_empty() {
        outputs_path(job, attempt)
    } else {
        output_file_path(job, attempt, &commons_api::files::encode_path(path))
    };
    let r = p
        .http
        .get(format!("{}{url}", p.url))
        .bearer_auth(credential)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

per_backend! {
    async fn outputs_are_the_owners_files_and_come_back_to_the_next_attempt(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |c| c.user_quota_gb = 0.001).await;
        p.portal.scheduler.abort();
        let (node, cred) = enrol(&p, "vision", "gpu-a").await;
        let (other, cred2) = enrol(&p, "vision", "gpu-b").await;
        let job = running_job(&p, node).await;
        let weights = noise(300_000, 4);
        let a = put_output(&p, &cred, job, 1, "model/w.bin", &weights).await;
        assert_eq!(a.status, 200, "[{backend:?}] {a}");
        assert_eq!(a.body["path"], format!("jobs/{job}/model/w.bin"));
        // Only the attempt's node, good paths, within the owner's quota.
        assert_eq!(put_output(&p, &cred2, job, 1, "x", b"x").await.status, 404);
        assert_eq!(put_output(&p, "nonsense", job, 1, "x", b"x").await.status, 401);
        let a = put_output(&p, &cred, job, 1, "a//b", b"x").await;
        assert_eq!((a.status, a.body["field"].as_str()), (422, Some("path")), "{a}");
        let a = put_output(&p, &cred, job, 1, "big.bin", &noise(800_000, 5)).await;
        assert_eq!((a.status, a.body["error"].as_str()), (413, Some("file_quota")), "{a}");

        // The owner sees them; the lab's admin sees the job but not its owner's files.
        let listed = p.get_json(&p.alice, &format!("/api/v1/jobs/{job}/outputs")).await;
        assert_eq!(paths(&listed), [format!("jobs/{job}/model/w.bin")]);
        let r = p.http.get(format!("{}/api/v1/jobs/{job}/outputs", p.url)).bearer_auth(&p.carol).send().await.unwrap();
        assert_eq!(r.status(), 403);
        let r = p.http.get(format!("{}/api/v1/jobs/{job}/outputs", p.url)).bearer_auth(&p.bob).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let (s, _, body) = get(&p, &p.alice, "/api/v1/files", &format!("jobs/{job}/model/w.bin"), None).await;
        assert!(s == 200 && body == weights, "{s}");
        let http = crate::support::session::BrowserSession::login(&p, "alice").await;
        let (s, page) = crate::pages::page(&http, &p, &format!("/jobs/{job}")).await;
        assert_eq!(s, 200);
        assert!(page.contains("id=\"output-list\"") && page.contains("model/w.bin"), "the job page lists the outputs");

        // The next attempt, on another server, gets them back; the first node no more.
        run(&p, move |c| place(c, job, 2, other)).await;
        let (s, body) = get_output(&p, &cred2, job, 2, "").await;
        assert_eq!(s, 200);
        let kept: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(kept[0]["path"], "model/w.bin", "{kept}");
        assert_eq!(kept[0]["sha256"], sha256(&weights));
        let (s, body) = get_output(&p, &cred2, job, 2, "model/w.bin").await;
        assert!(s == 200 && body == weights, "{s}");
        assert_eq!(get_output(&p, &cred, job, 2, "model/w.bin").await.0, 404);
        assert_eq!(put_output(&p, &cred, job, 1, "late", b"x").await.status, 404);

        // `commons get` downloads them all.
        let cli = Cli::new();
        cli.ok(&["login", &p.url, "--token", &p.alice]).await;
        let out = tempfile::tempdir().unwrap();
        let to = out.path().join("res").display().to_string();
        cli.ok(&["get", &job.to_string(), "-o", &to]).await;
        assert!(std::fs::read(out.path().join("res/model/w.bin")).unwrap() == weights);
    }
}

/// A job that leaves a file in `/outputs` at each attempt, and what it found there; it
/// waits to be moved in its first attempt and ends by itself in its second.
fn leaver() -> Value {
    let script = "a=$COMMONS_ATTEMPT; echo \"attempt $a\" > $COMMONS_OUTPUTS_DIR/run-$a.txt; \
                  mkdir -p /outputs/sub; ls /outputs > /outputs/sub/seen-$a.txt; \
                  echo \"attempt $a wrote its outputs\"; \
                  [ \"$a\" -ge 2 ] && exit 0; trap 'exit 143' TERM; while true; do sleep 1; done";
    serde_json::json!({"image": "commons-demo:latest", "command": ["sh", "-c", script],
                       "gpus": 1, "time_limit_minutes": 30})
}

/// With real agents and the Docker Engine: a guest moved off a drained server finds its
/// first attempt's `/outputs` in its second, and everything it wrote is in its owner's
/// files when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_travel_with_a_moved_job_and_are_kept_when_it_ends() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(crate::support::harness::Backend::Sqlite, dir.path(), |_| {}).await;
    let _vision = p.agent("vision", "fake:1xA100-80GB").await;
    let job = p.submit(&p.bob, leaver()).await;
    p.wait_state(&p.bob, job, &["running"], Duration::from_secs(60))
        .await;
    crate::support::harness::wait_for(Duration::from_secs(60), "attempt 1's outputs", || async {
        p.logs(&p.bob, job)
            .await
            .contains("attempt 1 wrote its outputs")
    })
    .await;
    let _physics = p.agent("physics", "fake:1xA100-80GB").await;
    p.wait_online("physics", 1).await;
    let nodes = p.get_json(&p.carol, "/api/v1/nodes").await;
    let vision = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["lab"] == "vision")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    let (s, v) = p
        .post_json(
            &p.carol,
            &format!("/api/v1/nodes/{vision}/drain"),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let done = p
        .wait_state(
            &p.bob,
            job,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(120),
        )
        .await;
    let log = p.logs(&p.bob, job).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{log}");
    assert_eq!(done["attempts"], 2, "{done}\n{log}");
    assert!(
        log.contains("restored /outputs as earlier attempts left it (2 files"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "/outputs kept in your files under jobs/{job}/ (4 files"
        )),
        "{log}"
    );
    let kept = p
        .get_json(&p.bob, &format!("/api/v1/jobs/{job}/outputs"))
        .await;
    let names: Vec<String> = paths(&kept)
        .iter()
        .map(|x| x.strip_prefix(&format!("jobs/{job}/")).unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["run-1.txt", "run-2.txt", "sub/seen-1.txt", "sub/seen-2.txt"],
        "{log}"
    );
    let (_, _, seen) = get(
        &p,
        &p.bob,
        "/api/v1/files",
        &format!("jobs/{job}/sub/seen-2.txt"),
        None,
    )
    .await;
    let seen = String::from_utf8(seen).unwrap();
    assert!(
        seen.contains("run-1.txt"),
        "attempt 2 saw attempt 1's outputs: {seen}"
    );
    let (_, _, first) = get(
        &p,
        &p.bob,
        "/api/v1/files",
        &format!("jobs/{job}/run-1.txt"),
        None,
    )
    .await;
    assert_eq!(first, b"attempt 1\n");
    p.stop().await;
}
