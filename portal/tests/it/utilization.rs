//! Jobs' GPU utilisation over time, end to end: a real portal process and a real agent
//! process (its fake GPUs report 73 % while a job's container holds them, the container
//! runs on the real Docker Engine). The heartbeats become samples, one per sample
//! interval at most; `GET /api/v1/jobs/{id}/utilization` and the job page (a server-drawn
//! chart, its summary in words, valid HTML) show them to whoever may see the job and to
//! nobody else. Hosts 60 and 61.

use crate::support::cluster::{AgentProcess, Api, Host, PortalOpts, PortalProcess};
use crate::support::harness::{Backend, TestDb};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// What a busy fake A100 (80 GiB) reports with `--fake-busy-util 73`: 73 % of its memory.
const BUSY_MB: i64 = 81920 * 73 / 100;

/// The job page as `user` sees it, over HTTP.
async fn page(url: &str, user: &str, path: &str) -> (u16, String) {
    let b = crate::support::session::BrowserSession::login_at(url, user).await;
    let r = b.fetch(path).await;
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn status_of(url: &str, token: &str, path: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{url}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn samples_of(api: &Api, job: i64) -> Value {
    api.get(&format!("/api/v1/jobs/{job}/utilization"))
        .await
        .unwrap_or(Value::Null)
}

async fn a_running_job_is_sampled_and_shown(backend: Backend, host_n: u8) {
    let db = TestDb::new(backend);
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        db_url: (backend == Backend::Postgres).then(|| db.url.clone()),
        extra_toml: "[utilization]\nsample_interval_s = 2\n".into(),
        // The job page is read through a signed-in browser session.
        dev_login: true,
        ..Default::default()
    });
    let host = Host::new(host_n);
    let agent = AgentProcess::start_with(
        &host,
        &portal,
        "vision",
        &format!("util-{host_n}"),
        "fake:2xA100-80GB",
        &["--fake-busy-util", "73"],
    );
    let api = Api::new(portal.url(), alice);
    agent.wait_online(&api, &host).await;
    let url = portal.url();

    // A job that cannot start (4 GPUs on a server of 2) has no samples, and says so.
    let waiting = api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sleep", "1"],
                       "gpus": 4, "time_limit_minutes": 5}),
        )
        .await;
    let u = samples_of(&api, waiting).await;
    assert_eq!(u["summary"]["samples"], 0, "{u}");
    assert_eq!(u["attempts"], json!([]));
    let (status, html) = page(&url, "alice", &format!("/jobs/{waiting}")).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("id=\"util-summary\">no samples yet<"),
        "{html}"
    );
    let r = reqwest::Client::new()
        .post(format!("{url}/api/v1/jobs/{waiting}/cancel"))
        .bearer_auth(&api.token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Both GPUs for 12 s: samples come while it runs.
    let job = api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sleep", "12"],
                       "gpus": 2, "time_limit_minutes": 5}),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let u = samples_of(&api, job).await;
        if u["summary"]["samples"].as_u64().unwrap_or(0) >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no samples while the job runs: {u}\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let j = api.get(&format!("/api/v1/jobs/{job}")).await.unwrap();
    assert_eq!(j["state"], "running", "sampled while running: {j}");
    let (status, live) = page(&url, "alice", &format!("/jobs/{job}")).await;
    assert_eq!(status, 200);
    assert!(live.contains("<svg class=\"chart\""), "the chart: {live}");
    assert!(live.contains("id=\"util-summary\">mean "), "{live}");

    let done = api
        .wait_job(job, Duration::from_secs(60), "the job to succeed", |j| {
            j["state"] == "succeeded"
        })
        .await;
    let u = samples_of(&api, job).await;
    let attempts = u["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{u}");
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["node"], format!("util-{host_n}"));
    let samples = attempts[0]["samples"].as_array().unwrap();
    // 12 s at one sample per 2 s at most (heartbeats every second): 3 to 7 samples.
    assert!(
        (3..=7).contains(&samples.len()),
        "{} samples: {u}",
        samples.len()
    );
    let at = |v: &Value| {
        chrono::NaiveDateTime::parse_from_str(v.as_str().unwrap(), "%Y-%m-%dT%H:%M:%S%.f").unwrap()
    };
    for w in samples.windows(2) {
        let gap = at(&w[1]["at"]) - at(&w[0]["at"]);
        assert!(
            gap >= chrono::Duration::seconds(2),
            "at most one sample per interval: {gap} between {} and {}",
            w[0],
            w[1]
        );
    }
    let (started, finished) = (at(&done["started_at"]), at(&done["finished_at"]));
    for s in samples {
        let t = at(&s["at"]);
        assert!(
            t >= started - chrono::Duration::seconds(2) && t <= finished,
            "a sample outside the run: {s} ({started} .. {finished})"
        );
    }
    // The mean of both GPUs, both busy: 73 %, and their memory summed. (The first
    // sample may straddle the container's start.)
    for s in &samples[1..] {
        assert_eq!(s["utilization_pct"], 73.0, "{s}");
        assert_eq!(s["memory_used_mb"], 2 * BUSY_MB, "{s}");
    }
    assert_eq!(u["summary"]["peak_pct"], 73.0);
    assert_eq!(u["summary"]["peak_memory_mb"], 2 * BUSY_MB);
    assert_eq!(u["summary"]["samples"], samples.len());
    assert_eq!(u["sample_interval_s"], 2);

    // The job page: the chart, the summary in words, the legend; valid HTML.
    let (status, html) = page(&url, "alice", &format!("/jobs/{job}")).await;
    assert_eq!(status, 200);
    assert!(html.contains("<svg class=\"chart\""));
    assert!(html.contains("<polyline"), "a line for the attempt");
    let mean = u["summary"]["mean_pct"].as_f64().unwrap();
    let words = format!("mean {mean:.0} %, peak 73 %, memory up to 116.8 GB");
    assert!(html.contains(&words), "{words} in {html}");
    assert!(html.contains(&format!("attempt 1 on util-{host_n}")));
    let (status, fragment) = page(&url, "alice", &format!("/jobs/{job}/utilization")).await;
    assert_eq!(status, 200);
    assert!(fragment.contains(&words) && !fragment.contains("<html"));
    crate::pages_browser::validate_html(&[("job-with-chart".into(), html)]);

    // Who may read it: the owner, the lab's admins (carl) and operators; no one else,
    // not even another member of the lab.
    portal.admin(&[
        "create-user",
        "olga",
        "--email",
        "olga@x.test",
        "--operator",
    ]);
    portal.admin(&[
        "create-user",
        "dave",
        "--email",
        "dave@x.test",
        "--lab",
        "vision",
    ]);
    portal.admin(&[
        "create-user",
        "carl",
        "--email",
        "carl@x.test",
        "--lab",
        "vision",
        "--role",
        "admin",
    ]);
    let path = format!("/api/v1/jobs/{job}/utilization");
    for (user, want) in [("carl", 200), ("olga", 200), ("dave", 404), ("bob", 404)] {
        let token = portal.admin(&["api-token", user]);
        assert_eq!(status_of(&url, &token, &path).await, want, "{user}");
        let (status, _) = page(&url, user, &format!("/jobs/{job}/utilization")).await;
        assert_eq!(status, want, "{user}'s page");
    }
    assert_eq!(
        status_of(&url, "gcp_not-a-token", &path).await,
        401,
        "no token"
    );
    assert_eq!(
        status_of(&url, &api.token, "/api/v1/jobs/999999999/utilization").await,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_is_sampled_and_shown_sqlite() {
    a_running_job_is_sampled_and_shown(Backend::Sqlite, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_is_sampled_and_shown_postgres() {
    a_running_job_is_sampled_and_shown(Backend::Postgres, 61).await;
}
