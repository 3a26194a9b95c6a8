//! Whether a job's app is up: each replica asks, every [`EVERY`], the apps of the running
//! jobs whose agents are connected to it and that have not answered during their current
//! attempt. A probe is an HTTP `GET /` relayed to the app's port through the agent (so
//! inside the container's network, where the app listens); any answer, even an error
//! status, means the app is up, and the job then shows its URL and **Open**.
//! Until then the job page says the app is starting, instead of a link to a 502.

use super::pipe;
use crate::service::apps as svc;
use crate::service::relays;
use crate::state::AppState;
use commons_proto::relay::RelayTarget;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How often the apps still starting are asked.
const EVERY: Duration = Duration::from_secs(2);
/// How long one probe may take, relay included.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Probes until aborted.
pub async fn run(state: AppState) {
    let busy: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let due = match svc::to_probe(&state).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("listing the apps to probe failed: {e}");
                continue;
            }
        };
        for app in due {
            if !state.agents.is_connected(app.node_id)
                || !busy
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(app.job_id)
            {
                continue;
            }
            let state = state.clone();
            let busy = busy.clone();
            tokio::spawn(async move {
                let job = app.job_id;
                let answered = tokio::time::timeout(PROBE_TIMEOUT, probe(&state, &app))
                    .await
                    .unwrap_or_else(|_| Err("no answer in time".to_string()));
                match answered {
                    Ok(bytes) => {
                        tracing::info!(job, attempt = app.attempt, bytes, "app answered");
                        if let Err(e) = svc::mark_ready(&state, job, app.attempt).await {
                            tracing::warn!(job, "recording the app's answer failed: {e}");
                        }
                    }
                    Err(why) => tracing::debug!(job, "app not up yet: {why}"),
                }
                busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&job);
            });
        }
    }
}

/// One `GET /` to the app: whether it sent anything back (any answer, even one that is
/// not HTTP/1.1 as a client expects, such as a `101`, means something listens). Whatever
/// fails to connect inside the container closes the relay, so nothing comes back.
async fn probe(state: &AppState, app: &svc::ToProbe) -> Result<usize, String> {
    let port = u16::try_from(app.port).map_err(|e| e.to_string())?;
    let pipe = relays::open(
        state,
        app.node_id,
        app.job_id,
        app.attempt,
        state.config.ssh.relay_url.clone(),
        RelayTarget::Forward { port },
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut io = pipe::into_stream(pipe);
    let req = format!(
        "GET / HTTP/1.1\r\nHost: localhost:{port}\r\nUser-Agent: gpu-commons-probe\r\n\
         Connection: close\r\n\r\n"
    );
    io.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    match io.read(&mut buf).await {
        Ok(0) => Err("the connection closed without an answer".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
