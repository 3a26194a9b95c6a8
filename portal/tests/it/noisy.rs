//! A noisy guest cannot knock its server off the portal (issue 26, section 4): a job that
//! prints as fast as it can for a minute, beside a quiet job on the same server, with the
//! portal and the agent as separate processes (the agent on a host of its own) and real
//! containers, on SQLite (host 240) and PostgreSQL (host 241). The server never
//! disconnects, SSH into the quiet job works all along, and every numbered line of the
//! quiet job reaches its log. The figures (what the flood got through, per second) are
//! printed for the book's performance report.
//!
//! And the portal's own side, with a hand-driven agent (as an old or rogue one would
//! behave): thousands of output chunks at once are dropped over the output rate, never
//! refused, the connection stays, and the job's log says what was dropped; a pile of
//! refused messages still closes the connection.

use crate::observability::{scrape, scrape_as};
use crate::ssh::{add_key, keygen, ssh_options, trust_gateway};
use crate::support::cluster::{
    remove_containers, AgentProcess, Api, Host, PortalOpts, PortalProcess,
};
use crate::support::harness::{Backend, TestDb, TestPortal};
use commons_proto::{
    AgentMsg, AttemptReport, AttemptState, GpuInfo, PortalMsg, CONNECT_PATH, ENROL_PATH,
    PROTOCOL_VERSION,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

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
async fn a_flooding_job_never_disconnects_its_server_nor_starves_its_neighbour_sqlite() {
    flood_beside_a_quiet_job(Backend::Sqlite, 240).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_job_never_disconnects_its_server_nor_starves_its_neighbour_postgres() {
    flood_beside_a_quiet_job(Backend::Postgres, 241).await;
}

async fn flood_beside_a_quiet_job(backend: Backend, host_n: u8) {
    let db = TestDb::new(backend);
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        ssh: true,
        db_url: (backend == Backend::Postgres).then(|| db.url.clone()),
        ..Default::default()
    });
    let api = Api::new(portal.url(), alice);
    let host = Host::new(host_n);
    let listen = format!("10.251.{host_n}.2:9108");
    let agent = AgentProcess::start_with(
        &host,
        &portal,
        "vision",
        &format!("noisy-{host_n}"),
        "fake:2xA100-80GB",
        &["--metrics-listen", &listen],
    );
    agent.wait_online(&api, &host).await;
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
    api.wait_job(
        quiet,
        Duration::from_secs(60),
        "the quiet job running",
        |j| j["state"] == "running",
    )
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
    let cpu_before = cpu_ticks(agent.pid().unwrap());
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
    let cpu =
        (cpu_ticks(agent.pid().unwrap()) - cpu_before) as f64 / started.elapsed().as_secs_f64();
    let portal_mid = scrape_as(&portal_metrics, Some(&portal.metrics_token)).await;

    // The flood ends by itself; the quiet job prints its last line after it.
    let f = ended(&api, flood).await;
    let q = ended(&api, quiet).await;
    let agent_after = scrape(&agent_metrics).await;
    let portal_after = scrape_as(&portal_metrics, Some(&portal.metrics_token)).await;
    let quiet_log = api.logs(quiet).await;
    let flood_log = api.logs(flood).await;
    let portal_log = portal.log();

    // The figures, for the book's performance report.
    let secs = FLOOD_S as f64;
    let logs_out = r#"commons_agent_messages_total{direction="out",kind="logs"}"#;
    let sent_bytes = "commons_agent_log_bytes_total{fate=\"sent\"}";
    let dropped_bytes = "commons_agent_log_bytes_total{fate=\"over_rate\"}";
    let portal_dropped = "commons_agent_log_chunks_dropped_total";
    let connections = "commons_agent_connections_total";
    let refused = "commons_agent_messages_refused_total";
    let handling_sum = r#"commons_agent_message_handling_seconds_sum{kind="logs"}"#;
    let handling_count = r#"commons_agent_message_handling_seconds_count{kind="logs"}"#;
    let flood_lines = flood_log.lines().filter(|l| l.starts_with("xxxx")).count();
    let reconnects = get(&agent_after, connections) - 1.0;
    let connected_lines = portal_log.matches("agent connected").count();
    eprintln!(
        "FIGURES [{backend:?}] flood {FLOOD_S} s: agent sent {:.1} Logs messages/s, {:.0} bytes/s of output \
         ({:.0} bytes/s dropped at the agent), using {cpu:.0} % of a core; the portal refused {} \
         messages and dropped {} output chunks, handled Logs in \
         {:.2} ms on average; the flood's stored log: {} bytes, {} lines of 2,000 x \
         ({:.1} lines/s over the flood); agent connections opened: {}, portal 'agent connected' \
         lines: {connected_lines}, 'too many refused' disconnects: {}; SSH probes: {}/{} ok; \
         quiet lines arrived: {}/{QUIET_LINES}; the flood's attempts: {}",
        (get(&agent_mid, logs_out) - get(&agent_before, logs_out)) / secs,
        (get(&agent_mid, sent_bytes) - get(&agent_before, sent_bytes)) / secs,
        (get(&agent_mid, dropped_bytes) - get(&agent_before, dropped_bytes)) / secs,
        get(&portal_after, refused),
        get(&portal_after, portal_dropped),
        1000.0 * get(&portal_mid, handling_sum) / get(&portal_mid, handling_count).max(1.0),
        flood_log.len(),
        flood_lines,
        flood_lines as f64 / secs,
        get(&agent_after, connections),
        portal_log.matches("too many refused messages").count(),
        probes.iter().filter(|p| p.1).count(),
        probes.len(),
        quiet_log
            .lines()
            .filter(|l| l.starts_with("quiet-line-"))
            .count(),
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
    let want: Vec<String> = (0..QUIET_LINES)
        .map(|i| format!("quiet-line-{i}"))
        .collect();
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

/// A hand-driven agent with one GPU: a writer task sends what `tx` is given, a heartbeat
/// task reports `running` every second; the test reads `stream`.
struct RawAgent {
    tx: mpsc::UnboundedSender<Message>,
    stream: futures_util::stream::SplitStream<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    >,
    running: Arc<Mutex<Option<(i64, i32)>>>,
}

fn text(m: &AgentMsg) -> Message {
    Message::text(serde_json::to_string(m).unwrap())
}

impl RawAgent {
    async fn connect(p: &TestPortal) -> RawAgent {
        let enrolled: serde_json::Value = p
            .http
            .post(format!("{}{ENROL_PATH}", p.url))
            .json(&json!({"token": p.enrol_token("vision"), "hostname": "raw",
                          "agent_version": "raw"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let credential = enrolled["credential"].as_str().unwrap();
        let mut req = format!("{}{CONNECT_PATH}", p.url.replacen("http", "ws", 1))
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {credential}").parse().unwrap(),
        );
        let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        let (mut sink, stream) = ws.split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
        });
        let gpu = GpuInfo {
            uuid: "GPU-raw-0".into(),
            index: 0,
            model: "A100-80GB".into(),
            memory_mb: 81920,
            fake: true,
        };
        tx.send(text(&AgentMsg::Hello {
            agent_version: "raw".into(),
            protocol: PROTOCOL_VERSION,
            session: 7,
            seq: 1,
            gpus: vec![gpu.clone()],
            attempts: Vec::new(),
            capacity: None,
            disk: None,
            datasets: None,
            share_mode: None,
        }))
        .unwrap();
        let running: Arc<Mutex<Option<(i64, i32)>>> = Arc::default();
        let (beats, now) = (tx.clone(), running.clone());
        tokio::spawn(async move {
            for seq in 2.. {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let attempts = now
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|&(job, attempt)| AttemptReport {
                        job,
                        attempt,
                        state: AttemptState::Running,
                        exit_code: None,
                        stop: None,
                        reason: None,
                        gpu_memory_used_mb: None,
                    })
                    .collect();
                let beat = AgentMsg::Heartbeat {
                    seq,
                    gpu_stats: Vec::new(),
                    attempts,
                    capacity: None,
                    disk: None,
                    datasets: None,
                };
                if beats.send(text(&beat)).is_err() {
                    return;
                }
            }
        });
        RawAgent {
            tx,
            stream,
            running,
        }
    }

    /// The next message from the portal within `within`; `None`: the connection ended.
    async fn next(&mut self, within: Duration) -> Option<PortalMsg> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Err(_) => panic!("nothing from the portal in {within:?}"),
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_)))) => return None,
                Ok(Some(Ok(Message::Text(t)))) => return Some(serde_json::from_str(&t).unwrap()),
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    fn logs(&self, job: i64, attempt: i32, chunk: String) {
        let _ = self.tx.send(text(&AgentMsg::Logs {
            job,
            attempt,
            chunk,
        }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_output_chunks_is_dropped_not_refused_but_refusals_still_disconnect() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let mut agent = RawAgent::connect(&p).await;
    let job = p
        .submit(
            &p.alice,
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
                   "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    let attempt = loop {
        match agent.next(Duration::from_secs(60)).await {
            Some(PortalMsg::Start {
                job: j, attempt, ..
            }) if j == job => break attempt,
            Some(_) => {}
            None => panic!("disconnected before the job started"),
        }
    };
    *agent.running.lock().unwrap() = Some((job, attempt));
    agent
        .tx
        .send(text(&AgentMsg::AttemptEvent {
            job,
            attempt,
            state: AttemptState::Running,
            exit_code: None,
            stop: None,
            reason: None,
        }))
        .unwrap();
    p.wait_state(&p.alice, job, &["running"], Duration::from_secs(30))
        .await;

    // Five thousand chunks at once: five times the burst of the output rate. The portal
    // handles one in about 2 ms here, under the 5 ms a chunk the rate refills, so some
    // are over it (and the test says so if none were).
    for i in 0..5000 {
        agent.logs(job, attempt, format!("flood-line-{i}\n"));
    }
    // Then one line every half second until one is in the log (the rate refilled).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut renews_after = 0;
    let mut n = 0;
    let log = loop {
        n += 1;
        agent.logs(job, attempt, format!("after-the-flood-{n}\n"));
        let log = p.logs(&p.alice, job).await;
        if log.contains("after-the-flood-") {
            break log;
        }
        assert!(Instant::now() < deadline, "no line after the flood arrived");
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            match agent.next(Duration::from_secs(30)).await {
                Some(PortalMsg::Renew { .. }) => renews_after += 1,
                Some(_) => {}
                None => panic!("the flood of output disconnected the agent"),
            }
        }
    };
    // Still connected: heartbeats are answered.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        match agent.next(Duration::from_secs(30)).await {
            Some(PortalMsg::Renew { .. }) => renews_after += 1,
            Some(_) => {}
            None => panic!("disconnected after the flood"),
        }
    }
    assert!(renews_after >= 2, "{renews_after} renewals after the flood");
    let metrics = crate::observability::parse(
        &reqwest::get(format!("{}/metrics", p.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let dropped = get(&metrics, "commons_agent_log_chunks_dropped_total");
    assert!(
        dropped >= 1.0,
        "no chunk was over the rate: the portal handled them slower than the rate refills"
    );
    assert_eq!(get(&metrics, "commons_agent_messages_refused_total"), 0.0);
    // What was dropped is said, once, before the next line that passed; lines are whole
    // and in order.
    let marker = log
        .lines()
        .find(|l| l.contains("bytes dropped by the portal: output over the rate limit"))
        .unwrap_or_else(|| panic!("no marker in {log}"));
    assert!(marker.starts_with("... "), "{marker}");
    let kept: Vec<usize> = log
        .lines()
        .filter_map(|l| l.strip_prefix("flood-line-"))
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "in order");
    assert!(
        kept.len() >= 1000 && kept.len() < 3000,
        "{} kept",
        kept.len()
    );

    // Refused messages (inventories past the bound) still close the connection once they
    // pile up: a thousand at once.
    let bad = AgentMsg::Hello {
        agent_version: "raw".into(),
        protocol: PROTOCOL_VERSION,
        session: 7,
        seq: 1_000_000,
        gpus: (0..300)
            .map(|i| GpuInfo {
                uuid: format!("GPU-raw-{i}"),
                index: i,
                model: "A100-80GB".into(),
                memory_mb: 81920,
                fake: true,
            })
            .collect(),
        attempts: Vec::new(),
        capacity: None,
        disk: None,
        datasets: None,
        share_mode: None,
    };
    for _ in 0..1100 {
        let _ = agent.tx.send(text(&bad));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "a pile of refusals did not disconnect"
        );
        if agent.next(Duration::from_secs(60)).await.is_none() {
            break;
        }
    }
    p.stop().await;
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

/// The process's CPU time so far, in hundredths of a second (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's name in parentheses: utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn tail(s: &str) -> &str {
    let mut start = s.len().saturating_sub(6000);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
