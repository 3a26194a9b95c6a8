//! The HTML UI over HTTP: development login, CSRF, the submit form, the job page.

use crate::support::harness::TestPortal;
use crate::support::session::{browser, hidden_csrf, logged_in};
use std::time::Duration;

per_backend! {
    async fn submit_in_the_browser_form_and_watch_the_job(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let b = browser();
        let url = |path: &str| format!("{}{path}", p.url);

        let r = b.get(url("/jobs")).send().await.unwrap();
        assert_eq!(r.status(), 303, "not logged in: to the login page");
        assert_eq!(r.headers()["location"], "/login");

        let login = b
            .get(url("/login"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            login.contains("INSECURE DEVELOPMENT LOGIN"),
            "the dev login says it is insecure"
        );
        let csrf = hidden_csrf(&login);
        let r = b
            .post(url("/login"))
            .form(&[("username", "alice"), ("csrf", "forged")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "a wrong CSRF token is refused");
        let r = b
            .post(url("/login"))
            .form(&[("username", "alice"), ("csrf", &csrf)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303);

        let form = b
            .get(url("/jobs/new"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let csrf = hidden_csrf(&form);
        let fields = |gpus: &str, csrf: &str| {
            vec![
                ("csrf", csrf.to_string()),
                ("image", "commons-demo:latest".to_string()),
                ("command", "echo from the form".to_string()),
                ("gpus", gpus.to_string()),
                ("cpus", "0.5".to_string()),
                ("memory_gb", "0.25".to_string()),
                ("time_limit_minutes", "5".to_string()),
                ("kind", "batch".to_string()),
                ("lab", "vision".to_string()),
                ("env", "GREETING=hi".to_string()),
            ]
        };
        // Bad input: the form comes back with the error and what was typed.
        let r = b
            .post(url("/jobs"))
            .form(&fields("0", &csrf))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 422);
        let page = r.text().await.unwrap();
        assert!(page.contains("gpus:"), "the field is named");
        assert!(page.contains("echo from the form"), "nothing typed is lost");
        // No CSRF token: refused.
        let r = b
            .post(url("/jobs"))
            .form(&fields("1", ""))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/jobs").await,
            serde_json::json!([])
        );

        let r = b
            .post(url("/jobs"))
            .form(&fields("1", &csrf))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "[{backend:?}] {}", r.text().await.unwrap());
        let location = r.headers()["location"].to_str().unwrap().to_string();
        let id: i64 = location.trim_start_matches("/jobs/").parse().unwrap();
        p.wait_state(&p.alice, id, &["succeeded"], Duration::from_secs(60))
            .await;

        let page = b
            .get(url(&location))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains(&format!("job-{id}")));
        assert!(page.contains("succeeded"));
        let status = b
            .get(url(&format!("{location}/status")))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            status.contains("from the form"),
            "[{backend:?}] the output shows: {status}"
        );
        assert!(!status.contains("<html"), "the live part is a fragment");
        let list = b
            .get(url("/jobs"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(list.contains(&format!("/jobs/{id}")));
        let nodes = b
            .get(url("/nodes"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(nodes.contains("vision-server") && nodes.contains("A100-80GB"));

        // Bob cannot see Alice's job page.
        let bob = browser();
        let login = bob
            .get(url("/login"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let csrf = hidden_csrf(&login);
        bob.post(url("/login"))
            .form(&[("username", "bob"), ("csrf", &csrf)])
            .send()
            .await
            .unwrap();
        assert_eq!(bob.get(url(&location)).send().await.unwrap().status(), 404);
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_locked_down() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let b = browser();
    let login = b.get(format!("{}/login", p.url)).send().await.unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    let csrf = hidden_csrf(&login.text().await.unwrap());
    let r = b
        .post(format!("{}/login", p.url))
        .form(&[("username", "alice"), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
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
    let b = logged_in(&p, "alice").await;
    let form = b
        .get(format!("{}/jobs/new", p.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = hidden_csrf(&form);
    let long = format!("echo {}", "x".repeat(40 * 1024));
    let fields = |env: &str| {
        vec![
            ("csrf", csrf.clone()),
            ("image", "commons-demo:latest".to_string()),
            ("command", long.clone()),
            ("gpus", "1".to_string()),
            ("time_limit_minutes", "5".to_string()),
            ("lab", "vision".to_string()),
            ("env", env.to_string()),
        ]
    };
    let r = b
        .post(format!("{}/jobs", p.url))
        .form(&fields("NVIDIA_VISIBLE_DEVICES=all"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("NVIDIA_VISIBLE_DEVICES"));
    let r = b
        .post(format!("{}/jobs", p.url))
        .form(&fields(""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
}
