//! What flows on one SSH channel: its setup requests (terminal, environment), then a relay
//! to the job's container and the bytes both ways until the process exits, the user
//! closes the channel, or the job stops.
//!
//! The two directions run as separate tasks, so neither waits for the other: an SSH
//! client that stops reading slows the agent down through the relay's bounded queues, and
//! a process that writes before it reads never blocks its own input.

use crate::error::AppError;
use crate::service::relays::{self, FromAgent, Pipe, ToAgent};
use crate::service::ssh::{self as uc, Login};
use crate::state::AppState;
use commons_proto::relay::{RelayCtl, RelayTarget, Stream, Tty};
use commons_proto::Attempt;
use russh::server::Msg;
use russh::{Channel, ChannelMsg, Sig};
use std::collections::BTreeMap;

/// Variables a client may send (`SendEnv`); the same rule the agent applies.
pub fn env_accepted(name: &str) -> bool {
    commons_proto::relay::env_allowed(name)
}

/// At most this many variables, of at most this many bytes each, per channel.
const MAX_ENV: usize = 64;
const MAX_ENV_VALUE: usize = 4096;

fn dim(n: u32) -> u16 {
    u16::try_from(n.clamp(1, 1000)).unwrap_or(80)
}

/// A session channel: a shell, a command, or sftp.
pub async fn session(state: AppState, login: Login, mut channel: Channel<Msg>) {
    // Where the job runs is looked up while the client sends its requests: both are on
    // the way to the first output.
    let lookup = {
        let (state, job) = (state.clone(), login.job);
        tokio::spawn(async move { uc::running_attempt(&state, job).await })
    };
    let target = match requested(&mut channel).await {
        Ok(Some(t)) => t,
        Ok(None) => return,
        Err(message) => {
            fail(channel, message).await;
            return;
        }
    };
    tracing::debug!(step = "channel request", "SSH step");
    let what = match &target {
        RelayTarget::Exec { command: None, .. } => "shell",
        RelayTarget::Exec { .. } => "exec",
        RelayTarget::Sftp => "sftp",
        RelayTarget::Forward { .. } => "forward",
    };
    let found = match lookup.await {
        Ok(found) => found,
        Err(e) => Err(AppError::Internal(anyhow::anyhow!("{e}"))),
    };
    let pipe = match open(&state, &login, found, target).await {
        Ok(p) => p,
        Err(message) => {
            tracing::info!(job = login.job, what, "SSH channel refused: {message}");
            fail(channel, &message).await;
            return;
        }
    };
    tracing::info!(job = login.job, user = %login.user.username, what, "SSH channel open");
    // A session is use of the job's web app too (its idle rule), while it stays open.
    let _in_use = crate::service::apps::in_use(&state, login.job);
    pump(channel, pipe, false).await;
}

/// What the client asks the channel for, after its terminal and environment requests:
/// `None` when it closes first, `Err` for a request refused outright.
async fn requested(channel: &mut Channel<Msg>) -> Result<Option<RelayTarget>, &'static str> {
    let mut tty: Option<Tty> = None;
    let mut env = BTreeMap::new();
    loop {
        match channel.wait().await {
            Some(ChannelMsg::RequestPty {
                term,
                col_width,
                row_height,
                ..
            }) => {
                tty = Some(Tty {
                    term: term.chars().take(64).collect(),
                    cols: dim(col_width),
                    rows: dim(row_height),
                })
            }
            Some(ChannelMsg::WindowChange {
                col_width,
                row_height,
                ..
            }) => {
                if let Some(t) = &mut tty {
                    t.cols = dim(col_width);
                    t.rows = dim(row_height);
                }
            }
            Some(ChannelMsg::SetEnv {
                variable_name,
                variable_value,
                ..
            }) => {
                if env_accepted(&variable_name)
                    && env.len() < MAX_ENV
                    && variable_value.len() <= MAX_ENV_VALUE
                    && !variable_value.contains('\0')
                {
                    env.insert(variable_name, variable_value);
                }
            }
            Some(ChannelMsg::RequestShell { .. }) => {
                return Ok(Some(RelayTarget::Exec {
                    command: None,
                    tty: tty.clone(),
                    env: env.clone(),
                }));
            }
            Some(ChannelMsg::Exec { command, .. }) => {
                let command = String::from_utf8_lossy(&command).into_owned();
                if command.contains('\0') {
                    return Err("the command holds a NUL byte");
                }
                return Ok(Some(RelayTarget::Exec {
                    command: Some(command),
                    tty: tty.clone(),
                    env: env.clone(),
                }));
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) if name == "sftp" => {
                return Ok(Some(RelayTarget::Sftp));
            }
            Some(ChannelMsg::Close) | None => return Ok(None),
            Some(_) => {}
        }
    }
}

/// A `-L` forward to `port` on the container's localhost.
pub async fn forward(state: AppState, login: Login, channel: Channel<Msg>, port: u16) {
    let found = uc::running_attempt(&state, login.job).await;
    match open(&state, &login, found, RelayTarget::Forward { port }).await {
        Ok(pipe) => {
            tracing::info!(job = login.job, port, "SSH forward open");
            let _in_use = crate::service::apps::in_use(&state, login.job);
            pump(channel, pipe, true).await
        }
        Err(message) => {
            tracing::info!(job = login.job, port, "SSH forward refused: {message}");
            let _ = channel.close().await;
        }
    }
}

/// A relay to the job's container, where `found` (the job's lookup) says it runs, or
/// the words that say why there is none.
async fn open(
    state: &AppState,
    login: &Login,
    found: Result<Result<(i64, Attempt), String>, AppError>,
    target: RelayTarget,
) -> Result<Pipe, String> {
    let (node, attempt) = match found {
        Ok(Ok(x)) => x,
        Ok(Err(message)) => return Err(message),
        Err(e) => {
            tracing::error!(job = login.job, "SSH: looking the job up failed: {e:#}");
            return Err("the portal could not look the job up; try again".into());
        }
    };
    tracing::debug!(step = "job looked up", "SSH step");
    let relay_url = state.config.ssh.relay_url.clone();
    relays::open(state, node, login.job, attempt, relay_url, target)
        .await
        .map_err(|e| format!("job {}: {e}", login.job))
}

/// Tells the user why, on stderr, and ends the channel with status 255 (as ssh does when
/// it cannot run the command).
async fn fail(channel: Channel<Msg>, message: &str) {
    let text = format!("GPU Commons: {message}\r\n");
    let _ = channel.extended_data_bytes(1, text.into_bytes()).await;
    let _ = channel.exit_status(255).await;
    let _ = channel.eof().await;
    let _ = channel.close().await;
}

fn signal_name(sig: &Sig) -> Option<&'static str> {
    Some(match sig {
        Sig::HUP => "HUP",
        Sig::INT => "INT",
        Sig::QUIT => "QUIT",
        Sig::KILL => "KILL",
        Sig::TERM => "TERM",
        Sig::USR1 => "USR1",
        _ => return None,
    })
}

/// Moves bytes between the channel and the relay until either ends. `raw`: a forwarded
/// TCP connection (no stderr, no exit status).
async fn pump(channel: Channel<Msg>, pipe: Pipe, raw: bool) {
    let Pipe {
        to_agent,
        mut from_agent,
    } = pipe;
    let (mut read, write) = channel.split();
    let input = tokio::spawn(async move {
        while let Some(msg) = read.wait().await {
            let out = match msg {
                ChannelMsg::Data { data } => ToAgent::Data(data),
                ChannelMsg::Eof => ToAgent::Ctl(RelayCtl::Eof),
                ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                } => ToAgent::Ctl(RelayCtl::Resize {
                    cols: dim(col_width),
                    rows: dim(row_height),
                }),
                ChannelMsg::Signal { signal } => match signal_name(&signal) {
                    Some(name) => ToAgent::Ctl(RelayCtl::Signal { name: name.into() }),
                    None => continue,
                },
                ChannelMsg::Close => break,
                _ => continue,
            };
            if to_agent.send(out).await.is_err() {
                break;
            }
        }
        // Dropping `to_agent` ends the relay: the agent hangs the process up.
    });
    let mut status: Option<u32> = None;
    let mut first = true;
    while let Some(msg) = from_agent.recv().await {
        if first {
            tracing::debug!(step = "first frame from the agent", "SSH step");
            first = false;
        }
        let sent = match msg {
            FromAgent::Output(Stream::Stdout, b) => write.data_bytes(b).await,
            FromAgent::Output(Stream::Stderr, b) if !raw => write.extended_data_bytes(1, b).await,
            FromAgent::Output(Stream::Stderr, _) => Ok(()),
            FromAgent::Ctl(RelayCtl::Exit { code }) => {
                status = Some(u32::try_from(code).unwrap_or(255));
                break;
            }
            FromAgent::Ctl(RelayCtl::Closed { message }) => {
                if raw {
                    tracing::info!("SSH forward closed by the agent: {message}");
                } else {
                    let text = format!("\r\nGPU Commons: {message}\r\n");
                    let _ = write.extended_data_bytes(1, text.into_bytes()).await;
                    status = Some(255);
                }
                break;
            }
            FromAgent::Ctl(RelayCtl::Eof) => write.eof().await,
            FromAgent::Ctl(_) => Ok(()),
        };
        if let Err(e) = sent {
            tracing::warn!("SSH channel write failed: {e:?}");
            break;
        }
    }
    if let Some(code) = status {
        let _ = write.exit_status(code).await;
    }
    let _ = write.eof().await;
    let _ = write.close().await;
    input.abort();
}
