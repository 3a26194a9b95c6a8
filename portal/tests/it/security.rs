//! Gaps found in review, one test each: what another site's page could make a signed-in
//! browser do through the JSON API, the headers that keep the pages from being framed
//! or sniffed, and what a rogue agent can write (only into the attempt placed on its
//! node now).

use crate::support::harness::{wait_for, Backend, TestPortal};
use crate::support::session::BrowserSession;
use commons_proto::{AgentMsg, AttemptReport, AttemptState, PortalMsg, StopReason};
use serde_json::json;
use sha2::Digest;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

fn job() -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1, "time_limit_minutes": 5})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_session_cannot_be_ridden_into_the_api() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let b = BrowserSession::login(&p, "alice").await;
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
    let r = b.post_json_as_page("/api/v1/jobs", &job()).await;
    assert_eq!(r.status(), 201);
    // Reading needs no token.
    let r = b.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_carry_a_strict_policy_and_no_inline_script() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let b = BrowserSession::login(&p, "alice").await;
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

/// The docs say lab admins see their lab's jobs; they could not.
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

/// An agent speaking the protocol by hand, with a real node credential.
struct HandAgent {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    seq: u64,
}

impl HandAgent {
    /// Connects and says `Hello` with `gpus` (fake ones) and no attempts.
    async fn connect(p: &TestPortal, credential: &str, gpus: u32) -> HandAgent {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
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
        let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        let mut rogue = HandAgent { ws, seq: 1 };
        let gpus = (0..gpus)
            .map(|i| commons_proto::GpuInfo {
                uuid: format!("GPU-fake-rogue-{i}"),
                index: i,
                model: "A100-80GB".into(),
                memory_mb: 81920,
                fake: true,
            })
            .collect();
        rogue
            .send(AgentMsg::Hello {
                agent_version: "0.1.0".into(),
                protocol: commons_proto::PROTOCOL_VERSION,
                session: rand::random(),
                seq: 1,
                gpus,
                attempts: vec![],
                capacity: None,
                disk: None,
                datasets: None,
                share_mode: None,
            })
            .await;
        rogue
    }

    async fn send(&mut self, m: AgentMsg) {
        use futures_util::SinkExt;
        let text = serde_json::to_string(&m).unwrap();
        self.ws.send(Message::text(text)).await.unwrap();
    }

    /// Reads the portal's messages until one matches; fails after a minute.
    async fn until(&mut self, what: &str, mut ok: impl FnMut(&PortalMsg) -> bool) -> PortalMsg {
        use futures_util::StreamExt;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let next = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("the portal never sent {what}"))
                .unwrap_or_else(|| panic!("the portal closed the connection before {what}"))
                .unwrap();
            if let Message::Text(t) = next {
                let m: PortalMsg = serde_json::from_str(&t).unwrap();
                if ok(&m) {
                    return m;
                }
            }
        }
    }

    /// Sends a heartbeat reporting `attempts` and waits for its `Renew`: the portal
    /// handles one connection's messages in order, so everything sent before it was
    /// handled by then.
    async fn handled(&mut self, attempts: Vec<AttemptReport>) {
        self.seq += 1;
        let seq = self.seq;
        self.send(AgentMsg::Heartbeat {
            seq,
            gpu_stats: vec![],
            attempts,
            capacity: None,
            disk: None,
            datasets: None,
        })
        .await;
        self.until(
            &format!("the Renew of heartbeat {seq}"),
            |m| matches!(m, PortalMsg::Renew { lease, .. } if lease.seq == seq),
        )
        .await;
    }
}

fn logs(job: i64, attempt: i32, text: &str) -> AgentMsg {
    AgentMsg::Logs {
        job,
        attempt,
        chunk: format!("{text}\n"),
    }
}

fn event(job: i64, attempt: i32, state: AttemptState) -> AgentMsg {
    AgentMsg::AttemptEvent {
        job,
        attempt,
        state,
        exit_code: (state == AttemptState::Exited).then_some(0),
        stop: None,
        reason: None,
    }
}

/// A node of `lab` enrolled through the API: its credential.
async fn enrol(p: &TestPortal, lab: &str, host: &str) -> String {
    let enrolled: serde_json::Value = p
        .http
        .post(format!("{}{}", p.url, commons_proto::ENROL_PATH))
        .json(&json!({"token": p.enrol_token(lab), "hostname": host, "agent_version": "0.1.0"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    enrolled["credential"].as_str().unwrap().to_string()
}

/// An honest agent's last lines may reach the portal after its report of the end (a
/// heartbeat carrying the end overtook them, or the link was down): they are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_last_lines_after_its_report_of_the_end_are_kept() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let credential = enrol(&p, "vision", "by-hand").await;
    let mut agent = HandAgent::connect(&p, &credential, 1).await;
    let id = p
        .submit(
            &p.alice,
            json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    agent
        .until(
            "the Start of attempt 1",
            |m| matches!(m, PortalMsg::Start { job, attempt: 1, .. } if *job == id),
        )
        .await;
    agent.send(event(id, 1, AttemptState::Running)).await;
    let exited = AttemptReport {
        job: id,
        attempt: 1,
        state: AttemptState::Exited,
        exit_code: Some(0),
        stop: None,
        reason: None,
        gpu_memory_used_mb: None,
    };
    agent.handled(vec![exited]).await;
    assert_eq!(p.job(&p.alice, id).await["state"], "succeeded");
    agent
        .send(logs(id, 1, "the last line, after the end"))
        .await;
    agent.handled(vec![]).await;
    let log = p.logs(&p.alice, id).await;
    assert!(log.contains("the last line, after the end"), "{log}");
    p.stop().await;
}

per_backend! {
    /// A rogue agent (a real credential) writes only into the attempt placed on its node now.
    /// It runs attempt 1 of a job, goes away, and comes back once a real agent runs attempt 2;
    /// then its late output for attempt 1, its output and events for attempt 2 (another
    /// node's), and its checkpoints for either change nothing. Each outcome is judged once the
    /// portal has handled the messages (a heartbeat sent after them is answered), never after
    /// a fixed sleep.
    async fn a_rogue_agent_writes_only_into_the_attempt_placed_on_its_node_now(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let credential = enrol(&p, "vision", "rogue").await;
        let mut rogue = HandAgent::connect(&p, &credential, 1).await;
        let id = p
            .submit(
                &p.alice,
                json!({"image": "commons-demo:latest", "command": ["sh", "-c", "echo real; sleep 300"],
                       "gpus": 1, "time_limit_minutes": 5}),
            )
            .await;
        // The only server is the rogue's: it gets attempt 1, runs it, and writes its log.
        rogue
            .until(
                "the Start of attempt 1",
                |m| matches!(m, PortalMsg::Start { job, attempt: 1, .. } if *job == id),
            )
            .await;
        rogue.send(event(id, 1, AttemptState::Running)).await;
        rogue
            .send(logs(id, 1, "written while it held the attempt"))
            .await;
        let running = AttemptReport {
            job: id,
            attempt: 1,
            state: AttemptState::Running,
            exit_code: None,
            stop: None,
            reason: None,
            gpu_memory_used_mb: None,
        };
        rogue.handled(vec![running]).await;
        let log = p.logs(&p.alice, id).await;
        assert!(
            log.contains("written while it held the attempt"),
            "[{backend:?}] the rogue's own attempt takes its output: {log}"
        );
        // The rogue goes away: its lease runs out, and a real agent runs attempt 2.
        drop(rogue);
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let me = &p;
        wait_for(
            Duration::from_secs(90),
            "attempt 2 running",
            || async move {
                let j = me.job(&me.alice, id).await;
                j["state"] == "running" && j["attempts"] == 2
            },
        )
        .await;
        wait_for(
            Duration::from_secs(30),
            "attempt 2's output",
            || async move { me.logs(&me.alice, id).await.contains("real") },
        )
        .await;

        // Back, the rogue writes for the attempt it held before, and for the one it never
        // held: output, the job's end, a start.
        let mut rogue = HandAgent::connect(&p, &credential, 0).await;
        rogue
            .send(logs(id, 1, "late output of an old attempt"))
            .await;
        rogue
            .send(logs(id, 2, "forged into another node's attempt"))
            .await;
        rogue.send(event(id, 1, AttemptState::Exited)).await;
        rogue.send(event(id, 2, AttemptState::Exited)).await;
        rogue.send(event(id, 2, AttemptState::Running)).await;
        // The last one is answered: that attempt is not expected to run there.
        rogue
            .until("a Stop for attempt 2", |m| {
                matches!(m, PortalMsg::Stop { job, attempt: 2, reason: StopReason::NotExpected, .. } if *job == id)
            })
            .await;
        rogue.handled(vec![]).await;
        let log = p.logs(&p.alice, id).await;
        assert!(
            !log.contains("late output") && !log.contains("forged"),
            "[{backend:?}] {log}"
        );
        assert!(log.contains("real"), "the job's own output is there: {log}");
        let j = p.job(&p.alice, id).await;
        assert_eq!(
            (j["state"].as_str(), j["attempts"].as_i64()),
            (Some("running"), Some(2)),
            "[{backend:?}] the rogue's events changed nothing: {j}"
        );

        // Checkpoints: neither attempt 1 (held before) nor attempt 2 (another node's).
        let archive = b"a checkpoint the rogue wants stored".to_vec();
        let sum = hex::encode(sha2::Sha256::digest(&archive));
        for attempt in [1, 2] {
            let url = |path: String| format!("{}{path}", p.url);
            let r = p
                .http
                .put(url(commons_proto::checkpoint_part_path(id, attempt, 0)))
                .bearer_auth(&credential)
                .header(commons_proto::SHA256_HEADER, &sum)
                .body(archive.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                404,
                "[{backend:?}] a part for attempt {attempt}"
            );
            let r = p
                .http
                .get(url(commons_proto::checkpoint_parts_path(id, attempt)))
                .bearer_auth(&credential)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                404,
                "[{backend:?}] the parts of attempt {attempt}"
            );
            let r = p
                .http
                .post(url(commons_proto::checkpoint_commit_path(id, attempt)))
                .bearer_auth(&credential)
                .json(&json!({"parts": 1, "bytes": archive.len(), "sha256": sum}))
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                404,
                "[{backend:?}] a commit for attempt {attempt}"
            );
        }
        let store = p.portal.state.checkpoints.clone();
        for attempt in [1, 2] {
            let parts = store
                .parts(&commons_portal::service::checkpoints::store::commit_prefix(
                    id, attempt, 1,
                ))
                .await
                .unwrap();
            assert!(parts.is_empty(), "[{backend:?}] nothing kept: {parts:?}");
        }
        p.stop().await;
    }
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
