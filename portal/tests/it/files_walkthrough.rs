//! Issue 28's "done when", tried as a new user would, in one test with the real parts: a
//! researcher uploads a folder from the Files page in headless Chromium, submits a job
//! that reads it from `/inputs` and a lab's dataset from `/datasets/...`, watches it
//! stage, sees the owner lab take the server back and the job resume on another server
//! without losing `/outputs`, and downloads the results from the job page and with
//! `commons get`. Real agents, the Docker Engine, the local store.

use crate::cli::Cli;
use crate::files_clients::choose_and_upload;
use crate::pages_browser::{browser_login, js};
use crate::support::browser::Browser;
use crate::support::files::{self as f, get, list, paths};
use crate::support::harness::{wait_for, Backend, TestPortal};
use serde_json::json;
use std::time::{Duration, Instant};

/// Uploads the folder `folder` (its name becomes the top folder) from bob's Files page.
async fn upload_folder_in_the_browser(p: &TestPortal, folder: &std::path::Path) {
    let b = Browser::start().await;
    browser_login(&b, p, "bob").await;
    b.client.goto(&format!("{}/files", p.url)).await.unwrap();
    choose_and_upload(&b, "upload-folder", &folder.display().to_string()).await;
    wait_for(
        Duration::from_secs(60),
        "the folder's two files to be stored",
        || async { paths(&list(p, &p.bob, "/api/v1/files", "proj/").await.body).len() == 2 },
    )
    .await;
    b.close().await;
}

/// The job: prints its inputs and dataset, leaves a file in `/outputs` at each attempt
/// with what it found there, waits to be moved in its first attempt and ends in its second.
fn researcher_job() -> serde_json::Value {
    let script = "cat /inputs/proj/config.txt /inputs/proj/data/x.csv /datasets/cifar/a.txt; \
                  a=$COMMONS_ATTEMPT; echo \"attempt $a\" > /outputs/run-$a.txt; \
                  ls /outputs > /outputs/seen-$a.txt; echo \"attempt $a wrote its outputs\"; \
                  [ \"$a\" -ge 2 ] && exit 0; trap 'exit 143' TERM; while true; do sleep 1; done";
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", script], "gpus": 1,
           "time_limit_minutes": 30, "inputs": ["proj/"],
           "datasets": [{"lab": "vision", "name": "cifar"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_researcher_brings_data_in_and_takes_results_home() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |_| {}).await;
    // vision's admin shares a dataset with the campus.
    let a = f::put(
        &p,
        &p.carol,
        "/api/v1/labs/vision/files",
        "sets/cifar/a.txt",
        b"alpha\n",
    )
    .await;
    assert_eq!(a.status, 201, "{a}");
    let set = json!({"name": "cifar", "source": "lab:sets/cifar", "visibility": "campus"});
    let (s, v) = p
        .post_json(&p.carol, "/api/v1/labs/vision/datasets", &set)
        .await;
    assert_eq!(s, 201, "{v}");

    // bob (physics) uploads his project folder from the browser.
    let work = tempfile::tempdir().unwrap();
    let proj = work.path().join("proj");
    std::fs::create_dir_all(proj.join("data")).unwrap();
    std::fs::write(proj.join("config.txt"), "lr=0.1\n").unwrap();
    std::fs::write(proj.join("data/x.csv"), "1,2,3\n").unwrap();
    upload_folder_in_the_browser(&p, &proj).await;
    assert_eq!(
        paths(&list(&p, &p.bob, "/api/v1/files", "").await.body),
        ["proj/config.txt", "proj/data/x.csv"]
    );

    // Only vision's server is up: bob's job runs there as a guest, after staging.
    let _vision = p.agent("vision", "fake:1xA100-80GB").await;
    let job = p.submit(&p.bob, researcher_job()).await;
    let mut seen = Vec::new();
    let started = Instant::now();
    loop {
        let v = p.get_json(&p.bob, &format!("/api/v1/jobs/{job}")).await;
        let state = v["state"].as_str().unwrap_or("").to_string();
        if v.get("staging").is_some_and(|s| !s.is_null()) {
            seen.push(format!("staging {}", v["staging"]));
        }
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if state == "running" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the job to run: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(Duration::from_secs(60), "attempt 1's outputs", || async {
        p.logs(&p.bob, job)
            .await
            .contains("attempt 1 wrote its outputs")
    })
    .await;
    let events = p
        .get_json(&p.bob, &format!("/api/v1/jobs/{job}/events"))
        .await
        .to_string();
    assert!(
        events.contains("attempt 1: inputs staged (2 files"),
        "{events}"
    );

    // physics' server comes up; vision's owner wants its GPU back.
    let _physics = p.agent("physics", "fake:1xA100-80GB").await;
    p.wait_online("physics", 1).await;
    let owner = json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
                       "gpus": 1, "time_limit_minutes": 30});
    let owner_job = p.submit(&p.carol, owner).await;
    let done = p
        .wait_state(
            &p.bob,
            job,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(180),
        )
        .await;
    let log = p.logs(&p.bob, job).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{log}");
    assert_eq!(done["attempts"], 2, "{done}\n{log}");
    for line in ["lr=0.1", "1,2,3", "alpha", "attempt 2 wrote its outputs"] {
        assert!(log.contains(line), "{line:?} in\n{log}");
    }
    assert!(
        log.contains("restored /outputs as earlier attempts left it"),
        "{log}"
    );
    let history = p
        .get_json(&p.bob, &format!("/api/v1/jobs/{job}/events"))
        .await
        .to_string();
    assert!(
        history.contains("preempt"),
        "the owner took the server back: {history}"
    );
    let names = paths(
        &p.get_json(&p.bob, &format!("/api/v1/jobs/{job}/outputs"))
            .await,
    );
    let prefix = format!("jobs/{job}/");
    assert_eq!(
        names
            .iter()
            .map(|n| n.strip_prefix(&prefix).unwrap())
            .collect::<Vec<_>>(),
        ["run-1.txt", "run-2.txt", "seen-1.txt", "seen-2.txt"],
        "{log}"
    );
    let (_, _, seen2) = get(
        &p,
        &p.bob,
        "/api/v1/files",
        &format!("{prefix}seen-2.txt"),
        None,
    )
    .await;
    assert!(
        String::from_utf8_lossy(&seen2).contains("run-1.txt"),
        "attempt 2 found attempt 1's outputs"
    );

    // The results, from the job page (its links) and with `commons get`.
    let b = Browser::start().await;
    browser_login(&b, &p, "bob").await;
    b.client
        .goto(&format!("{}/jobs/{job}", p.url))
        .await
        .unwrap();
    let got = js(&b, "const a = Array.from(document.querySelectorAll('#output-list a')).find(a => a.textContent.includes('run-1.txt')); return a ? fetch(a.href).then(r => r.text()) : 'no link';").await;
    assert_eq!(got, "attempt 1\n");
    b.close().await;
    let cli = Cli::new();
    cli.ok(&["login", &p.url, "--token", &p.bob]).await;
    let out = tempfile::tempdir().unwrap();
    let to = out.path().join("results").display().to_string();
    cli.ok(&["get", &job.to_string(), "-o", &to]).await;
    for (name, want) in [("run-1.txt", "attempt 1\n"), ("run-2.txt", "attempt 2\n")] {
        let got = std::fs::read_to_string(out.path().join("results").join(name)).unwrap();
        assert_eq!(got, want, "{name}");
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
