//! Start-time estimates: a waiting job shows when the scheduler expects it to start,
//! in the API (`estimated_start_at`) and on its page.

use crate::support::harness::{wait_for, TestPortal};
use crate::support::session::BrowserSession;
use chrono::NaiveDateTime;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn job(cmd: &str) -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 5, "cpus": 0.5, "memory_gb": 0.25})
}

fn at(v: &serde_json::Value) -> NaiveDateTime {
    let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").unwrap()
}

per_backend! {
    async fn a_job_behind_a_running_one_shows_its_estimated_start(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let first = p.submit(&p.alice, job("sleep 120")).await;
        let running = p.wait_state(&p.alice, first, &["running"], T).await;
        assert!(
            running.get("estimated_start_at").is_none(),
            "[{backend:?}] a running job has no estimate: {running}"
        );
        let second = p.submit(&p.alice, job("echo second")).await;
        let me = &p;
        wait_for(
            Duration::from_secs(15),
            "an estimated start",
            || async move { me.job(&me.alice, second).await["estimated_start_at"].is_string() },
        )
        .await;
        let waiting = p.job(&p.alice, second).await;
        assert_eq!(waiting["state"], "queued", "[{backend:?}] {waiting}");
        // The first job holds the only GPU for at most its 5-minute limit.
        let estimate = at(&waiting["estimated_start_at"]);
        let started = at(&running["started_at"]);
        let until = started + chrono::Duration::minutes(5);
        assert!(
            estimate >= started && estimate <= until + chrono::Duration::seconds(5),
            "[{backend:?}] estimate {estimate} outside [{started}, {until}]: {waiting}"
        );

        // The job page shows it.
        let b = BrowserSession::login(&p, "alice").await;
        let page = b
            .fetch(&format!("/jobs/{second}"))
            .await
            .text()
            .await
            .unwrap();
        let shown = estimate.format("%Y-%m-%d %H:%M UTC").to_string();
        assert!(
            page.contains("Estimated start") && page.contains(&shown),
            "[{backend:?}] the page does not show {shown}: {page}"
        );

        // Once it runs, the estimate is gone.
        let (status, _) = p
            .post_json(
                &p.alice,
                &format!("/api/v1/jobs/{first}/cancel"),
                &json!({}),
            )
            .await;
        assert_eq!(status, 200, "[{backend:?}]");
        let done = p
            .wait_state(&p.alice, second, &["succeeded", "failed"], T)
            .await;
        assert!(
            done.get("estimated_start_at").is_none(),
            "[{backend:?}] {done}"
        );
        p.stop().await;
    }
}
