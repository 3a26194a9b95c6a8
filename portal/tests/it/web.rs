//! The HTML UI over HTTP: development login, CSRF, the submit form, the job page.

use crate::support::harness::TestPortal;
use crate::support::session::BrowserSession;
use std::time::Duration;

per_backend! {
    async fn submit_in_the_browser_form_and_watch_the_job(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let b = BrowserSession::anonymous(&p);

        let r = b.fetch("/jobs").await;
        assert_eq!(r.status(), 303, "not logged in: to the login page");
        assert_eq!(r.headers()["location"], "/login");

        let login = b.page("/login").await;
        assert!(
            login.contains("INSECURE DEVELOPMENT LOGIN"),
            "the dev login says it is insecure"
        );
        let r = b
            .post_form_with_token("/login", "forged", &[("username", "alice")])
            .await;
        assert_eq!(r.status(), 403, "a wrong CSRF token is refused");
        let r = b.sign_in("alice").await;
        assert_eq!(r.status(), 303);

        let fields = |gpus: &'static str| {
            [
                ("image", "commons-demo:latest"),
                ("command", "echo from the form"),
                ("gpus", gpus),
                ("cpus", "0.5"),
                ("memory_gb", "0.25"),
                ("time_limit_minutes", "5"),
                ("kind", "batch"),
                ("lab", "vision"),
                ("env", "GREETING=hi"),
            ]
        };
        // Bad input: the form comes back with the error and what was typed.
        let r = b.post_form("/jobs", &fields("0")).await;
        assert_eq!(r.status(), 422);
        let page = r.text().await.unwrap();
        assert!(page.contains("gpus:"), "the field is named");
        assert!(page.contains("echo from the form"), "nothing typed is lost");
        // An empty CSRF token: refused.
        let r = b.post_form_with_token("/jobs", "", &fields("1")).await;
        assert_eq!(r.status(), 403);
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/jobs").await,
            serde_json::json!([])
        );

        let r = b.post_form("/jobs", &fields("1")).await;
        assert_eq!(r.status(), 303, "[{backend:?}] {}", r.text().await.unwrap());
        let location = r.headers()["location"].to_str().unwrap().to_string();
        let id: i64 = location.trim_start_matches("/jobs/").parse().unwrap();
        p.wait_state(&p.alice, id, &["succeeded"], Duration::from_secs(60))
            .await;

        let page = b.fetch(&location).await.text().await.unwrap();
        assert!(page.contains(&format!("job-{id}")));
        assert!(page.contains("succeeded"));
        let status = b
            .fetch(&format!("{location}/status"))
            .await
            .text()
            .await
            .unwrap();
        assert!(
            status.contains("from the form"),
            "[{backend:?}] the output shows: {status}"
        );
        assert!(!status.contains("<html"), "the live part is a fragment");
        let list = b.fetch("/jobs").await.text().await.unwrap();
        assert!(list.contains(&format!("/jobs/{id}")));
        let nodes = b.fetch("/nodes").await.text().await.unwrap();
        assert!(nodes.contains("vision-server") && nodes.contains("A100-80GB"));

        // Bob cannot see Alice's job page.
        let bob = BrowserSession::login(&p, "bob").await;
        assert_eq!(bob.fetch(&location).await.status(), 404);
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_locked_down() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let b = BrowserSession::anonymous(&p);
    let login = b.fetch("/login").await;
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    let r = b.sign_in("alice").await;
    let after = r.headers()["set-cookie"].to_str().unwrap().to_string();
    for c in [&cookie, &after] {
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Lax"), "{c}");
        assert!(c.contains("Max-Age=28800"), "idle expiry of 8 h: {c}");
    }
    // That the session really starts afresh at login is `login_starts_a_fresh_session`.
    p.stop().await;
}

/// The form takes what the API takes: a 40 KiB command (the API allows 64 KiB) is
/// accepted, not cut off by a smaller form limit; a refused env variable comes back
/// with the field named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_form_takes_a_command_as_long_as_the_api() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let b = BrowserSession::login(&p, "alice").await;
    let long = format!("echo {}", "x".repeat(40 * 1024));
    let fields = |env| {
        [
            ("image", "commons-demo:latest"),
            ("command", long.as_str()),
            ("gpus", "1"),
            ("time_limit_minutes", "5"),
            ("lab", "vision"),
            ("env", env),
        ]
    };
    let r = b
        .post_form("/jobs", &fields("NVIDIA_VISIBLE_DEVICES=all"))
        .await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("NVIDIA_VISIBLE_DEVICES"));
    let r = b.post_form("/jobs", &fields("")).await;
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
}
