//! A relay to a process in the container (an exec, through the `ContainerRuntime`): a
//! shell, a command, sftp.
//!
//! The process runs as the container's user (the job's, never root), in the container's
//! cgroups (so under the job's limits), with the container's environment plus the SSH
//! client's accepted variables that the job does not set, and `TERM`: a session can add
//! variables but never give one of the job's (a limit carried in the environment, say)
//! another value. Input goes to its
//! stdin, output comes back tagged stdout or stderr (one stream with a terminal), its exit
//! status ends the relay. Signals go to the process through a pidfd ([`super::signals`]),
//! so none reaches another process that took its pid after it ended. When the user closes
//! the channel first, the process gets SIGHUP, as a terminal's would, and SIGKILL if it
//! ignores that.

use super::signals::ExecSignals;
use super::{next_incoming, send_ctl, Incoming, Ws};
use crate::runtime::{ContainerRuntime, ExecOutput, ExecRequest, RuntimeError};
use commons_proto::relay::{env_allowed, signal_number, RelayCtl, Stream, Tty, RELAY_CHUNK_BYTES};
use futures_util::stream::{BoxStream, SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

type Sink = SplitSink<Ws, Message>;
/// How long a process has between the hang-up and the kill, once the user is gone.
const HANGUP_GRACE: Duration = Duration::from_secs(2);

/// An exec created in the job's container, not started yet: made while the relay is
/// being dialled, so the engine's work and the dial overlap.
pub struct Prepared {
    id: String,
    tty: Option<Tty>,
}

/// Creates the exec for `cmd` in `container` (the job's environment read first), or the
/// words for the user when it cannot. Nothing runs until [`run`] starts it; an exec never
/// started goes with its container.
pub async fn prepare<R: ContainerRuntime>(
    rt: &R,
    container: &str,
    cmd: Vec<String>,
    tty: Option<Tty>,
    env: BTreeMap<String, String>,
) -> Result<Prepared, String> {
    // The job's environment only filters the client's variables: without any, the
    // engine is not asked (one call less before the process starts).
    let job_env = if env.is_empty() {
        Vec::new()
    } else {
        rt.env(container)
            .await
            .map_err(|e| format!("cannot read the job's environment: {e}"))?
    };
    tracing::debug!(step = "job environment read", "SSH step");
    let req = request(cmd, tty.as_ref(), env, &job_env);
    let id = rt
        .exec_create(container, &req)
        .await
        .map_err(|e| format!("cannot start a process in the job's container: {e}"))?;
    tracing::debug!(step = "exec created", "SSH step");
    Ok(Prepared { id, tty })
}

/// Starts a prepared exec and relays it over `ws` until it ends, the user leaves, or
/// `closed` says the job stops.
pub async fn run<R: ContainerRuntime>(
    rt: Arc<R>,
    prepared: Result<Prepared, String>,
    ws: Ws,
    mut closed: watch::Receiver<Option<String>>,
) -> anyhow::Result<()> {
    let (mut sink, stream) = ws.split();
    let Prepared { id, tty } = match prepared {
        Ok(p) => p,
        Err(message) => {
            send_ctl(&mut sink, &RelayCtl::Closed { message }).await?;
            return Ok(());
        }
    };
    let io = rt.exec_start(&id, tty.is_some()).await?;
    tracing::debug!(step = "exec started", "SSH step");
    if let Some(t) = &tty {
        resize(&*rt, &id, t.cols, t.rows).await;
    }
    let mut input_task = spawn_input(rt.clone(), id.clone(), stream, io.input);
    let mut signals = ExecSignals::new(&id);
    let pumped = pump(
        &*rt,
        &mut sink,
        io.output,
        &mut input_task,
        &mut signals,
        &mut closed,
    )
    .await;
    let ctl = match pumped {
        Ended::UserGone => return Ok(()),
        Ended::Closed(message) => {
            signals.send(&*rt, libc::SIGKILL).await;
            RelayCtl::Closed { message }
        }
        Ended::Output => exit_ctl(&*rt, &id, &closed).await,
    };
    send_ctl(&mut sink, &ctl).await?;
    super::finish(sink, input_task).await;
    Ok(())
}

/// The exec for `cmd`: the client's accepted variables that the job's environment
/// (`job_env`, `NAME=value`s) does not set, and `TERM` with a terminal.
fn request(
    cmd: Vec<String>,
    tty: Option<&Tty>,
    env: BTreeMap<String, String>,
    job_env: &[String],
) -> ExecRequest {
    let set_by_job = |k: &str| {
        job_env
            .iter()
            .any(|e| e.split_once('=').map_or(e.as_str(), |(n, _)| n) == k)
    };
    let mut vars: Vec<String> = env
        .into_iter()
        .filter(|(k, _)| env_allowed(k) && !set_by_job(k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if let Some(t) = tty {
        vars.push(format!("TERM={}", t.term));
    }
    ExecRequest {
        cmd,
        env: vars,
        tty: tty.is_some(),
    }
}

/// Feeds the portal's side to the process: its bytes to stdin, and its end of input,
/// resizes and signals. Input and output move independently, so a process that writes
/// before it reads (or the other way round) never waits for us. It ends when the portal
/// closes the relay (the user closed the channel, or the relay is finished).
fn spawn_input<R: ContainerRuntime>(
    rt: Arc<R>,
    id: String,
    mut stream: SplitStream<Ws>,
    mut input: Pin<Box<dyn AsyncWrite + Send>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut signals = ExecSignals::new(&id);
        loop {
            match next_incoming(&mut stream).await {
                Incoming::Data(b) => {
                    // A process that closed its stdin just drops what follows.
                    let _ = input.write_all(&b).await;
                }
                Incoming::Ctl(RelayCtl::Eof) => {
                    let _ = input.shutdown().await;
                }
                Incoming::Ctl(RelayCtl::Resize { cols, rows }) => {
                    resize(&*rt, &id, cols, rows).await
                }
                Incoming::Ctl(RelayCtl::Signal { name }) => {
                    if let Some(sig) = signal_number(&name) {
                        signals.send(&*rt, sig).await;
                    }
                }
                Incoming::Ctl(_) => {}
                Incoming::Gone => return,
            }
        }
    })
}

/// How the relaying of output ended.
enum Ended {
    /// The user left (and the process got its hang-up, and its kill if need be): nobody
    /// is there to tell.
    UserGone,
    /// The process's output ended (it exited, or the engine lost it).
    Output,
    /// The job stops: these words for the user.
    Closed(String),
}

/// Relays the process's output to the user until one side ends.
async fn pump<R: ContainerRuntime>(
    rt: &R,
    sink: &mut Sink,
    mut output: BoxStream<'static, Result<ExecOutput, RuntimeError>>,
    input_task: &mut JoinHandle<()>,
    signals: &mut ExecSignals,
    closed: &mut watch::Receiver<Option<String>>,
) -> Ended {
    let mut user_gone: Option<tokio::time::Instant> = None;
    let mut first_output = true;
    let ended = loop {
        let hangup_over = async {
            match user_gone {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            out = output.next() => match out {
                Some(Ok(chunk)) => {
                    if first_output {
                        tracing::debug!(step = "first output", "SSH step");
                        first_output = false;
                    }
                    if !forward(sink, chunk).await && user_gone.is_none() {
                        user_gone = Some(tokio::time::Instant::now() + HANGUP_GRACE);
                        signals.send(rt, libc::SIGHUP).await;
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!("exec output: {e}");
                    break Ended::Output;
                }
                None => break Ended::Output,
            },
            _ = &mut *input_task, if user_gone.is_none() => {
                // The user closed the channel first: hang up, as a terminal would, and
                // kill what ignores that.
                user_gone = Some(tokio::time::Instant::now() + HANGUP_GRACE);
                signals.send(rt, libc::SIGHUP).await;
            }
            _ = hangup_over => {
                signals.send(rt, libc::SIGKILL).await;
                return Ended::UserGone;
            }
            _ = closed.changed() => {
                break Ended::Closed(closed.borrow().clone().unwrap_or_else(|| "the job stopped".into()));
            }
        }
    };
    if user_gone.is_some() {
        return Ended::UserGone;
    }
    ended
}

/// Sends one piece of output, tagged with its stream, in relay-sized frames; false when
/// the portal's side is gone.
async fn forward(sink: &mut Sink, chunk: ExecOutput) -> bool {
    let (tag, bytes) = match chunk {
        ExecOutput::Err(b) => (Stream::Stderr, b),
        ExecOutput::Out(b) => (Stream::Stdout, b),
    };
    let mut sent = true;
    for part in bytes.chunks(RELAY_CHUNK_BYTES) {
        let mut frame = Vec::with_capacity(part.len() + 1);
        frame.push(tag as u8);
        frame.extend_from_slice(part);
        sent &= sink.send(Message::binary(frame)).await.is_ok();
    }
    sent
}

/// What the user hears once the output ended: the exit status, or why there is none.
async fn exit_ctl<R: ContainerRuntime>(
    rt: &R,
    id: &str,
    closed: &watch::Receiver<Option<String>>,
) -> RelayCtl {
    match rt.exec_inspect(id).await {
        Ok(i) => match (i.running, i.exit_code) {
            (Some(false), Some(code)) => RelayCtl::Exit { code },
            _ => RelayCtl::Closed {
                message: closed
                    .borrow()
                    .clone()
                    .unwrap_or_else(|| "the job's container stopped".into()),
            },
        },
        Err(_) => RelayCtl::Closed {
            message: "the job's container is gone".into(),
        },
    }
}

async fn resize<R: ContainerRuntime>(rt: &R, id: &str, cols: u16, rows: u16) {
    if let Err(e) = rt.exec_resize(id, cols.max(1), rows.max(1)).await {
        tracing::debug!("exec resize: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_session_adds_variables_but_never_changes_the_jobs() {
        let job_env = ["LIMIT=10".to_string(), "PATH=/bin".to_string()];
        let client = vars(&[
            ("LIMIT", "99"),
            ("PATH", "/tmp"),
            ("EXTRA", "1"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"),
            ("LD_PRELOAD", "/x.so"),
        ]);
        let tty = Tty {
            term: "xterm".into(),
            cols: 80,
            rows: 24,
        };
        let req = request(vec!["sh".into()], Some(&tty), client, &job_env);
        assert_eq!(
            req.env,
            vec!["EXTRA=1".to_string(), "TERM=xterm".to_string()]
        );
        assert!(req.tty);
    }
}
