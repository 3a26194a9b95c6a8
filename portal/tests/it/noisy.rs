//! A noisy guest cannot knock its server off the portal (issue 26, section 4): a job that
//! prints as fast as it can for a minute, beside a quiet job on the same server, with the
//! portal and the agent as separate processes (the agent on a host of its own, host 240)
//! and real containers. The server never disconnects, SSH into the quiet job works all
//! along, and every numbered line of the quiet job reaches its log. The figures (what the
//! flood got through, per second) are printed for the README.

use crate::cluster::{remove_containers, AgentProcess, Api, Host, PortalOpts, PortalProcess};
use crate::observability::scrape;
use crate::ssh::{add_key, keygen, ssh_options, trust_gateway};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the flood lasts.
const FLOOD_S: u64 = 60;
/// Lines the quiet job prints, one every 0.1 s (longer than the flood).
const QUIET_LINES: usize = 700;

fn get(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

/// `while :; do echo <2000 x>; done` for `FLOOD_S` seconds, then one last line.
fn flood_command() -> String {
    // 20 x, times 5, 5 and 4: 2,000 x.
    format!(
        "x=xxxxxxxxxxxxxxxxxxxx; x=$x$x$x$x$x; x=$x$x$x$x$x; x=$x$x$x$x; \
         (while :; do echo $x; done) & sleep {FLOOD_S}; kill $!; echo flood-over"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_job_never_disconnects_its_server_nor_starves_its_neighbour() {
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        ssh: true,
        ..Default::default()
    });
    let api = Api::new(portal.url(), alice);
    let host = Host::new(240);
    let listen = "10.251.240.2:9108";
    let agent = AgentProcess::start_with(
        &host,
        &portal,
        "vision",
        "noisy-240",
        "fake:2xA100-80GB",
        &["--metrics-listen", listen],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.nodes_online().await == 0 {
        assert!(Instant::now() < deadline, "agent offline:\n{}", agent.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "alice", "ed25519");
    add_key(&api, &key).await;
    let alias = trust_gateway(&api, dir.path()).await;
    let ssh_opts = ssh_options(dir.path(), &key, &alias, portal.ssh_port.unwrap());
    let agent_metrics = format!("http://{listen}/metrics");
    let portal_metrics = format!("{}/metrics", portal.url());

    let quiet = api
        .submit(json!({
            "image": "commons-demo:latest",
            "command": ["sh", "-c", format!(
                "i=0; while [ $i -lt {QUIET_LINES} ]; do echo quiet-line-$i; i=$((i+1)); sleep 0.1; done")],
            "gpus": 1,
            "time_limit_minutes": 30,
        }))
        .await;
    api.wait_job(quiet, Duration::from_secs(60), "the quiet job running", |j| {
        j["state"] == "running"
    })
    .await;
    let flood = api
        .submit(json!({
            "image": "commons-demo:latest",
            "command": ["sh", "-c", flood_command()],
            "gpus": 1,
            "time_limit_minutes": 30,
        }))
        .await;
    api.wait_job(flood, Duration::from_secs(60), "the flood running", |j| {
        j["state"] == "running"
    })
    .await;
    let agent_before = scrape(&agent_metrics).await;
    let started = Instant::now();

    // Through the flood: an SSH command into the quiet job every few seconds.
    let mut probes = Vec::new();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(FLOOD_S) {
        n += 1;
        let mut c = Command::new("ssh");
        c.args(&ssh_opts)
            .arg(format!("job-{quiet}@127.0.0.1"))
            .arg(format!("echo probe-{n}"))
            .stdin(Stdio::null());
        let at = started.elapsed();
        let out = tokio::task::spawn_blocking(move || c.output().expect("OpenSSH client"))
            .await
            .unwrap();
        let ok = out.status.success()
            && String::from_utf8_lossy(&out.stdout).trim() == format!("probe-{n}");
        probes.push((
            at.as_secs_f64(),
            ok,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let agent_mid = scrape(&agent_metrics).await;
    let portal_mid = scrape(&portal_metrics).await;

    // The flood ends by itself; the quiet job prints its last line after it.
    let f = ended(&api, flood).await;
    let q = ended(&api, quiet).await;
    let agent_after = scrape(&agent_metrics).await;
    let portal_after = scrape(&portal_metrics).await;
    let quiet_log = api.logs(quiet).await;
    let flood_log = api.logs(flood).await;
    let portal_log = portal.log();

    // The figures, for the README.
    let secs = FLOOD_S as f64;
    let logs_out = r#"commons_agent_messages_total{direction="out",kind="logs"}"#;
    let sent_bytes = "commons_agent_log_bytes_total{fate=\"sent\"}";
    let dropped_bytes = "commons_agent_log_bytes_total{fate=\"dropped\"}";
    let connections = "commons_agent_connections_total";
    let refused = "commons_agent_messages_refused_total";
    let handling_sum = r#"commons_agent_message_handling_seconds_sum{kind="logs"}"#;
    let handling_count = r#"commons_agent_message_handling_seconds_count{kind="logs"}"#;
    let flood_lines = flood_log.lines().filter(|l| l.starts_with("xxxx")).count();
    let reconnects = get(&agent_after, connections) - 1.0;
    let connected_lines = portal_log.matches("agent connected").count();
    eprintln!(
        "FIGURES flood {FLOOD_S} s: agent sent {:.1} Logs messages/s, {:.0} bytes/s of output \
         ({:.0} bytes/s dropped at the agent); the portal refused {} messages, handled Logs in \
         {:.2} ms on average; the flood's stored log: {} bytes, {} lines of 2,000 x \
         ({:.1} lines/s over the flood); agent connections opened: {}, portal 'agent connected' \
         lines: {connected_lines}, 'too many refused' disconnects: {}; SSH probes: {}/{} ok; \
         quiet lines arrived: {}/{QUIET_LINES}; the flood's attempts: {}",
        (get(&agent_mid, logs_out) - get(&agent_before, logs_out)) / secs,
        (get(&agent_mid, sent_bytes) - get(&agent_before, sent_bytes)) / secs,
        (get(&agent_mid, dropped_bytes) - get(&agent_before, dropped_bytes)) / secs,
        get(&portal_after, refused),
        1000.0 * get(&portal_mid, handling_sum) / get(&portal_mid, handling_count).max(1.0),
        flood_log.len(),
        flood_lines,
        flood_lines as f64 / secs,
        get(&agent_after, connections),
        portal_log.matches("too many refused messages").count(),
        probes.iter().filter(|p| p.1).count(),
        probes.len(),
        quiet_log.lines().filter(|l| l.starts_with("quiet-line-")).count(),
        f["attempts"],
    );

    // Never disconnected: one connection, all along.
    assert_eq!(
        reconnects,
        0.0,
        "the agent reconnected {reconnects} times during the flood; portal log:\n{}",
        tail(&portal_log)
    );
    assert_eq!(connected_lines, 1, "{}", tail(&portal_log));
    assert!(
        !portal_log.contains("too many refused messages"),
        "{}",
        tail(&portal_log)
    );
    // SSH into the neighbour worked every time.
    assert!(probes.len() >= 10, "{probes:?}");
    let failed: Vec<_> = probes.iter().filter(|p| !p.1).collect();
    assert!(failed.is_empty(), "SSH probes that failed: {failed:?}");
    // Every line of the neighbour arrived, once, in order.
    assert_eq!(q["state"], "succeeded", "{q}");
    let lines: Vec<&str> = quiet_log
        .lines()
        .filter(|l| l.starts_with("quiet-line-"))
        .collect();
    let want: Vec<String> = (0..QUIET_LINES).map(|i| format!("quiet-line-{i}")).collect();
    assert_eq!(
        lines.len(),
        QUIET_LINES,
        "quiet lines missing: {:?}",
        want.iter()
            .filter(|w| !lines.contains(&w.as_str()))
            .take(20)
            .collect::<Vec<_>>()
    );
    assert!(lines.iter().zip(&want).all(|(a, b)| a == b));
    // The flood ran to its end and its log says what was left out.
    assert_eq!(f["state"], "succeeded", "{f}");
    assert_eq!(f["attempts"], 1, "{f}");
    assert!(
        flood_log.contains("bytes dropped: output over the rate limit"),
        "{}",
        tail(&flood_log)
    );
    remove_containers(&[quiet, flood]);
}

/// The job once it ended, or as it is after two minutes (judged after the figures).
async fn ended(api: &Api, job: i64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = api.get(&format!("/api/v1/jobs/{job}")).await;
        let over = j.as_ref().is_some_and(|j| {
            ["succeeded", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or(""))
        });
        if over || Instant::now() > deadline {
            return j.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn tail(s: &str) -> &str {
    let mut start = s.len().saturating_sub(6000);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
