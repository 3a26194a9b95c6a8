//! Gaps found in review, one test each: what another site's page could make a signed-in
//! browser do through the JSON API, and the headers that keep the pages from being framed
//! or sniffed.

use crate::harness::{Backend, TestPortal};
use crate::web::{hidden_csrf, logged_in};
use serde_json::json;

fn job() -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1, "time_limit_minutes": 5})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_session_cannot_be_ridden_into_the_api() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let b = logged_in(&p, "alice").await;
    let url = format!("{}/api/v1/jobs", p.url);
    // The cookie alone, as another site's script or form would send it: refused.
    let r = b.post(&url).json(&job()).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("X-CSRF-Token"));
    // A form-encoded or text/plain body (no preflight needed cross-site): refused too,
    // with or without a token.
    let r = b
        .post(&url)
        .header("content-type", "text/plain")
        .body(job().to_string())
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 201);
    let r = p
        .http
        .post(&url)
        .bearer_auth(&p.alice)
        .header("content-type", "text/plain")
        .body(job().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415, "JSON only, whoever asks");
    assert_eq!(
        p.get_json(&p.alice, "/api/v1/jobs").await,
        json!([]),
        "nothing was stored"
    );
    // The portal's own pages, which know the token, may call the API.
    let page = b
        .get(format!("{}/jobs/new", p.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = hidden_csrf(&page);
    let r = b
        .post(&url)
        .header("x-csrf-token", csrf)
        .json(&job())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // Reading needs no token.
    let r = b.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_carry_a_strict_policy_and_no_inline_script() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let b = logged_in(&p, "alice").await;
    let id = p.submit(&p.alice, job()).await;
    for path in [
        "/login".to_string(),
        format!("/jobs/{id}"),
        "/api/v1/jobs".into(),
        "/jobs/new".into(),
    ] {
        let r = b.get(format!("{}{path}", p.url)).send().await.unwrap();
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("script-src 'self' 'unsafe-inline'"),
            "{path}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "same-origin", "{path}");
        // Pages and API answers hold a person's data and CSRF tokens: a shared proxy or
        // the browser's history must not keep them (a refused form's 422 page had no
        // cache-control at all).
        assert_eq!(h["cache-control"], "no-store", "{path}");
        assert!(
            !h.contains_key("strict-transport-security"),
            "plain http: no HSTS"
        );
        if path == format!("/jobs/{id}") {
            let page = r.text().await.unwrap();
            assert!(!page.contains("<script>"), "no inline script: {page}");
            assert!(page.contains("src=\"/assets/job.js\""));
        }
    }
    let r = b
        .get(format!("{}/assets/job.js", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "public, max-age=300");
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    assert!(r.text().await.unwrap().contains("/status"));
}

/// The README says lab admins see their lab's jobs; they could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_admins_see_their_labs_jobs_and_no_one_elses() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let id = p.submit(&p.alice, job()).await;
    let get = |token: &str, path: String| {
        let r = p
            .http
            .get(format!("{}{path}", p.url))
            .bearer_auth(token.to_string());
        async move { r.send().await.unwrap() }
    };
    assert_eq!(
        get(&p.carol, format!("/api/v1/jobs/{id}")).await.status(),
        200,
        "vision's admin"
    );
    assert_eq!(
        get(&p.bob, format!("/api/v1/jobs/{id}")).await.status(),
        404,
        "another lab's member"
    );
    let listed: serde_json::Value = get(&p.carol, "/api/v1/jobs?lab=vision".into())
        .await
        .json()
        .await
        .unwrap();
    assert!(
        listed.as_array().unwrap().iter().any(|j| j["id"] == id),
        "{listed}"
    );
    assert_eq!(
        get(&p.alice, "/api/v1/jobs?lab=vision".into())
            .await
            .status(),
        403,
        "a member"
    );
    assert_eq!(
        get(&p.carol, "/api/v1/jobs?lab=physics".into())
            .await
            .status(),
        403,
        "another lab"
    );
}

/// A rogue agent (a real credential, another node) writes output into a job it does
/// not run: refused, the job's log unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_write_into_another_nodes_job() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let p = TestPortal::start(Backend::Sqlite).await;
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let id = p
        .submit(
            &p.alice,
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", "echo real; sleep 30"],
                   "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    p.wait_state(
        &p.alice,
        id,
        &["running"],
        std::time::Duration::from_secs(60),
    )
    .await;
    let token = p.enrol_token("physics");
    let enrolled: serde_json::Value = p
        .http
        .post(format!("{}{}", p.url, commons_proto::ENROL_PATH))
        .json(&json!({"token": token, "hostname": "rogue", "agent_version": "0.1.0"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let credential = enrolled["credential"].as_str().unwrap();
    let mut req = format!(
        "{}{}",
        p.url.replacen("http", "ws", 1),
        commons_proto::CONNECT_PATH
    )
    .into_client_request()
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {credential}").parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let hello = json!({"type": "hello", "agent_version": "0.1.0", "protocol": commons_proto::PROTOCOL_VERSION,
                       "session": 7, "seq": 1, "gpus": [], "attempts": []});
    ws.send(Message::text(hello.to_string())).await.unwrap();
    let forged =
        json!({"type": "logs", "job": id, "attempt": 1, "chunk": "forged by another node\n"});
    ws.send(Message::text(forged.to_string())).await.unwrap();
    // Let both be handled (the Welcome shows the Hello was).
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), ws.next()).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let log = p.logs(&p.alice, id).await;
    assert!(!log.contains("forged"), "{log}");
    assert!(log.contains("real"), "the job's own output is there: {log}");
}

/// `serve` without a persistent session key (outside the development login) would log
/// everyone out at each restart and split replicas: it refuses to start, saying why.
#[test]
fn serve_refuses_to_start_without_a_session_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("portal.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = \"sqlite://{}\"\nlisten = \"127.0.0.1:0\"\n",
            dir.path().join("c.db").display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_commons-portal"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("session_key_file"), "{err}");
}
