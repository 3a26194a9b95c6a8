//! The agent's side of the protocol: enrolment, then one outbound WebSocket to the portal,
//! re-dialled with capped exponential back-off for as long as the agent runs.
//!
//! Each connection starts with `Hello` (protocol version, this process's session, inventory
//! and every attempt the agent knows); then the agent sends heartbeats and attempt events
//! and obeys `Start`, `Stop` and `Renew`. `Hello` and heartbeats are numbered (`seq`) by the
//! executor, which remembers when it sent each: the leases in `Start` and `Renew` count from
//! there. A `Stop` for an attempt the agent does not know is answered with a report that it
//! is stopped, per the protocol's one rule. Everything else the agent sends (attempt
//! events, jobs' output) comes through the bounded [`outbox`], control before output, and
//! the heartbeat goes before either. A portal that refuses this agent's protocol version
//! says so in its close frame, which is logged as an error. Checkpoints travel over plain
//! HTTP to the same portal, with the same credential (`checkpoint::client`).

mod enrol;
mod orders;

use crate::checkpoint::{CheckpointClient, Policy};
use crate::executor::Executor;
use crate::gpu::{self, GpuSource};
use crate::guard;
use crate::metrics::METRICS;
use crate::outbox::{self, OutboxRx};
use crate::owner::{self, OwnerState};
use crate::relay::{RelayContext, Relays};
use crate::runtime::{ContainerRuntime, DockerRuntime};
use crate::state::{self, NodeCredential};
use crate::store::Store;
use crate::AgentConfig;
use anyhow::{bail, Context};
use commons_proto::*;
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    // Before enrolment: an agent that cannot know its host must not take jobs.
    let host_id = crate::host::load_or_create(&config.host_id_file)?;
    let cred = match state::load_credential(&config.state_dir)? {
        Some(c) => c,
        None => enrol::enrol(&config, MAX_BACKOFF).await?,
    };
    tracing::info!(node = cred.node_id, name = %cred.node_name, lab = %cred.lab, host = %host_id, "node credential loaded");
    // Every line this agent logs from here on names its node (a field of the span).
    let span = tracing::info_span!("agent", node = cred.node_id);
    tracing::Instrument::instrument(serve(config, cred, host_id), span).await
}

/// Stops what an earlier identity of this host left running (see `host`).
async fn stop_earlier_identities(runtime: &impl ContainerRuntime) -> anyhow::Result<()> {
    let found = crate::host::stop_earlier_identities(runtime)
        .await
        .context("stopping the containers of an earlier identity of this host")?;
    for c in found {
        tracing::warn!(
            container = %c.id,
            agent_id = %c.agent,
            job = ?c.job,
            attempt = ?c.attempt,
            was_running = c.running,
            "a container of an earlier identity of this host (its state dir was lost): \
             stopped and removed, so its job cannot run twice"
        );
    }
    Ok(())
}

/// Everything a connection to the portal works with; it outlives every connection.
struct Parts {
    config: AgentConfig,
    cred: NodeCredential,
    gpus: Arc<dyn GpuSource>,
    inventory: Vec<GpuInfo>,
    exec: Executor,
    relay: RelayContext,
    owner: Arc<OwnerState>,
}

/// Serves the portal with the node's credential, reconnecting until the task is dropped.
async fn serve(
    mut config: AgentConfig,
    cred: NodeCredential,
    host_id: String,
) -> anyhow::Result<()> {
    let gpus: Arc<dyn GpuSource> = Arc::from(gpu::from_mode(
        &config.gpus,
        &config.state_dir,
        config.fake_busy_util,
    )?);
    let inventory = gpus.inventory()?;
    // Bound before anything else runs: a second agent on this state dir stops here.
    let listener = owner::server::bind(&config.state_dir, config.socket_group.as_deref())?;
    let runtime = connect_runtime(&config, &cred, host_id).await?;
    stop_earlier_identities(&runtime).await?;
    let store = Store::new(&config.state_dir).with_guard(guard_program());
    // `auto` becomes `image` or `watch` here, once, by trying (see `disk`).
    config.disk = config
        .disk
        .settled(&config.state_dir)
        .context("--job-disk image: jobs' volumes cannot be made here")?;
    tracing::info!(
        enforcement = ?config.disk.enforcement(),
        max_job_gb = config.disk.max_job_gb,
        floor = ?config.disk.floor,
        "jobs' disks"
    );
    let checkpoints = CheckpointClient::new(&config.portal, &cred.credential, Policy::default())
        .context("setting up the checkpoint client")?;
    let relay = RelayContext {
        portal: config.portal.clone(),
        credential: cred.credential.clone(),
        relays: Relays::default(),
    };
    let (tx, mut rx) = outbox::channel(config.log_limit);
    let exec = Executor::with_disk(runtime, tx, store, Some(checkpoints), config.disk);
    if let Some(mode) = config.shares.mode {
        tracing::info!(mode = mode.name(), "taking shares of a GPU");
        exec.set_shares(
            config.shares.clone(),
            &inventory,
            gpus.clone(),
            &config.state_dir,
        );
    }
    let here = crate::datasets::Here::open(&config.datasets, &config.state_dir)
        .context("opening the dataset cache")?;
    exec.set_datasets(std::sync::Arc::new(here));
    exec.adopt().await?;
    let owner = OwnerState::new(owner::IdleRule {
        after: config.idle_guest,
    });
    let parts = Parts {
        config,
        cred,
        gpus,
        inventory,
        exec,
        relay,
        owner,
    };
    // The watch and the socket server live exactly as long as this future: an embedding
    // that drops the agent (the tests abort it to play a crash) leaves neither behind, so
    // the next agent on this state dir can bind the socket.
    let _tasks = owner_tasks(&parts, listener);
    reconnect(&parts, &mut rx).await
}

/// The container runtime: the Docker Engine, with the guests' network made, the node's
/// image rules, and the host's id on every container.
async fn connect_runtime(
    config: &AgentConfig,
    cred: &NodeCredential,
    host_id: String,
) -> anyhow::Result<DockerRuntime> {
    let blocked = match config.guest_network {
        crate::runtime::guest::GuestNetwork::Egress => {
            crate::runtime::guest::blocked_destinations(&config.portal, &config.guest_block)
                .await
                .context("the guests' egress network")?
        }
        crate::runtime::guest::GuestNetwork::None => Vec::new(),
    };
    Ok(DockerRuntime::connect(cred.agent_id.clone())
        .await
        .context("cannot reach the Docker Engine (is it running, and may this user use it?)")?
        .with_isolation(crate::runtime::guest::Isolation {
            network: config.guest_network,
            blocked,
        })
        .await
        .context("setting up the guests' network")?
        .with_images(crate::runtime::images::ImagePolicy {
            // This server's own lab: its own allow-list entries may use local images.
            own_lab: Some(cred.lab.clone()),
            ..config.images.clone()
        })
        .with_host_id(host_id))
}

/// The program the attempts' guards run, if there is one (said loudly when not).
fn guard_program() -> Option<std::path::PathBuf> {
    let program = guard::default_program();
    if program.is_none() {
        tracing::warn!(
            "no commons-agent executable found to run attempt guards (set {}): leases and \
             time limits are not enforced while the agent is down",
            guard::GUARD_EXE_ENV
        );
    }
    program
}

/// The owner's watch over the GPUs and the owner's socket server.
fn owner_tasks(parts: &Parts, listener: tokio::net::UnixListener) -> TaskGuard {
    let p = parts;
    TaskGuard(vec![
        tokio::spawn(owner::run_watch(
            p.exec.clone(),
            p.gpus.clone(),
            p.owner.clone(),
        )),
        tokio::spawn(owner::server::serve(
            listener,
            owner::server::Control {
                exec: p.exec.clone(),
                gpus: p.gpus.clone(),
                inventory: p.inventory.clone(),
                owner: p.owner.clone(),
                portal: p.config.portal.clone(),
                credential: p.cred.credential.clone(),
                node_name: p.cred.node_name.clone(),
                http: reqwest::Client::new(),
            },
        )),
    ])
}

/// Connects to the portal again and again, with capped, jittered exponential back-off,
/// until the server leaves or the portal refuses its credential.
async fn reconnect(parts: &Parts, rx: &mut OutboxRx) -> anyhow::Result<()> {
    let (config, owner) = (&parts.config, &parts.owner);
    let mut backoff = Duration::from_secs(1);
    loop {
        let started = std::time::Instant::now();
        let outcome = tokio::select! {
            r = connect_once(parts, rx) => r,
            _ = owner.left.notified() => {
                let _ = std::fs::remove_file(owner::socket::socket_path(&config.state_dir));
                state::remove_credential(&config.state_dir)
                    .context("forgetting the revoked credential")?;
                tracing::info!("this server left GPU Commons; the agent stops");
                return Ok(());
            }
        };
        match outcome {
            Ok(()) => owner.set_link(false, Some("the portal closed the connection".into())),
            Err(e) if is_unauthorized(&e) => {
                let _ = std::fs::remove_file(owner::socket::socket_path(&config.state_dir));
                bail!("the portal refused this node's credential (revoked?); enrol again with a new token")
            }
            Err(e) => {
                owner.set_link(false, Some(format!("{e:#}")));
                match refusal(&e) {
                    Some(why) => tracing::error!("the portal refused the connection: {why}"),
                    None => tracing::warn!("connection to the portal failed: {e:#}"),
                }
            }
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

/// The portal's words when it refused the WebSocket upgrade with a client error (e.g. a
/// protocol it does not speak).
fn refusal(e: &anyhow::Error) -> Option<String> {
    let Some(tungstenite::Error::Http(r)) = e.downcast_ref::<tungstenite::Error>() else {
        return None;
    };
    if !r.status().is_client_error() {
        return None;
    }
    let body = r
        .body()
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    Some(format!("{} {}", r.status(), body.trim()))
}

/// Whether a close code means the portal refused this agent (its protocol version, or a
/// message it could not accept), rather than going away.
fn is_protocol_refusal(code: CloseCode) -> bool {
    matches!(
        code,
        CloseCode::Policy | CloseCode::Protocol | CloseCode::Unsupported | CloseCode::Invalid
    )
}

/// Logs why the portal closed the connection; a protocol refusal is an error that needs an
/// operator (the agent keeps retrying, in case the portal is upgraded).
fn log_close(frame: Option<&CloseFrame>) {
    match frame {
        Some(f) if is_protocol_refusal(f.code) => {
            // The version check says "protocol"; other refusals (a second agent with
            // this credential, a revoked one) carry their own words.
            let hint = if f.reason.contains("protocol") {
                "; install the agent that matches the portal"
            } else {
                ""
            };
            tracing::error!(
                code = u16::from(f.code),
                "the portal refused this agent (protocol v{PROTOCOL_VERSION}): {}{hint}",
                f.reason
            );
        }
        Some(f) => tracing::warn!(
            code = u16::from(f.code),
            "the portal closed the connection: {}",
            f.reason
        ),
        None => tracing::warn!("the portal closed the connection"),
    }
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

/// One connection: `Hello`, then heartbeats, the portal's messages and the outbox until
/// the portal closes it or it fails.
async fn connect_once(parts: &Parts, rx: &mut OutboxRx) -> anyhow::Result<()> {
    let (config, exec) = (&parts.config, &parts.exec);
    let mut req = ws_url(&config.portal).into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", parts.cred.credential).parse()?,
    );
    let (ws, _) = tokio_tungstenite::connect_async(req).await?;
    let _connected = Connected::new();
    let (mut sink, mut stream) = ws.split();
    let fake = matches!(config.gpus, crate::GpuMode::Fake(_));
    // Numbered and timed as late as possible: leases count from this moment.
    let mut hello = exec.hello(AGENT_VERSION, parts.inventory.clone());
    // The disk report goes in every Hello, and in a heartbeat when it changed.
    let mut disk_sent = owner_disk(config);
    if let AgentMsg::Hello {
        capacity,
        disk,
        datasets,
        ..
    } = &mut hello
    {
        *capacity = owner::capacity::report(config.capacity, fake, &config.state_dir);
        *disk = Some(disk_sent);
        *datasets = exec.datasets_offer();
    }
    let mut offer_sent = exec.datasets_offer();
    sink.send(encode(&hello)?).await?;
    parts.owner.set_link(true, None);
    tracing::info!("connected to {}", config.portal);

    // Leases and time limits need no tick here: the executor checks them every second,
    // connected or not.
    let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
    loop {
        // In this order: the heartbeat (a lease counts from it), the portal's messages,
        // then the outbox (its control before any job's output). Nothing waits behind
        // output but the one chunk being written.
        tokio::select! {
            biased;
            _ = heartbeat.tick() => {
                let beat = heartbeat_msg(parts, fake, &mut disk_sent, &mut offer_sent).await;
                sink.send(encode(&beat)?).await?;
            }
            msg = stream.next() => {
                let Some(msg) = msg else {
                    log_close(None);
                    return Ok(());
                };
                match msg? {
                    Message::Text(text) => {
                        if let Some(period) = on_text(parts, &text) {
                            heartbeat = tokio::time::interval(period);
                        }
                    }
                    Message::Close(frame) => {
                        log_close(frame.as_ref());
                        return Ok(());
                    }
                    _ => {}
                }
            }
            Some(ev) = rx.recv() => sink.send(encode(&ev)?).await?,
        }
    }
}

/// A message for the portal, counted.
fn encode(m: &AgentMsg) -> Result<Message, serde_json::Error> {
    METRICS.message("out", m.kind());
    Ok(Message::text(serde_json::to_string(m)?))
}

/// This heartbeat: the GPUs' readings, the capacity, and the disk when it changed since
/// `disk_sent`.
async fn heartbeat_msg(
    parts: &Parts,
    fake: bool,
    disk_sent: &mut NodeDisk,
    offer_sent: &mut Option<commons_proto::NodeDatasets>,
) -> AgentMsg {
    let config = &parts.config;
    let gpu_stats = match parts.exec.gpu_stats(&*parts.gpus).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("GPU stats: {e}");
            Vec::new()
        }
    };
    METRICS.gpus(&parts.inventory, &gpu_stats);
    let mut beat = parts.exec.heartbeat(gpu_stats);
    if let AgentMsg::Heartbeat {
        capacity,
        disk,
        datasets,
        ..
    } = &mut beat
    {
        let offer = parts.exec.datasets_offer();
        if offer != *offer_sent {
            datasets.clone_from(&offer);
            *offer_sent = offer;
        }
        *capacity = owner::capacity::report(config.capacity, fake, &config.state_dir);
        let now = owner_disk(config);
        if now != *disk_sent {
            *disk = Some(now);
            *disk_sent = now;
        }
    }
    beat
}

/// Applies one text message from the portal; a new heartbeat period when it sets one.
fn on_text(parts: &Parts, text: &str) -> Option<Duration> {
    let msg: PortalMsg = match serde_json::from_str(text) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("ignoring a message this agent does not understand: {e}");
            return None;
        }
    };
    METRICS.message("in", msg.kind());
    orders::handle(msg, &parts.exec, &parts.relay, &parts.inventory)
}

/// The node's disk as the portal hears it (see `disk::floor`).
fn owner_disk(config: &AgentConfig) -> commons_proto::NodeDisk {
    crate::disk::floor::report(&config.disk, &config.state_dir)
}

/// `commons_agent_connected` is 1 while this lives.
struct Connected;

impl Connected {
    fn new() -> Self {
        METRICS.connections.inc();
        METRICS.connected.set(1);
        Connected
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        METRICS.connected.set(0);
    }
}

/// Background tasks aborted when the guard is dropped.
struct TaskGuard(Vec<tokio::task::JoinHandle<()>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_or_protocol_close_is_a_refusal_a_restart_is_not() {
        assert!(
            is_protocol_refusal(CloseCode::Policy),
            "the portal's version check"
        );
        assert!(is_protocol_refusal(CloseCode::Protocol));
        assert!(!is_protocol_refusal(CloseCode::Away), "a portal restart");
        assert!(!is_protocol_refusal(CloseCode::Normal));
    }

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
