//! `/metrics` of a real portal process and a real agent process after a real job, and the
//! JSON log format. Hosts 180 and 181.

use crate::support::cluster::{AgentProcess, Api, Host, PortalOpts, PortalProcess};
use crate::support::harness::{Backend, TestDb};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// Samples of a text exposition: `name{labels}` (labels as written) to value.
pub fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number in {line:?}"));
        assert!(
            out.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    out
}

pub async fn scrape(url: &str) -> BTreeMap<String, f64> {
    scrape_as(url, None).await
}

/// The same with the portal's scrape token (`Authorization: Bearer ...`).
pub async fn scrape_as(url: &str, token: Option<&str>) -> BTreeMap<String, f64> {
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200, "{url}");
    let ct = res.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = res.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"));
    parse(&text)
}

fn get(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

async fn metrics_move_after_a_job(backend: Backend, host_n: u8) {
    let db = TestDb::new(backend);
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        db_url: (backend == Backend::Postgres).then(|| db.url.clone()),
        json_logs: true,
        ..Default::default()
    });
    let host = Host::new(host_n);
    let listen = format!("10.251.{host_n}.2:9108");
    let agent = AgentProcess::start_with(
        &host,
        &portal,
        "vision",
        &format!("obs-{host_n}"),
        "fake:2xA100-80GB",
        &["--metrics-listen", &listen, "--log-format", "json"],
    );
    let api = Api::new(portal.url(), alice);
    agent.wait_online(&api, &host).await;
    let portal_metrics = format!("{}/metrics", portal.url());
    let agent_metrics = format!("http://{listen}/metrics");
    let before = scrape_as(&portal_metrics, Some(&portal.metrics_token)).await;
    let agent_before = scrape(&agent_metrics).await;

    let job = api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", "echo hi"],
                       "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    api.wait_job(job, Duration::from_secs(60), "the job to succeed", |j| {
        j["state"] == "succeeded"
    })
    .await;
    assert!(api.get(&format!("/api/v1/jobs/{job}")).await.is_some());
    // One more heartbeat, so the agent's GPU figures and the portal's view settle.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let raw = reqwest::Client::new()
        .get(&portal_metrics)
        .bearer_auth(&portal.metrics_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !raw.contains(&job.to_string()),
        "a job id in the metrics (unbounded labels):\n{raw}"
    );
    let after = parse(&raw);

    let succeeded = r#"commons_jobs{lab="vision",state="succeeded"}"#;
    assert_eq!(get(&before, succeeded), 0.0);
    assert_eq!(get(&after, succeeded), 1.0, "{raw}");
    let submit = r#"commons_http_request_duration_seconds_count{method="POST",route="/api/v1/jobs",status="201"}"#;
    assert_eq!(get(&after, submit) - get(&before, submit), 1.0, "{raw}");
    // The route pattern, never the raw path.
    let show = r#"commons_http_request_duration_seconds_count{method="GET",route="/api/v1/jobs/{id}",status="200"}"#;
    assert!(get(&after, show) >= 1.0, "{raw}");
    let starts = r#"commons_job_starts_total{lab="vision"}"#;
    assert_eq!(get(&after, starts) - get(&before, starts), 1.0, "{raw}");
    assert_eq!(
        get(&after, r#"commons_queue_wait_seconds_count{lab="vision"}"#),
        1.0
    );
    assert!(get(&after, "commons_scheduler_tick_duration_seconds_count") > 0.0);
    assert_eq!(get(&after, "commons_scheduler_leader"), 1.0);
    assert_eq!(get(&after, "commons_agents_connected"), 1.0);
    let heartbeats = r#"commons_agent_messages_total{direction="in",kind="heartbeat"}"#;
    assert!(get(&after, heartbeats) > get(&before, heartbeats), "{raw}");
    let node = format!("obs-{host_n}");
    assert_eq!(
        get(
            &after,
            &format!(r#"commons_gpus{{node="{node}",lab="vision",state="lent"}}"#)
        ),
        2.0,
        "{raw}"
    );
    assert!(get(&after, "commons_db_pool_max_connections") >= 1.0);
    assert_eq!(
        get(
            &after,
            &format!(r#"commons_node_up{{node="{node}",lab="vision"}}"#)
        ),
        1.0
    );

    let agent_after = scrape(&agent_metrics).await;
    let starts = "commons_agent_container_starts_total";
    assert_eq!(get(&agent_after, starts) - get(&agent_before, starts), 1.0);
    assert_eq!(get(&agent_after, "commons_agent_connected"), 1.0);
    assert!(
        get(&agent_after, "commons_agent_lease_renewals_total")
            > get(&agent_before, "commons_agent_lease_renewals_total")
    );
    let total = agent_after
        .iter()
        .find(|(k, _)| k.starts_with(r#"commons_agent_gpu_memory_total_bytes{gpu="0""#))
        .map(|(_, v)| *v);
    assert_eq!(total, Some(80.0 * 1024.0 * 1024.0 * 1024.0));
    let start_msgs = r#"commons_agent_messages_total{direction="in",kind="start"}"#;
    assert_eq!(get(&agent_after, start_msgs), 1.0);

    // JSON logs: one object a line; the request's line carries its id, the agent's its node.
    let log = portal.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!lines.is_empty(), "{log}");
    assert!(
        lines.iter().any(|l| l["span"]["request_id"]
            .as_str()
            .is_some_and(|id| id.len() == 16)),
        "no request id in the JSON log:\n{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["job"] == job && l["fields"]["attempt"] == 1),
        "no line with the job and attempt:\n{log}"
    );
    let alog = agent.log();
    assert!(
        alog.lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .any(|l| l["span"]["node"].is_number()),
        "no node in the agent's JSON log:\n{alog}"
    );
    crate::support::cluster::remove_containers(&[job]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_after_a_job_sqlite() {
    metrics_move_after_a_job(Backend::Sqlite, 180).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_after_a_job_postgres() {
    metrics_move_after_a_job(Backend::Postgres, 181).await;
}

#[tokio::test]
async fn metrics_can_need_a_token_and_be_off() {
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "s3cret\n").unwrap();
    let path = token_file.path().to_path_buf();
    let p = crate::support::harness::TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            c.metrics.bearer_token_file = Some(path);
        })
        .start()
        .await;
    let url = format!("{}/metrics", p.url);
    let http = reqwest::Client::new();
    assert_eq!(http.get(&url).send().await.unwrap().status(), 401);
    let wrong = http.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let ok = http.get(&url).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let off = crate::support::harness::TestPortal::builder(Backend::Sqlite)
        .config(|c| {
            c.metrics.enabled = false;
        })
        .start()
        .await;
    let res = http
        .get(format!("{}/metrics", off.url))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
}

/// Every series name the portal and the agent can expose, from their registries' TYPE
/// lines (a family shows only once it has a child, so each gets one first).
fn exposed_names() -> std::collections::BTreeSet<String> {
    use commons_portal::metrics as pm;
    let m = pm::Metrics::new();
    let kind = pm::KindLabel { kind: "x" };
    let lab = pm::LabLabel { lab: "x".into() };
    let _ = m.http_requests.get_or_create(&pm::HttpLabels {
        method: "GET".into(),
        route: "x".into(),
        status: 200,
    });
    let _ = m.tick_phase.get_or_create(&pm::PhaseLabel { phase: "x" });
    let _ = m.plan_size.get_or_create(&kind);
    let _ = m.preemptions.get_or_create(&pm::CauseLabel { cause: "x" });
    let _ = m.starts.get_or_create(&lab);
    let _ = m.queue_wait.get_or_create(&lab);
    let _ = m.queue_jobs.get_or_create(&lab);
    let _ = m.queue_oldest.get_or_create(&lab);
    let _ = m.gpus.get_or_create(&pm::GpuLabels {
        node: "x".into(),
        lab: "x".into(),
        state: "x",
    });
    let _ = m.jobs.get_or_create(&pm::JobLabels {
        lab: "x".into(),
        state: "x".into(),
    });
    let _ = m.node_up.get_or_create(&pm::NodeLabels {
        node: "x".into(),
        lab: "x".into(),
    });
    m.message("in", "x");
    let _ = m.agent_message_duration.get_or_create(&kind);
    let _ = m.db_pool.get_or_create(&pm::PoolLabel { state: "x" });
    let a = &commons_agent::metrics::METRICS;
    let gpu = commons_agent::metrics::GpuLabels {
        gpu: 0,
        uuid: "x".into(),
    };
    let _ = a.gpu_utilization.get_or_create(&gpu);
    let _ = a.gpu_memory_used.get_or_create(&gpu);
    let _ = a.gpu_memory_total.get_or_create(&gpu);
    let _ = a.gpu_local_use.get_or_create(&gpu);
    let _ = a
        .messages
        .get_or_create(&commons_agent::metrics::MessageLabels {
            direction: "in",
            kind: "x",
        });
    let _ = a
        .checkpoint_uploads
        .get_or_create(&commons_agent::metrics::ResultLabel { result: "x" });
    let text = m.encode() + &a.encode();
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_count", "_sum"] {
                    names.insert(format!("{name}{s}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

fn commons_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("commons_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The dashboard and the alert rules name only metrics that exist; the rules pass
/// `promtool check rules` and their unit tests (`promtool test rules`).
#[test]
fn dashboard_and_alert_rules_use_real_metrics() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana");
    let names = exposed_names();
    assert!(names.contains("commons_jobs") && names.contains("commons_agent_connected"));
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("dashboard.json")).unwrap())
            .unwrap();
    let mut exprs = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() > 20);
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    exprs.push(rules);
    for e in &exprs {
        for n in commons_names(e) {
            assert!(names.contains(&n), "{n} is not a metric (in {e})");
        }
    }
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("promtool not runnable ({e}): apt-get install prometheus (Debian)")
            });
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
