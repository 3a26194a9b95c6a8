//! Notifications (issue 30) with real parts: a real HTTP receiver that checks the
//! Standard Webhooks signature with the secret and refuses replays by timestamp, a real
//! SMTP server (aiosmtpd), a real agent (fake GPUs, the real Docker Engine); the
//! portal restarted between a failed delivery and its retry; private targets and bad
//! event names refused with 422 naming the field; the Settings page.

use crate::support::harness::TestPortal;
use crate::support::session::BrowserSession;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(90);
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One call the receiver got.
#[derive(Debug, Clone)]
pub struct Got {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: String,
    /// What the receiver answered.
    pub status: u16,
    pub at: chrono::DateTime<chrono::Utc>,
}

/// Checks a call as a receiver following Standard Webhooks does, at time `now`.
pub fn verify(
    secret: &str,
    id: &str,
    ts: &str,
    sig: &str,
    body: &str,
    now: i64,
) -> Result<(), String> {
    let t: i64 = ts.parse().map_err(|_| format!("bad timestamp {ts:?}"))?;
    if (now - t).abs() > 300 {
        return Err(format!("timestamp {t} is {} s from now: a replay", now - t));
    }
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{t}.{body}").as_bytes());
    let want = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    if sig.split(' ').any(|s| s == format!("v1,{want}")) {
        Ok(())
    } else {
        Err(format!("signature {sig:?} does not match"))
    }
}

/// A webhook receiver on a free loopback port: verifies every call, answers 500 to the
/// first `fail_first` good ones, 200 to the rest, and keeps them all.
pub struct Receiver {
    pub url: String,
    pub got: Arc<Mutex<Vec<Got>>>,
    _server: actix_web::dev::ServerHandle,
}

struct Shared {
    got: Arc<Mutex<Vec<Got>>>,
    fail_left: AtomicUsize,
}

async fn hook(req: HttpRequest, body: String, s: web::Data<Shared>) -> HttpResponse {
    let h = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (id, ts, sig) = (
        h("webhook-id"),
        h("webhook-timestamp"),
        h("webhook-signature"),
    );
    let now = chrono::Utc::now().timestamp();
    let status = match verify(SECRET, &id, &ts, &sig, &body, now) {
        Err(_) => 400,
        Ok(()) if s.fail_left.load(Ordering::SeqCst) > 0 => {
            s.fail_left.fetch_sub(1, Ordering::SeqCst);
            500
        }
        Ok(()) => 200,
    };
    s.got.lock().unwrap().push(Got {
        id,
        timestamp: ts,
        signature: sig,
        body,
        status,
        at: chrono::Utc::now(),
    });
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).body("noted")
}

impl Receiver {
    pub fn start(fail_first: usize) -> Receiver {
        let got = Arc::new(Mutex::new(Vec::new()));
        let shared = web::Data::new(Shared {
            got: got.clone(),
            fail_left: AtomicUsize::new(fail_first),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .route("/hook", web::post().to(hook))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver {
            url: format!("http://{addr}/hook"),
            got,
            _server: handle,
        }
    }

    pub fn calls(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `check` holds for the calls so far.
    pub async fn wait(&self, what: &str, check: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + T;
        loop {
            let calls = self.calls();
            if check(&calls) {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the receiver got {calls:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn job(cmd: &str) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 5})
}

/// Stops the portal as a restart does (its tasks end, the server closes) and starts it
/// again on the same database and address; agents reconnect.
async fn restart(p: &mut TestPortal) {
    let mut config = (*p.portal.state.config).clone();
    config.listen = p.portal.addr.to_string();
    p.portal.scheduler.abort();
    p.portal.notifier.abort();
    p.portal.samples.abort();
    if let Some(m) = &p.portal.mail {
        m.abort();
    }
    p.portal.handle.stop(false).await;
    let _ = (&mut p.portal.server).await;
    p.portal = commons_portal::start(config)
        .await
        .expect("portal starts again");
}

pub(crate) fn test_portal(
    backend: crate::support::harness::Backend,
) -> crate::support::harness::TestPortalBuilder<'static> {
    TestPortal::builder(backend).config(|c| {
        // The receiver listens on loopback.
        c.notify.allow_private_targets = true;
        c.notify.retry_base_s = 2;
        c.notify.poll_ms = 100;
    })
}

per_backend! {
    async fn webhooks_are_signed_retried_and_survive_a_restart(backend: Backend) {
        let mut p = test_portal(backend).start().await;
        let rx = Receiver::start(1);
        let (s, v) = p.put_json(&p.alice, "/api/v1/me/notifications", &json!({
            "webhooks": [{"url": rx.url, "secret": SECRET}],
            "events": ["started", "succeeded", "failed"]})).await;
        assert_eq!(s, 200, "[{backend:?}] {v}");
        let got = p.get_json(&p.alice, "/api/v1/me/notifications").await;
        assert!(!got.to_string().contains(&SECRET[8..]), "[{backend:?}] a secret came back: {got}");
        assert_eq!(got["webhooks"][0]["secret_hint"], "…LaSw", "[{backend:?}] {got}");
        assert_eq!(got["events"], json!(["started", "succeeded", "failed"]), "[{backend:?}]");

        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        // Its own list: the end only, so no "started" call for it.
        let mut body = job("echo done");
        body["notify"] = json!(["end"]);
        let id = p.submit(&p.alice, body).await;
        p.wait_state(&p.alice, id, &["succeeded"], T).await;
        let first = rx.wait("the first call (answered 500)", |c| !c.is_empty()).await;
        assert_eq!(first[0].status, 500, "[{backend:?}] {first:?}");
        let event: Value = serde_json::from_str(&first[0].body).unwrap();
        assert_eq!(event["type"], "job.succeeded", "[{backend:?}] {event}");
        assert_eq!(event["data"]["job"]["id"], id, "[{backend:?}] {event}");
        assert_eq!(event["data"]["job"]["state"], "succeeded", "[{backend:?}] {event}");

        // The portal goes away before the retry; the one after the restart sends it.
        restart(&mut p).await;
        let calls = rx.wait("the retry after the restart", |c| c.iter().any(|g| g.status == 200)).await;
        let ok = calls.iter().find(|g| g.status == 200).unwrap();
        assert_eq!(ok.id, first[0].id, "[{backend:?}] the retry keeps the event id");
        assert_eq!(ok.body, first[0].body, "[{backend:?}] and the body");
        assert!(calls.iter().all(|g| g.status != 400), "[{backend:?}] a bad signature: {calls:#?}");
        assert!(calls.iter().all(|g| !g.body.contains("job.started")), "[{backend:?}] {calls:#?}");

        // A replay: the same call 5 minutes later is refused by its timestamp, and a
        // fresh timestamp breaks the signature.
        let later = ok.timestamp.parse::<i64>().unwrap() + 301;
        assert!(verify(SECRET, &ok.id, &ok.timestamp, &ok.signature, &ok.body, later).is_err());
        let fresh = ok.timestamp.parse::<i64>().unwrap() + 60;
        assert!(verify(SECRET, &ok.id, &fresh.to_string(), &ok.signature, &ok.body, fresh).is_err());
        assert!(verify(SECRET, &ok.id, &ok.timestamp, &ok.signature, &ok.body, ok.timestamp.parse().unwrap()).is_ok());

        // The delivery log: two tries, sent, the receiver's answer.
        let deadline = Instant::now() + T;
        loop {
            let log = p.get_json(&p.alice, "/api/v1/me/notifications/deliveries").await;
            let d = log.as_array().unwrap().iter().find(|d| d["job"] == id).cloned();
            if let Some(d) = d.filter(|d| d["status"] == "sent") {
                assert_eq!(d["attempts"], 2, "[{backend:?}] {d}");
                assert_eq!(d["event"], "succeeded", "[{backend:?}] {d}");
                assert_eq!(d["target"], rx.url.as_str(), "[{backend:?}] {d}");
                assert!(d["last_answer"].as_str().unwrap().starts_with("200"), "[{backend:?}] {d}");
                assert_eq!(d["event_id"], ok.id.as_str(), "[{backend:?}] {d}");
                break;
            }
            assert!(Instant::now() < deadline, "[{backend:?}] the log never says sent: {log}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

per_backend! {
    async fn bad_settings_and_private_targets_are_refused_and_the_page_shows_them(backend: Backend) {
        let p = TestPortal::start(backend).await;
        for (body, field) in [
            (json!({"webhooks": [{"url": "http://127.0.0.1:9/x", "secret": SECRET}]}), "webhooks[0].url"),
            (json!({"webhooks": [{"url": "http://169.254.169.254/latest", "secret": SECRET}]}), "webhooks[0].url"),
            (json!({"webhooks": [{"url": "http://10.0.0.7/hook", "secret": SECRET}]}), "webhooks[0].url"),
            (json!({"webhooks": [{"url": "http://localhost:8080/hook", "secret": SECRET}]}), "webhooks[0].url"),
            (json!({"webhooks": [{"url": "http://[::1]/hook", "secret": SECRET}]}), "webhooks[0].url"),
            (json!({"webhooks": [{"url": "ftp://93.184.215.14/x", "secret": SECRET}]}), "webhooks[0].url"),
            (json!({"webhooks": [{"url": "https://93.184.215.14/x"}]}), "webhooks[0].secret"),
            (json!({"webhooks": [{"url": "https://93.184.215.14/x", "secret": "short"}]}), "webhooks[0].secret"),
            (json!({"events": ["finished"]}), "events"),
        ] {
            let (s, v) = p.put_json(&p.alice, "/api/v1/me/notifications", &body).await;
            assert_eq!(s, 422, "[{backend:?}] {body}: {v}");
            assert_eq!(v["field"], field, "[{backend:?}] {body}: {v}");
        }
        // Nothing was stored.
        let got = p.get_json(&p.alice, "/api/v1/me/notifications").await;
        assert_eq!(got["webhooks"], json!([]), "[{backend:?}] {got}");
        assert_eq!(got["email_available"], false, "[{backend:?}] {got}");
        assert_eq!(got["email_address"], "alice@campus.test", "[{backend:?}] {got}");

        // A job's own list: unknown names refused, naming `notify`.
        let mut body = job("true");
        body["notify"] = json!(["end", "sometimes"]);
        let (s, v) = p.post_json(&p.alice, "/api/v1/jobs", &body).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("notify")), "[{backend:?}] {v}");

        // The page: e-mail said to be off, the form refuses a private target beside its
        // field, the preferences save.
        let b = BrowserSession::login(&p, "alice").await;
        let html = b.page("/settings").await;
        assert!(html.contains("E-mail is off on this portal"), "[{backend:?}] {html}");
        assert!(b.page("/").await.contains("href=\"/settings\""), "[{backend:?}] no link");
        let r = b.post_form("/settings/webhooks", &[("url", "http://127.0.0.1:9/x"), ("secret", SECRET)]).await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        let html = r.text().await.unwrap();
        assert!(html.contains("id=\"url-error\""), "[{backend:?}] {html}");
        assert!(!html.contains(SECRET), "[{backend:?}] the secret came back");
        let r = b.post_form("/settings/notifications", &[("failed", "on"), ("succeeded", "on")]).await;
        assert_eq!(r.status(), 303, "[{backend:?}]");
        let got = p.get_json(&p.alice, "/api/v1/me/notifications").await;
        assert_eq!(got["events"], json!(["succeeded", "failed"]), "[{backend:?}] {got}");
        // Without the CSRF token: refused.
        let r = b.post_form_without_token("/settings/notifications", &[("failed", "on")]).await;
        assert_eq!(r.status(), 403, "[{backend:?}]");

        // A webhook added without a secret: the portal makes one and shows it once.
        let r = b.post_form("/settings/webhooks", &[("url", "https://93.184.215.14/hook"), ("secret", "")]).await;
        assert_eq!(r.status(), 200, "[{backend:?}]");
        let html = r.text().await.unwrap();
        let made = html.split("shown this once: <code>").nth(1).and_then(|t| t.split('<').next())
            .unwrap_or_else(|| panic!("[{backend:?}] no secret shown: {html}"));
        assert!(made.starts_with("whsec_") && made.len() > 30, "[{backend:?}] {made}");
        let got = p.get_json(&p.alice, "/api/v1/me/notifications").await;
        let hook = &got["webhooks"][0];
        assert_eq!(hook["url"], "https://93.184.215.14/hook", "[{backend:?}] {got}");
        assert_eq!(hook["secret_hint"], format!("…{}", &made[made.len() - 4..]), "[{backend:?}]");
        assert_eq!(got["events"], json!(["succeeded", "failed"]), "[{backend:?}] kept: {got}");
        assert!(!b.page("/settings").await.contains(made), "[{backend:?}] shown twice");
        let r = b.post_form(&format!("/settings/webhooks/{}/remove", hook["id"].as_str().unwrap()), &[]).await;
        assert_eq!(r.status(), 303, "[{backend:?}]");
        let got = p.get_json(&p.alice, "/api/v1/me/notifications").await;
        assert_eq!(got["webhooks"], json!([]), "[{backend:?}] {got}");
    }
}

/// aiosmtpd on a free port, writing each message into a maildir.
pub(crate) struct SmtpServer {
    child: std::process::Child,
    pub(crate) port: u16,
    dir: tempfile::TempDir,
}

impl SmtpServer {
    pub(crate) fn start() -> SmtpServer {
        let python = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-venv/bin/python");
        let ok = std::process::Command::new(&python)
            .args(["-c", "import aiosmtpd"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "the e-mail test needs aiosmtpd in target/test-venv: run scripts/test-deps.sh \
             (or target/test-venv/bin/python -m pip install aiosmtpd==1.4.6)"
        );
        let port = crate::support::cluster::free_port();
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(&python)
            .args([
                "-m",
                "aiosmtpd",
                "-n",
                "-l",
                &format!("127.0.0.1:{port}"),
                "-c",
                "aiosmtpd.handlers.Mailbox",
            ])
            .arg(dir.path().join("mail"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        SmtpServer { child, port, dir }
    }

    /// The messages received so far, as text.
    pub(crate) fn messages(&self) -> Vec<String> {
        let new = self.dir.path().join("mail/new");
        std::fs::read_dir(new)
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_sends_an_email_through_a_real_smtp_server() {
    let smtp = SmtpServer::start();
    let port = smtp.port;
    let p = test_portal(crate::support::harness::Backend::Sqlite)
        .config(move |c| {
            c.smtp = Some(commons_portal::config::SmtpConfig {
                url: format!("smtp://127.0.0.1:{port}"),
                from: "GPU Commons <gpu@campus.test>".into(),
            })
        })
        .start()
        .await;
    let (s, v) = p
        .put_json(
            &p.alice,
            "/api/v1/me/notifications",
            &json!({"email": true, "events": ["failed"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["email_available"], true, "{v}");
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let id = p.submit(&p.alice, job("exit 3")).await;
    p.wait_state(&p.alice, id, &["failed"], T).await;
    let deadline = Instant::now() + T;
    let mail = loop {
        if let Some(m) = smtp.messages().into_iter().next() {
            break m;
        }
        let log = p
            .get_json(&p.alice, "/api/v1/me/notifications/deliveries")
            .await;
        assert!(
            Instant::now() < deadline,
            "no mail arrived; the delivery log: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(mail.contains("To: alice@campus.test"), "{mail}");
    assert!(
        mail.contains(&format!("Subject: [GPU Commons] job {id} failed")),
        "{mail}"
    );
    assert!(
        mail.contains("From: \"GPU Commons\" <gpu@campus.test>"),
        "{mail}"
    );
    let log = p
        .get_json(&p.alice, "/api/v1/me/notifications/deliveries")
        .await;
    assert_eq!(log[0]["channel"], "email", "{log}");
    assert_eq!(log[0]["status"], "sent", "{log}");
    // Only the failure was asked for.
    assert_eq!(log.as_array().unwrap().len(), 1, "{log}");
}

/// Webhook latency from a job's end (its `finished_at`) to the call's arrival, over 20
/// jobs: `cargo test -p commons-portal --test it -- --ignored webhook_latency --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run on its own"]
async fn webhook_latency() {
    // The default poll (500 ms), as operators get it.
    let p = TestPortal::builder(crate::support::harness::Backend::Sqlite)
        .config(|c| c.notify.allow_private_targets = true)
        .start()
        .await;
    let rx = Receiver::start(0);
    let (s, v) = p
        .put_json(
            &p.alice,
            "/api/v1/me/notifications",
            &json!({
            "webhooks": [{"url": rx.url, "secret": SECRET}], "events": ["succeeded"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let _agent = p.agent("vision", "fake:4xA100-80GB").await;
    let n = 20;
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(p.submit(&p.alice, job("sleep 1")).await);
    }
    let calls = rx.wait("20 calls", |c| c.len() >= n).await;
    let mut ms: Vec<f64> = Vec::new();
    for id in ids {
        let j = p.job(&p.alice, id).await;
        let end = chrono::NaiveDateTime::parse_from_str(
            j["finished_at"].as_str().unwrap(),
            "%Y-%m-%dT%H:%M:%S%.f",
        )
        .unwrap()
        .and_utc();
        let got = calls
            .iter()
            .find(|g| g.body.contains(&format!("\"id\":{id},")))
            .unwrap_or_else(|| panic!("no call for job {id}"));
        ms.push((got.at - end).num_microseconds().unwrap() as f64 / 1000.0);
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |f: f64| ms[((ms.len() - 1) as f64 * f).round() as usize];
    println!(
        "webhook latency over {n} jobs: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (poll_ms {})",
        q(0.5),
        q(0.99),
        ms[ms.len() - 1],
        p.portal.state.config.notify.poll_ms
    );
}

/// A guest preempted by the owner hears of it at the SIGTERM, with the grace deadline;
/// cancelling the requeued job sends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_guest_hears_the_grace_deadline_and_a_cancel() {
    let p = test_portal(crate::support::harness::Backend::Sqlite)
        .start()
        .await;
    let rx = Receiver::start(0);
    let (s, v) = p
        .put_json(
            &p.bob,
            "/api/v1/me/notifications",
            &json!({"webhooks": [{"url": rx.url, "secret": SECRET}],
                    "events": ["preempted", "cancelled"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let node = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
        .as_i64()
        .unwrap();
    let (s, v) = p
        .put_json(
            &p.carol,
            &format!("/api/v1/nodes/{node}/lending"),
            &json!({"mode": "always", "grace_seconds": 3}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let guest = p.submit(&p.bob, job("sleep 300")).await;
    p.wait_state(&p.bob, guest, &["running"], T).await;
    let owner = p.submit(&p.alice, job("sleep 30")).await;
    let calls = rx
        .wait("job.preempted", |c| {
            c.iter().any(|g| g.body.contains("job.preempted"))
        })
        .await;
    let e: Value = serde_json::from_str(&calls[0].body).unwrap();
    assert_eq!(e["data"]["job"]["id"], guest, "{e}");
    let at = chrono::DateTime::parse_from_rfc3339(e["timestamp"].as_str().unwrap()).unwrap();
    let deadline =
        chrono::DateTime::parse_from_rfc3339(e["data"]["grace_deadline"].as_str().unwrap())
            .unwrap();
    let grace = (deadline - at).num_milliseconds();
    assert!((2_000..=4_000).contains(&grace), "grace {grace} ms: {e}");
    p.wait_state(&p.alice, owner, &["running"], T).await;
    p.wait_state(&p.bob, guest, &["queued"], T).await;
    let (s, v) = p
        .post_json(&p.bob, &format!("/api/v1/jobs/{guest}/cancel"), &json!({}))
        .await;
    assert!(s < 300, "cancel: {s} {v}");
    rx.wait("job.cancelled", |c| {
        c.iter().any(|g| g.body.contains("job.cancelled"))
    })
    .await;
    assert!(
        rx.calls().iter().all(|g| g.status == 200),
        "{:#?}",
        rx.calls()
    );
}

/// Two replicas on one PostgreSQL database: each event is queued once and sent by one of
/// them (both run the sender).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_each_event_once() {
    let p = test_portal(crate::support::harness::Backend::Postgres)
        .start()
        .await;
    let mut config = (*p.portal.state.config).clone();
    config.listen = "127.0.0.1:0".into();
    let second = commons_portal::start(config)
        .await
        .expect("a second replica");
    let rx = Receiver::start(0);
    let (s, v) = p
        .put_json(
            &p.alice,
            "/api/v1/me/notifications",
            &json!({"webhooks": [{"url": rx.url, "secret": SECRET}], "events": ["succeeded"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let _agent = p.agent("vision", "fake:4xA100-80GB").await;
    let n = 12;
    for _ in 0..n {
        p.submit(&p.alice, job("true")).await;
    }
    rx.wait("a call per job", |c| c.len() >= n).await;
    // Every delivery recorded as sent: none is left for a replica to send again.
    let deadline = Instant::now() + T;
    loop {
        let log = p
            .get_json(&p.alice, "/api/v1/me/notifications/deliveries")
            .await;
        let rows = log.as_array().unwrap();
        if rows.len() == n && rows.iter().all(|d| d["status"] == "sent") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the log never says all sent: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = rx.calls();
    let mut ids: Vec<&str> = calls.iter().map(|g| g.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!((calls.len(), ids.len()), (n, n), "{calls:#?}");
    second.scheduler.abort();
    second.notifier.abort();
    second.handle.stop(false).await;
}
