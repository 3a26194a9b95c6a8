//! The agent's side of the protocol: enrolment, then one outbound WebSocket to the portal,
//! re-dialled with capped exponential back-off for as long as the agent runs.
//!
//! Each connection starts with `Hello` (inventory and every attempt the agent knows); then
//! the agent sends heartbeats and attempt events and obeys `Start`, `Stop` and `Renew`.
//! A `Stop` for an attempt the agent does not know is answered with a report that it is
//! stopped, per the protocol's one rule.

use crate::executor::Executor;
use crate::gpu::{self, GpuSource};
use crate::runtime::{AssignedGpu, DockerRuntime};
use crate::state::{self, NodeCredential};
use crate::AgentConfig;
use anyhow::{bail, Context};
use commons_proto::*;
use futures_util::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Lease assumed for re-adopted attempts until the portal renews them.
const ADOPT_LEASE_S: i64 = 120;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let cred = match state::load_credential(&config.state_dir)? {
        Some(c) => c,
        None => enrol(&config).await?,
    };
    tracing::info!(node = cred.node_id, name = %cred.node_name, lab = %cred.lab, "node credential loaded");
    let gpus = gpu::from_mode(&config.gpus, &config.state_dir)?;
    let inventory = gpus.inventory()?;
    let runtime = DockerRuntime::connect(cred.agent_id.clone())
        .await
        .context("cannot reach the Docker Engine (is it running, and may this user use it?)")?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let exec = Executor::new(runtime, tx);
    exec.adopt(ADOPT_LEASE_S).await?;

    let mut backoff = Duration::from_secs(1);
    loop {
        let started = std::time::Instant::now();
        match connect_once(&config, &cred, &*gpus, &inventory, &exec, &mut rx).await {
            Ok(()) => tracing::warn!("portal closed the connection"),
            Err(e) if is_unauthorized(&e) => {
                bail!("the portal refused this node's credential (revoked?); enrol again with a new token")
            }
            Err(e) => tracing::warn!("connection to the portal failed: {e:#}"),
        }
        if started.elapsed() > MAX_BACKOFF {
            backoff = Duration::from_secs(1);
        }
        // Jitter spreads a campus of agents reconnecting after a portal restart.
        let jitter = Duration::from_millis(rand::random::<u64>() % 500);
        tokio::time::sleep(backoff + jitter).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn is_unauthorized(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<tungstenite::Error>(),
        Some(tungstenite::Error::Http(r)) if r.status() == 401 || r.status() == 403
    )
}

async fn enrol(config: &AgentConfig) -> anyhow::Result<NodeCredential> {
    let token = config.enrol_token.clone().context(
        "this state dir holds no node credential: start with --enrol-token TOKEN (a lab admin creates one)",
    )?;
    let url = format!("{}{ENROL_PATH}", config.portal.trim_end_matches('/'));
    let resp = reqwest::Client::new()
        .post(&url)
        .json(&EnrolRequest {
            token,
            hostname: config.hostname.clone(),
            agent_version: AGENT_VERSION.into(),
        })
        .send()
        .await
        .with_context(|| format!("cannot reach the portal at {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        let msg = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or(body);
        bail!("enrolment refused ({status}): {msg}");
    }
    let r: EnrolResponse = resp.json().await?;
    let cred = NodeCredential {
        node_id: r.node_id,
        node_name: r.node_name,
        lab: r.lab,
        credential: r.credential,
        agent_id: format!("{:016x}", rand::random::<u64>()),
    };
    state::save_credential(&config.state_dir, &cred)?;
    tracing::info!(node = cred.node_id, "enrolled");
    Ok(cred)
}

fn ws_url(portal: &str) -> String {
    let base = portal.trim_end_matches('/');
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_string()
    };
    format!("{base}{CONNECT_PATH}")
}

async fn connect_once(
    config: &AgentConfig,
    cred: &NodeCredential,
    gpus: &dyn GpuSource,
    inventory: &[GpuInfo],
    exec: &Executor,
    rx: &mut mpsc::UnboundedReceiver<AgentMsg>,
) -> anyhow::Result<()> {
    let mut req = ws_url(&config.portal).into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", cred.credential).parse()?,
    );
    let (ws, _) = tokio_tungstenite::connect_async(req).await?;
    let (mut sink, mut stream) = ws.split();
    let send = |m: &AgentMsg| -> Result<Message, serde_json::Error> {
        Ok(Message::text(serde_json::to_string(m)?))
    };
    sink.send(send(&AgentMsg::Hello {
        agent_version: AGENT_VERSION.into(),
        protocol: PROTOCOL_VERSION,
        gpus: inventory.to_vec(),
        attempts: exec.reports(),
    })?)
    .await?;
    tracing::info!("connected to {}", config.portal);

    // Leases and time limits need no tick here: the executor checks them every second,
    // connected or not.
    let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else { return Ok(()) };
                match msg? {
                    Message::Text(text) => {
                        let msg: PortalMsg = match serde_json::from_str(&text) {
                            Ok(m) => m,
                            Err(e) => {
                                tracing::warn!("ignoring a message this agent does not understand: {e}");
                                continue;
                            }
                        };
                        if let Some(period) = handle(msg, exec, inventory) {
                            heartbeat = tokio::time::interval(period);
                        }
                    }
                    Message::Close(_) => return Ok(()),
                    _ => {}
                }
            }
            Some(ev) = rx.recv() => sink.send(send(&ev)?).await?,
            _ = heartbeat.tick() => {
                let gpu_stats = match exec.gpu_stats(gpus).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("GPU stats: {e}");
                        Vec::new()
                    }
                };
                sink.send(send(&AgentMsg::Heartbeat { gpu_stats, attempts: exec.reports() })?).await?;
            }
        }
    }
}

/// Applies one portal message; returns a new heartbeat period when the portal sets one.
fn handle(msg: PortalMsg, exec: &Executor, inventory: &[GpuInfo]) -> Option<Duration> {
    match msg {
        PortalMsg::Welcome {
            node_id,
            heartbeat_s,
            ..
        } => {
            tracing::info!(node_id, heartbeat_s, "welcomed");
            return Some(Duration::from_secs(heartbeat_s.max(1)));
        }
        PortalMsg::Start {
            job,
            attempt,
            spec,
            gpus,
            lease_until,
        } => {
            let assigned = gpus
                .iter()
                .map(|uuid| AssignedGpu {
                    uuid: uuid.clone(),
                    fake: inventory
                        .iter()
                        .find(|g| &g.uuid == uuid)
                        .is_none_or(|g| g.fake),
                })
                .collect();
            tracing::info!(job, attempt, image = %spec.image, "start");
            exec.start(job, attempt, spec, assigned, lease_until);
        }
        PortalMsg::Stop {
            job,
            attempt,
            grace_s,
            reason,
        } => {
            tracing::info!(job, attempt, %reason, "stop");
            if !exec.stop(job, attempt, grace_s, reason) {
                // Not ours (any more): say so, so the portal can settle it.
                exec.report_unknown(job, attempt);
            }
        }
        PortalMsg::Renew {
            lease_until,
            attempts,
        } => exec.renew(lease_until, &attempts),
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_url_follows_the_scheme() {
        assert_eq!(
            ws_url("http://127.0.0.1:8080/"),
            "ws://127.0.0.1:8080/api/agent/v1/connect"
        );
        assert_eq!(
            ws_url("https://gpu.campus.edu"),
            "wss://gpu.campus.edu/api/agent/v1/connect"
        );
    }
}
