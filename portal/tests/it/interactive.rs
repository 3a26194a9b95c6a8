//! Interactive jobs end to end (portal + agent with fake GPUs + Docker, both backends):
//! kept up without a command, the time left, "extend" through the API and the job page
//! (with its rules and refusals), the new limit reaching the agent, the audit entry, and
//! the lab's interactive boost set in the console and honoured by the scheduler.

use crate::support::harness::{wait_for, TestPortal};
use crate::support::session::BrowserSession;
use commons_portal::db::audit;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn interactive(time_limit_minutes: i64) -> Value {
    json!({"image": "commons-demo:latest", "gpus": 1, "kind": "interactive",
           "time_limit_minutes": time_limit_minutes, "cpus": 0.5, "memory_gb": 0.25})
}

fn batch(cmd: &str) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 5, "cpus": 0.5, "memory_gb": 0.25})
}

/// The time limit in the agent's `lease.json` for attempt 1 of `job`.
fn limit_on_agent(dir: &std::path::Path, job: i64) -> Option<u64> {
    let path = commons_agent::store::attempt_dir(dir, job, 1).join("lease.json");
    let lease: Option<commons_agent::store::LeaseFile> =
        commons_agent::store::read_json(&path).ok().flatten();
    lease.and_then(|l| l.time_limit_s)
}

per_backend! {
    async fn an_interactive_job_stays_up_and_its_owner_extends_it_within_the_quota(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let agent = p.agent("vision", "fake:2xA100-80GB").await;
        let id = p.submit(&p.alice, interactive(2)).await;
        let j = p.wait_state(&p.alice, id, &["running"], T).await;
        assert_eq!(j["kind"], "interactive");
        let left = j["time_left_s"].as_i64().unwrap();
        assert!((60..=120).contains(&left), "[{backend:?}] {j}");
        // No command, yet it stays up.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(p.job(&p.alice, id).await["state"], "running");
        let extend = |minutes: Value| json!({ "minutes": minutes });
        let path = format!("/api/v1/jobs/{id}/extend");

        // Who may, and bad values.
        let (s, _) = p.post_json(&p.bob, &path, &extend(json!(5))).await;
        assert_eq!(s, 404, "[{backend:?}] another user's job is not found");
        let (s, v) = p.post_json(&p.olga, &path, &extend(json!(5))).await;
        assert_eq!((s, v["error"].as_str()), (403, Some("forbidden")), "{v}");
        for bad in [json!(0), json!(-3), json!("ten"), json!(1_000_000)] {
            let (s, v) = p.post_json(&p.alice, &path, &extend(bad.clone())).await;
            assert_eq!(s, 422, "[{backend:?}] {bad}: {v}");
            assert_eq!(v["field"], "minutes", "{v}");
        }
        let (s, v) = p
            .post_json(&p.alice, &path, &json!({"minutes": 5, "hours": 1}))
            .await;
        assert_eq!((s, v["field"].as_str()), (422, Some("hours")), "{v}");
        let b = p.submit(&p.alice, batch("echo hi")).await;
        let (s, v) = p
            .post_json(
                &p.alice,
                &format!("/api/v1/jobs/{b}/extend"),
                &extend(json!(5)),
            )
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (409, Some("not_interactive")),
            "{v}"
        );

        // Within the quota: the lab's default for members allows 10 minutes.
        let (s, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/member-default-quota",
                &json!({"max_job_minutes": 10}),
            )
            .await;
        assert_eq!(s, 200);
        let (s, v) = p.post_json(&p.alice, &path, &extend(json!(30))).await;
        assert_eq!(s, 422, "[{backend:?}] {v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.contains("your quota in lab vision") && message.contains("at most 8 min"),
            "[{backend:?}] the refusal says why and what is left: {message}"
        );
        let (s, v) = p.post_json(&p.alice, &path, &extend(json!(5))).await;
        assert_eq!(s, 200, "[{backend:?}] {v}");
        assert_eq!(v["time_limit_minutes"], 7);
        assert!(v["time_left_s"].as_i64().unwrap() > 5 * 60, "{v}");

        // The new limit reaches the agent with the next heartbeat's Renew.
        let dir = agent.dir.path().to_path_buf();
        wait_for(
            Duration::from_secs(10),
            "the new limit on the agent",
            || {
                let dir = dir.clone();
                async move { limit_on_agent(&dir, id) == Some(7 * 60) }
            },
        )
        .await;
        let events = p
            .get_json(&p.alice, &format!("/api/v1/jobs/{id}/events"))
            .await;
        assert!(
            events
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["message"] == "time limit extended by 5 min to 7 min by alice"),
            "[{backend:?}] {events}"
        );
        let db = p.portal.state.db.clone();
        let log = db.run(|c| audit::list(c, None, 50)).await.unwrap();
        let entry = log.iter().find(|e| e.action == "extend_job").unwrap();
        assert_eq!(
            (entry.target.as_str(), entry.after.as_str()),
            (format!("job {id}").as_str(), "time_limit_s 420")
        );

        // The job page: time left, and the form with its refusal beside the field.
        let alice = BrowserSession::login(&p, "alice").await;
        let page = alice.fetch(&format!("/jobs/{id}")).await.text().await.unwrap();
        assert!(page.contains("id=\"job-time-left\""), "[{backend:?}]");
        assert!(page.contains("id=\"extend-form\""), "[{backend:?}]");
        let extend_form = format!("/jobs/{id}/extend");
        let r = alice.post_form(&extend_form, &[("minutes", "60")]).await;
        assert_eq!(r.status(), 422);
        let body = r.text().await.unwrap();
        let error = &body[body.find("id=\"extend-error\"").expect("the reason")..];
        assert!(error.contains("at most 3 min"), "[{backend:?}] {error}");
        assert!(body.contains("value=\"60\""), "what was typed is kept");
        let r = alice.post_form(&extend_form, &[("minutes", "3")]).await;
        assert_eq!(r.status(), 303);
        assert_eq!(p.job(&p.alice, id).await["time_limit_minutes"], 10);
        let r = alice
            .post_form_without_token(&extend_form, &[("minutes", "3")])
            .await;
        assert_eq!(r.status(), 403, "no CSRF token, no extension");

        // Cancelled: it ends at once, and a finished job is not extended.
        let (s, _) = p
            .post_json(&p.alice, &format!("/api/v1/jobs/{id}/cancel"), &json!({}))
            .await;
        assert_eq!(s, 200);
        p.wait_state(&p.alice, id, &["cancelled"], T).await;
        let a = &agent;
        wait_for(
            Duration::from_secs(15),
            "the container gone",
            || async move { a.containers(id).is_empty() },
        )
        .await;
        let (s, v) = p.post_json(&p.alice, &path, &extend(json!(5))).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (409, Some("not_extendable")),
            "{v}"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn a_lab_admin_boosts_interactive_jobs_ahead_of_the_labs_batch_jobs(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let path = "/api/v1/labs/vision/interactive";
        let (s, _) = p
            .put_json(&p.alice, path, &json!({"interactive_boost": true}))
            .await;
        assert_eq!(s, 403, "[{backend:?}] lab admins only");
        let (s, v) = p.put_json(&p.carol, path, &json!({"boost": true})).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("boost")), "{v}");

        // The console's checkbox, audited.
        let carol = BrowserSession::login(&p, "carol").await;
        let admin = "/labs/vision/admin";
        let page = carol.fetch(admin).await.text().await.unwrap();
        assert!(page.contains("id=\"interactive-boost\""), "[{backend:?}]");
        let r = carol
            .post_form("/labs/vision/interactive", &[("interactive_boost", "on")])
            .await;
        assert_eq!(r.status(), 303);
        let page = carol.fetch(admin).await.text().await.unwrap();
        assert!(
            page.contains("name=\"interactive_boost\" id=\"interactive-boost\" checked"),
            "[{backend:?}] saved"
        );
        let db = p.portal.state.db.clone();
        let log = db.run(|c| audit::list(c, None, 50)).await.unwrap();
        assert!(log
            .iter()
            .any(|e| e.action == "set_interactive_boost" && e.after == "interactive_boost true"));

        // One GPU, busy: a batch job and then an interactive one wait; the interactive
        // one gets the GPU first.
        let first = p.submit(&p.alice, batch("sleep 4")).await;
        p.wait_state(&p.alice, first, &["running"], T).await;
        let later = p.submit(&p.alice, batch("echo batch")).await;
        let mut i = interactive(5);
        i["command"] = json!(["sh", "-c", "sleep 2; echo interactive"]);
        let quick = p.submit(&p.alice, i).await;
        let started = p
            .wait_state(&p.alice, quick, &["running", "succeeded"], T)
            .await;
        let batch_now = p.job(&p.alice, later).await;
        assert!(
            batch_now["started_at"].is_null(),
            "[{backend:?}] the batch job submitted earlier waits: {started} {batch_now}"
        );
        p.wait_state(&p.alice, later, &["succeeded"], T).await;
        p.stop().await;
    }
}
