//! A relay to a process in the container (`docker exec`): a shell, a command, sftp.
//!
//! The process runs as the container's user (the job's, never root), with the container's
//! environment plus the SSH client's accepted variables and `TERM`. Input goes to its
//! stdin, output comes back tagged stdout or stderr (one stream with a terminal), its exit
//! status ends the relay. Signals go to the process through a pidfd ([`super::signals`]),
//! so none reaches another process that took its pid after it ended. When the user closes
//! the channel first, the process gets SIGHUP, as a terminal's would, and SIGKILL if it
//! ignores that.

use super::signals::ExecSignals;
use super::{next_incoming, send_ctl, Incoming, Ws};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use commons_proto::relay::{env_allowed, signal_number, RelayCtl, Stream, Tty, RELAY_CHUNK_BYTES};
use futures_util::{SinkExt, StreamExt};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

pub async fn run(
    docker: &bollard::Docker,
    container: &str,
    cmd: Vec<String>,
    tty: Option<Tty>,
    env: BTreeMap<String, String>,
    ws: Ws,
    mut closed: watch::Receiver<Option<String>>,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let mut vars: Vec<String> = env
        .into_iter()
        .filter(|(k, _)| env_allowed(k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if let Some(t) = &tty {
        vars.push(format!("TERM={}", t.term));
    }
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(tty.is_some()),
                env: Some(vars),
                cmd: Some(cmd),
                ..Default::default()
            },
        )
        .await;
    let id = match created {
        Ok(c) => c.id,
        Err(e) => {
            let message = format!("cannot start a process in the job's container: {e}");
            send_ctl(&mut sink, &RelayCtl::Closed { message }).await?;
            return Ok(());
        }
    };
    let started = docker
        .start_exec(
            &id,
            Some(StartExecOptions {
                detach: false,
                tty: tty.is_some(),
                output_capacity: Some(RELAY_CHUNK_BYTES),
            }),
        )
        .await?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        anyhow::bail!("the engine started the exec detached");
    };
    if let Some(t) = &tty {
        resize(docker, &id, t.cols, t.rows).await;
    }
    // Input and output move independently, so a process that writes before it reads (or
    // the other way round) never waits for us. The input side ends when the portal closes
    // the relay (the user closed the channel, or the relay is finished).
    let mut input_task = {
        let docker = docker.clone();
        let id = id.clone();
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
                        resize(&docker, &id, cols, rows).await
                    }
                    Incoming::Ctl(RelayCtl::Signal { name }) => {
                        if let Some(sig) = signal_number(&name) {
                            signals.send(&docker, sig).await;
                        }
                    }
                    Incoming::Ctl(_) => {}
                    Incoming::Gone => return,
                }
            }
        })
    };
    let mut signals = ExecSignals::new(&id);
    let mut user_gone: Option<tokio::time::Instant> = None;
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
                    let (tag, bytes) = match chunk {
                        LogOutput::StdErr { message } => (Stream::Stderr, message),
                        LogOutput::StdOut { message }
                        | LogOutput::Console { message }
                        | LogOutput::StdIn { message } => (Stream::Stdout, message),
                    };
                    for part in bytes.chunks(RELAY_CHUNK_BYTES) {
                        let mut frame = Vec::with_capacity(part.len() + 1);
                        frame.push(tag as u8);
                        frame.extend_from_slice(part);
                        if sink.send(Message::binary(frame)).await.is_err() && user_gone.is_none() {
                            user_gone = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                            signals.send(docker, libc::SIGHUP).await;
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!("exec output: {e}");
                    break None;
                }
                None => break None,
            },
            _ = &mut input_task, if user_gone.is_none() => {
                // The user closed the channel first: hang up, as a terminal would, and
                // kill what ignores that.
                user_gone = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                signals.send(docker, libc::SIGHUP).await;
            }
            _ = hangup_over => {
                signals.send(docker, libc::SIGKILL).await;
                return Ok(());
            }
            _ = closed.changed() => {
                break Some(closed.borrow().clone().unwrap_or_else(|| "the job stopped".into()));
            }
        }
    };
    if user_gone.is_some() {
        return Ok(());
    }
    let ctl = match ended {
        Some(message) => {
            signals.send(docker, libc::SIGKILL).await;
            RelayCtl::Closed { message }
        }
        None => match docker.inspect_exec(&id).await {
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
        },
    };
    send_ctl(&mut sink, &ctl).await?;
    super::finish(sink, input_task).await;
    Ok(())
}

async fn resize(docker: &bollard::Docker, id: &str, cols: u16, rows: u16) {
    let opts = ResizeExecOptions {
        height: rows.max(1),
        width: cols.max(1),
    };
    if let Err(e) = docker.resize_exec(id, opts).await {
        tracing::debug!("exec resize: {e}");
    }
}
