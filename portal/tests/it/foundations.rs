//! Defects found by reading the first wave's code, each with the test that would have
//! caught it: the lending form's grace and custom windows, a role change and the
//! member's quota, the error page's navigation, sessions at login and at their absolute
//! expiry, and damaged rows read as errors instead of permissive defaults.

use crate::support::harness::TestPortal;
use crate::support::session::BrowserSession;
use diesel::connection::SimpleConnection;
use serde_json::json;

/// Runs raw SQL against the portal's own database (to damage a row on purpose).
async fn raw_sql(p: &TestPortal, sql: String) {
    let db = p.portal.state.db.clone();
    db.run(move |c| {
        c.batch_execute(&sql)
            .map_err(commons_portal::error::AppError::from)
    })
    .await
    .unwrap();
}

per_backend! {
    async fn the_lending_form_keeps_custom_windows_and_a_blank_grace_means_the_campus_default(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let node = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        // Windows no preset describes: Wednesdays 09:00-11:00, set through the API.
        let custom =
            json!({"mode": "windows", "windows": [{"days": [2], "from": "09:00", "to": "11:00"}]});
        let (status, _) = p
            .put_json(&p.carol, &format!("/api/v1/nodes/{node}/lending"), &custom)
            .await;
        assert_eq!(status, 200);
        let before = p.get_json(&p.alice, "/api/v1/nodes").await[0]["lending"]["windows"].clone();
        assert_eq!(before.as_array().unwrap().len(), 1);
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/nodes").await[0]["grace_s"],
            0,
            "[{backend:?}] no grace given: the campus default"
        );

        let carol = BrowserSession::login(&p, "carol").await;
        let admin = "/labs/vision/admin";
        let html = carol.page(admin).await;
        assert!(
            html.contains(r#"value="custom" selected"#),
            "[{backend:?}] the form says the windows are custom, not a preset"
        );
        assert!(
            !html.contains(r#"value="weekends" selected"#)
                && !html.contains(r#"value="nights" selected"#)
        );
        let r = carol
            .post_form(&format!("/labs/vision/nodes/{node}/lending"), &[
                ("mode", "custom"),
                ("max_lent_gpus", "1"),
                ("grace_seconds", ""),
            ])
            .await;
        assert_eq!(r.status(), 303, "[{backend:?}] {}", r.text().await.unwrap());
        let n = &p.get_json(&p.alice, "/api/v1/nodes").await[0];
        assert_eq!(
            n["lending"]["windows"], before,
            "[{backend:?}] saving the form kept the API's windows"
        );
        assert_eq!(n["lending"]["mode"], "windows");
        assert_eq!(n["lending"]["max_lent_gpus"], 1);
        assert_eq!(
            n["grace_s"], 0,
            "[{backend:?}] a blank grace field stores no grace of its own"
        );
        let html = carol.page(admin).await;
        assert!(
            html.contains(r#"name="grace_seconds" value="" placeholder="300""#),
            "[{backend:?}] the form shows the campus default"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn a_role_change_keeps_the_members_quota(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let (status, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/members/alice/quota",
                &json!({"max_gpus": 2, "max_gpu_hours": 100}),
            )
            .await;
        assert_eq!(status, 200);
        let carol = BrowserSession::login(&p, "carol").await;
        let r = carol
            .post_form("/labs/vision/members", &[("member", "alice"), ("role", "admin")])
            .await;
        assert_eq!(r.status(), 303);
        let html = carol.page("/labs/vision/admin").await;
        let row = &html[html.find("data-member=\"alice\"").unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(
            row.contains(r#"name="max_gpu_hours:alice" value="100""#)
                && row.contains(r#"name="max_gpus:alice" value="2""#),
            "[{backend:?}] alice's own quota survived her promotion: {row}"
        );
        let r = carol
            .post_form("/labs/vision/members", &[("member", "alice"), ("role", "owner")])
            .await;
        assert_eq!(
            r.status(),
            422,
            "an unknown role is refused, not read as member"
        );
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_page_keeps_the_navigation() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let carol = BrowserSession::login(&p, "carol").await;
    for (path, status) in [("/jobs/987654", 404), ("/labs/physics/admin", 403)] {
        let r = carol.fetch(path).await;
        assert_eq!(r.status(), status);
        let html = r.text().await.unwrap();
        assert!(
            html.contains(r#"href="/jobs/new""#)
                && html.contains(r#"href="/labs/vision/admin""#)
                && html.contains("carol"),
            "{path}: the error page has the signed-in header: {html}"
        );
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_starts_a_fresh_session() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let b = BrowserSession::anonymous(&p);
    let csrf_before = b.token_of_page("/login").await;
    let before = b.cookie();
    let r = b.sign_in("alice").await;
    assert_eq!(r.status(), 303);
    let jobs = b.fetch("/jobs").await;
    assert_eq!(jobs.status(), 200, "the new cookie is signed in");
    let csrf_after = b.token_of_page("/jobs").await;
    assert_ne!(
        csrf_before, csrf_after,
        "a CSRF token from before the login is worth nothing after it"
    );
    let old = BrowserSession::with_copied_cookie(&p, &before)
        .fetch("/jobs")
        .await;
    assert_eq!(old.status(), 303, "the pre-login cookie is not signed in");
    p.stop().await;
}

// The absolute expiry, now enforced on the stored session: `sessions.rs`.

per_backend! {
    async fn damaged_rows_are_errors_not_permissive_defaults(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let job = p
            .submit(
                &p.alice,
                json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1, "time_limit_minutes": 5}),
            )
            .await;
        // A lending rule that no longer parses must not read as "lend always, no limits".
        raw_sql(
            &p,
            r#"UPDATE nodes SET lending = '{"mode":"sometimes"}'"#.into(),
        )
        .await;
        let r = p
            .http
            .get(format!("{}/api/v1/nodes", p.url))
            .bearer_auth(&p.alice)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500, "[{backend:?}]");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "internal", "causes stay in the log: {body}");
        let carol = BrowserSession::login(&p, "carol").await;
        let r = carol.fetch("/labs/vision/admin").await;
        assert_eq!(r.status(), 500, "[{backend:?}] the console shows an error");
        // A job state nobody knows is not read as "failed".
        raw_sql(
            &p,
            format!("UPDATE jobs SET state = 'finished' WHERE id = {job}"),
        )
        .await;
        let r = p
            .http
            .get(format!("{}/api/v1/jobs/{job}", p.url))
            .bearer_auth(&p.alice)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500, "[{backend:?}]");
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_without_their_csrf_token_change_nothing() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let carol = BrowserSession::login(&p, "carol").await;
    for (path, form) in [
        (
            "/jobs",
            vec![
                ("image", "commons-demo:latest"),
                ("gpus", "1"),
                ("time_limit_minutes", "5"),
            ],
        ),
        ("/tokens", vec![("name", "laptop")]),
        (
            "/ssh-keys",
            vec![
                (
                    "public_key",
                    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILM+rvN+ot98qgEN796jTiQfZfG1KaT0PtFDJ/XFSqti",
                ),
                ("name", "laptop"),
            ],
        ),
        (
            "/labs/vision/members",
            vec![("member", "bob"), ("role", "admin")],
        ),
        ("/labs/vision/member-default-quota", vec![("max_gpus", "1")]),
    ] {
        let r = carol.post_form_without_token(path, &form).await;
        assert_eq!(r.status(), 403, "{path}");
        let r = carol
            .post_form_with_token(path, "0123456789abcdef", &form)
            .await;
        assert_eq!(r.status(), 403, "{path} with a wrong token");
    }
    assert_eq!(
        p.get_json(&p.carol, "/api/v1/jobs")
            .await
            .as_array()
            .unwrap()
            .len(),
        0,
        "no job was made"
    );
    assert_eq!(
        p.get_json(&p.carol, "/api/v1/ssh-keys").await,
        serde_json::json!([]),
        "no key was added"
    );
    p.stop().await;
}
