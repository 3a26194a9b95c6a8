//! The load generator's parts, shared by the smoke test (`load_smoke`) and the example
//! `load` (`portal/examples/load.rs`): simulated agents that speak the real protocol
//! (enrolment, the WebSocket, `Hello`, heartbeats, attempt events; no Docker: a job
//! "runs" for the seconds its command `["sleep", "N"]` names, forever otherwise), and
//! users submitting through the REST API.

use commons_proto::{
    AgentMsg, AttemptReport, AttemptState, EnrolRequest, EnrolResponse, GpuInfo, GpuStat,
    PortalMsg, StopReason, CONNECT_PATH, ENROL_PATH, PROTOCOL_VERSION,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::time::sleep_until;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// What the simulated agents saw, shared by all of them.
#[derive(Default)]
pub struct Campus {
    /// When each job's first `Start` arrived.
    pub started_at: Mutex<HashMap<i64, Instant>>,
    pub connected: AtomicUsize,
    pub starts: AtomicU64,
    pub finished: AtomicU64,
    pub stops: AtomicU64,
    /// Jobs whose later attempt started (requeued), with that attempt.
    pub restarted: Mutex<Vec<(i64, commons_proto::Attempt)>>,
    pub errors: Mutex<Vec<String>>,
}

/// Starts one simulated agent per token (at most `parallel` enrolling at once); returns
/// when every one has sent its `Hello` (or failed, in `Campus::errors`).
pub async fn connect_agents(
    url: &str,
    tokens: Vec<String>,
    gpus: u32,
    parallel: usize,
) -> (Arc<Campus>, Vec<tokio::task::JoinHandle<()>>) {
    let campus = Arc::new(Campus::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    let n = tokens.len();
    for (i, token) in tokens.into_iter().enumerate() {
        let (url, campus, gate, http) =
            (url.to_string(), campus.clone(), gate.clone(), http.clone());
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.ok();
            if let Err(e) = agent(&http, &url, &token, i, gpus, &campus, permit).await {
                campus
                    .errors
                    .lock()
                    .unwrap()
                    .push(format!("agent {i}: {e:#}"));
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60 + n as u64 / 10);
    while campus.connected.load(Ordering::SeqCst) + campus.errors.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "agents did not connect in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (campus, tasks)
}

struct Running {
    attempt: commons_proto::Attempt,
    until: Option<Instant>,
}

async fn agent(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    index: usize,
    gpus: u32,
    campus: &Campus,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> anyhow::Result<()> {
    let enrolled: EnrolResponse = http
        .post(format!("{url}{ENROL_PATH}"))
        .json(&EnrolRequest {
            token: token.to_string(),
            hostname: format!("load-{index}"),
            agent_version: "load".into(),
        })
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let ws_url = format!("{}{CONNECT_PATH}", url.replacen("http", "ws", 1));
    let mut req = ws_url.into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", enrolled.credential).parse()?,
    );
    let (ws, _) = tokio_tungstenite::connect_async(req).await?;
    let (mut sink, mut stream) = ws.split();
    let inventory: Vec<GpuInfo> = (0..gpus)
        .map(|g| GpuInfo {
            uuid: format!("GPU-load-{}-{g}", enrolled.node_id),
            index: g,
            model: "A100-80GB".into(),
            memory_mb: 81920,
            fake: true,
        })
        .collect();
    let text = |m: &AgentMsg| Message::text(serde_json::to_string(m).unwrap());
    let mut seq = 1;
    sink.send(text(&AgentMsg::Hello {
        agent_version: "load".into(),
        protocol: PROTOCOL_VERSION,
        session: rand::random(),
        seq,
        gpus: inventory.clone(),
        attempts: Vec::new(),
        capacity: None,
        disk: None,
        datasets: None,
        share_mode: None,
    }))
    .await?;
    campus.connected.fetch_add(1, Ordering::SeqCst);
    drop(permit);
    let mut running: BTreeMap<i64, Running> = BTreeMap::new();
    // A `Start` the portal sends again (a heartbeat crossed it) is a duplicate, as for
    // the real agent.
    let mut seen: std::collections::HashSet<(i64, commons_proto::Attempt)> = Default::default();
    let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
    heartbeat.tick().await;
    let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    loop {
        let next = running
            .values()
            .filter_map(|r| r.until)
            .min()
            .unwrap_or(far);
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else { return Ok(()) };
                let Message::Text(t) = msg? else { continue };
                match serde_json::from_str::<PortalMsg>(&t)? {
                    PortalMsg::Welcome { heartbeat_s, .. } => {
                        heartbeat = tokio::time::interval(Duration::from_secs(heartbeat_s.max(1)));
                        heartbeat.tick().await;
                    }
                    PortalMsg::Start { job, attempt, spec, .. } => {
                        if !seen.insert((job, attempt)) {
                            continue;
                        }
                        if attempt > 1 {
                            campus.restarted.lock().unwrap().push((job, attempt));
                        }
                        campus.started_at.lock().unwrap().entry(job).or_insert_with(Instant::now);
                        campus.starts.fetch_add(1, Ordering::Relaxed);
                        let secs = match spec.command.as_slice() {
                            [s, n] if s == "sleep" => n.parse::<f64>().ok(),
                            _ => None,
                        };
                        running.insert(job, Running {
                            attempt,
                            until: secs.map(|s| Instant::now() + Duration::from_secs_f64(s)),
                        });
                        sink.send(text(&event(job, attempt, AttemptState::Running, None))).await?;
                    }
                    PortalMsg::Stop { job, attempt, .. } => {
                        if running.remove(&job).is_some() {
                            campus.stops.fetch_add(1, Ordering::Relaxed);
                        }
                        let mut e = event(job, attempt, AttemptState::Stopped, None);
                        if let AgentMsg::AttemptEvent { stop, .. } = &mut e {
                            *stop = Some(StopReason::Cancelled);
                        }
                        sink.send(text(&e)).await?;
                    }
                    PortalMsg::Renew { .. } | PortalMsg::OpenRelay(_) => {}
                }
            }
            _ = heartbeat.tick() => {
                seq += 1;
                let gpu_stats = inventory.iter().map(|g| GpuStat {
                    uuid: g.uuid.clone(),
                    utilization_pct: 0,
                    memory_used_mb: 0,
                    local_use: false,
                    fault: None,
                }).collect();
                let attempts = running.iter().map(|(&job, r)| AttemptReport {
                    job,
                    attempt: r.attempt,
                    state: AttemptState::Running,
                    exit_code: None,
                    stop: None,
                    reason: None,
                    gpu_memory_used_mb: None,
                }).collect();
                sink.send(text(&AgentMsg::Heartbeat { seq, gpu_stats, attempts, capacity: None, disk: None, datasets: None })).await?;
            }
            _ = sleep_until(next.into()) => {
                let now = Instant::now();
                let done: Vec<(i64, commons_proto::Attempt)> = running.iter()
                    .filter(|(_, r)| r.until.is_some_and(|u| u <= now))
                    .map(|(&j, r)| (j, r.attempt)).collect();
                for (job, attempt) in done {
                    running.remove(&job);
                    campus.finished.fetch_add(1, Ordering::Relaxed);
                    sink.send(text(&event(job, attempt, AttemptState::Exited, Some(0)))).await?;
                }
            }
        }
    }
}

fn event(
    job: i64,
    attempt: commons_proto::Attempt,
    state: AttemptState,
    exit_code: Option<i64>,
) -> AgentMsg {
    AgentMsg::AttemptEvent {
        job,
        attempt,
        state,
        exit_code,
        stop: None,
        reason: None,
    }
}

/// A job for the simulated agents: runs `seconds`, or forever when `None`.
pub fn job(seconds: Option<f64>) -> Value {
    let command = match seconds {
        Some(s) => serde_json::json!(["sleep", s.to_string()]),
        None => serde_json::json!(["sleep", "forever"]),
    };
    serde_json::json!({"image": "commons-demo:latest", "command": command, "gpus": 1,
                       "time_limit_minutes": 600})
}

/// What a batch of submissions measured.
#[derive(Debug, Default)]
pub struct Submitted {
    /// (job id, when the request was sent, how long it took).
    pub jobs: Vec<(i64, Instant, Duration)>,
    pub errors: Vec<String>,
    pub elapsed: Duration,
}

impl Submitted {
    pub fn per_second(&self) -> f64 {
        self.jobs.len() as f64 / self.elapsed.as_secs_f64()
    }

    pub fn latency(&self, q: f64) -> Duration {
        percentile(self.jobs.iter().map(|j| j.2).collect(), q)
    }
}

/// `total` submissions of `body` through `POST /api/v1/jobs`, `concurrency` at a time
/// (closed loop), spread over the users' tokens.
pub async fn submit(
    url: &str,
    tokens: &[String],
    total: usize,
    concurrency: usize,
    body: Value,
) -> Submitted {
    submit_at(url, tokens, total, concurrency, body, None).await
}

/// The same at `rate` submissions a second when given (open loop: the i-th is due at
/// i / rate, sent then by whichever of the `concurrency` senders is free, and its
/// latency counts from when it was due, so a late send counts against the portal).
pub async fn submit_at(
    url: &str,
    tokens: &[String],
    total: usize,
    concurrency: usize,
    body: Value,
    rate: Option<f64>,
) -> Submitted {
    // Idle connections go before the portal's keep-alive (5 s) would close them: a
    // request sent on a connection just as the server closes it fails ("connection
    // closed before message completed"), which a browser retries and this client would
    // count as an error of the portal's.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .pool_idle_timeout(Duration::from_secs(4))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency.max(1) {
        let (http, next, body, url) = (http.clone(), next.clone(), body.clone(), url.to_string());
        let token = tokens[w % tokens.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Submitted::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let sent = match rate {
                    Some(r) => {
                        let due = began + Duration::from_secs_f64(i as f64 / r);
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    None => Instant::now(),
                };
                let res = http
                    .post(format!("{url}/api/v1/jobs"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await;
                let took = sent.elapsed();
                match res {
                    Ok(r) if r.status() == 201 => {
                        let v: Value = r.json().await.unwrap_or_default();
                        match v["id"].as_i64() {
                            Some(id) => out.jobs.push((id, sent, took)),
                            None => out.errors.push(format!("no id in {v}")),
                        }
                    }
                    Ok(r) => {
                        let status = r.status();
                        out.errors
                            .push(format!("{status}: {}", r.text().await.unwrap_or_default()))
                    }
                    Err(e) => out.errors.push(chain(&e)),
                }
            }
            out
        }));
    }
    let mut all = Submitted::default();
    for t in tasks {
        let part = t.await.unwrap();
        all.jobs.extend(part.jobs);
        all.errors.extend(part.errors);
    }
    all.elapsed = began.elapsed();
    all
}

/// The `q` quantile (0..=1) of some durations, nearest rank.
/// An error with its causes ("error sending request" alone says nothing).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

pub fn percentile(mut v: Vec<Duration>, q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Samples of a `/metrics` text: `name{labels}` to value.
pub async fn scrape(url: &str) -> BTreeMap<String, f64> {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// The sum of every sample whose series starts with `prefix`.
pub fn total(m: &BTreeMap<String, f64>, prefix: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}
