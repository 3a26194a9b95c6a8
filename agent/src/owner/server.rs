//! The agent's side of the control socket (see [`super::socket`]): binds it (0660, the
//! configured group), greets each client, applies its one request and answers.
//!
//! Settings go to the portal (`commons_proto::control`), which records them in the lab's
//! audit log as done on this server by the local user the socket's peer credentials
//! name. `reclaim --now` stops the guests here first and tells the portal after; `leave`
//! stops every job here, waits for them to go, then deregisters and ends the agent.

use super::socket::{
    gid_of, socket_path, user_of, Greeting, Reply, Request, AGENT_NAME, MAX_REQUEST,
};
use super::OwnerState;
use crate::executor::{ActiveAttempt, Executor};
use crate::gpu::GpuSource;
use anyhow::Context;
use commons_proto::{
    GpuInfo, GpuStat, NodeCommand, NodeControlAnswer, NodeState, StopReason, NODE_CONTROL_PATH,
};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// What the socket's requests need.
#[derive(Clone)]
pub struct Control {
    pub exec: Executor,
    pub gpus: Arc<dyn GpuSource>,
    pub inventory: Vec<GpuInfo>,
    pub owner: Arc<OwnerState>,
    pub portal: String,
    pub credential: String,
    pub node_name: String,
    pub http: reqwest::Client,
}

/// Binds the socket (replacing a stale one; refusing when another agent answers on it).
pub fn bind(state_dir: &std::path::Path, group: Option<&str>) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(state_dir);
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            anyhow::bail!(
                "another agent already listens on {} (one agent per state dir)",
                path.display()
            );
        }
        std::fs::remove_file(&path)
            .with_context(|| format!("removing the stale {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(group) = group {
        let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
        let gid = gid_of(&groups, group)
            .with_context(|| format!("--socket-group: no group {group:?} on this server"))?;
        std::os::unix::fs::chown(&path, None, Some(gid))
            .with_context(|| format!("giving {} to group {group}", path.display()))?;
    }
    Ok(listener)
}

/// Serves the socket for as long as the agent runs.
pub async fn serve(listener: UnixListener, ctl: Control) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let ctl = ctl.clone();
        tokio::spawn(async move {
            if let Err(e) = one(stream, &ctl).await {
                tracing::debug!("control socket client: {e:#}");
            }
        });
    }
}

async fn one(stream: UnixStream, ctl: &Control) -> anyhow::Result<()> {
    let by = stream
        .peer_cred()
        .ok()
        .map(|c| c.uid())
        .map(|uid| {
            let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
            user_of(&passwd, uid).unwrap_or_else(|| format!("uid {uid}"))
        })
        .unwrap_or_else(|| "someone".into());
    let (read, mut write) = stream.into_split();
    let mut greeting = serde_json::to_string(&Greeting {
        agent: AGENT_NAME.into(),
        node: ctl.node_name.clone(),
    })?;
    greeting.push('\n');
    write.write_all(greeting.as_bytes()).await?;
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(MAX_REQUEST as u64);
    tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line)).await??;
    let reply = match serde_json::from_str::<Request>(line.trim()) {
        Ok(req) => {
            tracing::info!(?req, %by, "command on the server");
            apply(ctl, req, &by).await
        }
        Err(e) => Reply {
            ok: false,
            message: format!("not a request this agent understands: {e}"),
        },
    };
    let mut text = serde_json::to_string(&reply)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    Ok(())
}

async fn apply(ctl: &Control, req: Request, by: &str) -> Reply {
    let by = by.to_string();
    let result = match req {
        Request::Status => status(ctl).await,
        Request::Lend { mode, windows } => {
            forward(ctl, NodeCommand::Lend { mode, windows, by }).await
        }
        Request::Drain => forward(ctl, NodeCommand::Drain { by }).await,
        Request::Undrain => forward(ctl, NodeCommand::Undrain { by }).await,
        Request::Reclaim { on } => reclaim(ctl, on, by).await,
        Request::Leave => leave(ctl, by).await,
    };
    match result {
        Ok(message) => Reply { ok: true, message },
        Err(e) => Reply {
            ok: false,
            message: format!("{e:#}"),
        },
    }
}

fn url(ctl: &Control) -> String {
    format!("{}{NODE_CONTROL_PATH}", ctl.portal.trim_end_matches('/'))
}

/// Sends a command to the portal; its answer's words, or why it refused.
async fn send(ctl: &Control, cmd: &NodeCommand) -> anyhow::Result<NodeControlAnswer> {
    let resp = ctl
        .http
        .post(url(ctl))
        .bearer_auth(&ctl.credential)
        .json(cmd)
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .with_context(|| format!("cannot reach the portal at {}; nothing changed", ctl.portal))?;
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        let why = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or(body);
        anyhow::bail!("the portal refused ({status}): {why}");
    }
    serde_json::from_str(&body).context("the portal's answer")
}

async fn forward(ctl: &Control, cmd: NodeCommand) -> anyhow::Result<String> {
    Ok(send(ctl, &cmd).await?.message)
}

/// Stops the guests here now (each with its grace), then tells the portal.
async fn reclaim(ctl: &Control, on: bool, by: String) -> anyhow::Result<String> {
    ctl.owner.reclaimed.store(on, Ordering::SeqCst);
    let mut lines = Vec::new();
    if on {
        let guests: Vec<_> = ctl
            .exec
            .active()
            .into_iter()
            .filter(|a| a.guest())
            .collect();
        for g in &guests {
            let grace = g
                .spec
                .as_ref()
                .and_then(|s| s.grace_s)
                .unwrap_or(super::watch::DEFAULT_GRACE_S);
            ctl.exec.stop(
                g.job,
                g.attempt,
                grace,
                StopReason::Preempted,
                Some("the owner took the server back (reclaim --now)"),
            );
            lines.push(format!("job {} stopping (grace {grace} s)", g.job));
        }
        if guests.is_empty() {
            lines.push("no guest runs here".into());
        }
    }
    match send(ctl, &NodeCommand::Reclaim { on, by }).await {
        Ok(a) => lines.push(a.message),
        Err(e) if on => lines.push(format!(
            "{e:#}; guests are stopped here all the same, and none starts while the agent runs"
        )),
        Err(e) => return Err(e),
    }
    Ok(lines.join("\n"))
}

/// Drains the node, stops every job here, waits for them to go (their grace, plus a
/// minute), then deregisters the node and ends the agent.
async fn leave(ctl: &Control, by: String) -> anyhow::Result<String> {
    // Drained first, so nothing starts here again while the jobs go.
    send(ctl, &NodeCommand::Drain { by: by.clone() }).await?;
    let active = ctl.exec.active();
    let mut longest = 0;
    for a in &active {
        let grace = a
            .spec
            .as_ref()
            .and_then(|s| s.grace_s)
            .unwrap_or(super::watch::DEFAULT_GRACE_S);
        longest = longest.max(grace);
        ctl.exec.stop(
            a.job,
            a.attempt,
            grace,
            StopReason::Preempted,
            Some("the server leaves GPU Commons"),
        );
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(longest + 60);
    while !ctl.exec.active().is_empty() {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("jobs here did not stop in time; the node did not leave");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Let the last reports reach the portal before the credential stops working.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answer = send(ctl, &NodeCommand::Leave { by }).await?;
    ctl.owner.left.notify_one();
    Ok(format!(
        "{} job(s) stopped and requeued; {}",
        active.len(),
        answer.message
    ))
}

/// GPUs, what runs on each, whether each is lent and why not, and the portal link.
async fn status(ctl: &Control) -> anyhow::Result<String> {
    let portal = portal_state(ctl).await;
    let stats = ctl.exec.gpu_stats(&*ctl.gpus).await.unwrap_or_default();
    let attempts = ctl.exec.active();
    let mut out = String::new();
    let _ = writeln!(out, "node {}", ctl.node_name);
    link_lines(&mut out, ctl);
    match &portal {
        Ok(p) => {
            let _ = writeln!(
                out,
                "lending: {}{}{}{}",
                p.lending,
                if p.lending_now {
                    ", lending now"
                } else {
                    ", not lending now"
                },
                if p.draining { ", DRAINED" } else { "" },
                if p.reclaim { ", RECLAIMED" } else { "" },
            );
        }
        Err(e) => {
            let _ = writeln!(out, "lending: unknown (the portal is {e})");
        }
    }
    if ctl.owner.is_reclaimed() {
        let _ = writeln!(out, "reclaim --now is in force here: no guest runs");
    }
    let (now, wall) = (crate::clock::now(), chrono::Utc::now());
    for g in &ctl.inventory {
        gpu_line(&mut out, g, &stats, &portal);
        for a in attempts.iter().filter(|a| a.gpus.contains(&g.uuid)) {
            attempt_line(&mut out, a, now, wall);
        }
    }
    Ok(out.trim_end().to_string())
}

/// The node as the portal sees it (its lending), or why the portal could not say.
async fn portal_state(ctl: &Control) -> Result<NodeState, String> {
    let resp = ctl
        .http
        .get(url(ctl))
        .bearer_auth(&ctl.credential)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| format!("not reachable: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    resp.json().await.map_err(|e| e.to_string())
}

/// The portal link: connected or not, since when, and its last error.
fn link_lines(out: &mut String, ctl: &Control) {
    let link = ctl.owner.link();
    let _ = writeln!(
        out,
        "portal {}: {}{}",
        ctl.portal,
        if link.connected {
            "connected"
        } else {
            "NOT connected"
        },
        if link.since.is_empty() {
            String::new()
        } else {
            format!(" since {}", link.since)
        }
    );
    if let Some(e) = &link.last_error {
        let _ = writeln!(out, "  last error: {e}");
    }
}

/// One GPU: its reading, the owner's use, a fault, and whether the portal lends it.
fn gpu_line(out: &mut String, g: &GpuInfo, stats: &[GpuStat], portal: &Result<NodeState, String>) {
    let s = stats.iter().find(|s| s.uuid == g.uuid);
    let lent = match portal {
        Ok(p) => match p.gpus.iter().find(|x| x.uuid == g.uuid) {
            Some(x) if x.lendable => "lent when free".to_string(),
            Some(x) => format!("not lent: {}", x.why),
            None => "not known to the portal".into(),
        },
        Err(_) => "lending unknown".into(),
    };
    let _ = writeln!(
        out,
        "GPU {} {} {} ({} GB): util {}%, {} MB used{}{}; {}",
        g.index,
        g.uuid,
        g.model,
        g.memory_mb / 1024,
        s.map(|s| s.utilization_pct).unwrap_or(0),
        s.map(|s| s.memory_used_mb).unwrap_or(0),
        if s.is_some_and(|s| s.local_use) {
            ", LOCAL USE by the owner"
        } else {
            ""
        },
        s.and_then(|s| s.fault.as_ref())
            .map(|f| format!(", FAULT: {f}"))
            .unwrap_or_default(),
        lent
    );
}

/// One attempt on a GPU: whose, guest or owner, since when (wall clock, from the boot
/// clock's `now`), and whether it is stopping.
fn attempt_line(
    out: &mut String,
    a: &ActiveAttempt,
    now: Duration,
    wall: chrono::DateTime<chrono::Utc>,
) {
    let since = a
        .started
        .map(|st| {
            let ago = now.saturating_sub(st);
            (wall - chrono::Duration::seconds(ago.as_secs() as i64))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
        .unwrap_or_else(|| "starting".into());
    let (user, lab) = a
        .spec
        .as_ref()
        .map(|s| (s.user.clone(), s.lab.clone().unwrap_or_default()))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  job {} attempt {}: user {user}, lab {lab}, {}, since {since}{}",
        a.job,
        a.attempt,
        if a.guest() { "guest" } else { "owner" },
        if a.stopping { ", STOPPING" } else { "" }
    );
}
