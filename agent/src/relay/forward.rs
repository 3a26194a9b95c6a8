//! A relay to a TCP port on the container's loopback (`ssh -L 8888:localhost:8888`).
//!
//! The connection is made from inside the container's network namespace: a short-lived
//! thread enters it (`setns`, which changes only the calling thread) and connects to
//! `127.0.0.1:port` (or `[::1]:port`); the socket stays in that namespace when the thread
//! ends. So a server that listens on the container's localhost only (Jupyter's default) is
//! reachable, the job needs no published port, and the connection obeys the container's
//! own network rules.

use super::{next_incoming, send_ctl, Incoming, Ws};
use crate::runtime::ContainerRuntime;
use commons_proto::relay::{RelayCtl, Stream, RELAY_CHUNK_BYTES};
use commons_proto::JobId;
use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

pub async fn run<R: ContainerRuntime>(
    rt: &R,
    container: &str,
    job: JobId,
    port: u16,
    ws: Ws,
    mut closed: watch::Receiver<Option<String>>,
) -> anyhow::Result<()> {
    let (mut sink, stream) = ws.split();
    let Some(pid) = rt.main_pid(container).await else {
        let message = format!("job {job}'s container is not running");
        send_ctl(&mut sink, &RelayCtl::Closed { message }).await?;
        return Ok(());
    };
    let tcp = match tokio::task::spawn_blocking(move || connect_in(pid, port)).await? {
        Ok(s) => s,
        Err(e) => {
            let message = format!(
                "nothing accepts connections on port {port} inside job {job}'s container ({e})"
            );
            send_ctl(&mut sink, &RelayCtl::Closed { message }).await?;
            let _ = sink.close().await;
            return Ok(());
        }
    };
    tcp.set_nonblocking(true)?;
    let tcp = tokio::net::TcpStream::from_std(tcp)?;
    let _ = tcp.set_nodelay(true);
    let (mut rd, wr) = tcp.into_split();
    // Each direction on its own, so neither end waits for the other to read.
    let mut input_task = tokio::spawn(feed(stream, wr));
    let mut buf = vec![0u8; RELAY_CHUNK_BYTES];
    let last = loop {
        tokio::select! {
            n = rd.read(&mut buf) => match n {
                // The server in the container closed its side: say so; the user's side
                // may still send (the portal closes the relay when it is done).
                Ok(0) | Err(_) => break RelayCtl::Eof,
                Ok(n) => {
                    let mut frame = Vec::with_capacity(n + 1);
                    frame.push(Stream::Stdout as u8);
                    frame.extend_from_slice(&buf[..n]);
                    if sink.send(Message::binary(frame)).await.is_err() {
                        input_task.abort();
                        return Ok(());
                    }
                }
            },
            _ = &mut input_task => return Ok(()),
            _ = closed.changed() => {
                let message = closed.borrow().clone().unwrap_or_else(|| "the job stopped".into());
                break RelayCtl::Closed { message };
            }
        }
    };
    send_ctl(&mut sink, &last).await?;
    if matches!(last, RelayCtl::Eof) {
        // Half-closed: the user's bytes may still flow in until the portal ends the
        // relay (after the user's side closed too).
        let _ = input_task.await;
        let _ = sink.close().await;
        return Ok(());
    }
    super::finish(sink, input_task).await;
    Ok(())
}

/// Writes the user's bytes to the connection, and its end of input as a half-close,
/// until the portal closes the relay.
async fn feed(mut stream: SplitStream<Ws>, mut wr: OwnedWriteHalf) {
    loop {
        match next_incoming(&mut stream).await {
            Incoming::Data(b) => {
                // A server that closed its side just drops what follows.
                let _ = wr.write_all(&b).await;
            }
            Incoming::Ctl(RelayCtl::Eof) => {
                let _ = wr.shutdown().await;
            }
            Incoming::Ctl(_) => {}
            Incoming::Gone => return,
        }
    }
}

/// Connects to `port` on the loopback of the network namespace of process `pid`.
fn connect_in(pid: i64, port: u16) -> std::io::Result<TcpStream> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    // A thread of its own: setns changes the namespace of the calling thread only, and
    // this one ends right after, so no other task ever runs inside the container's.
    std::thread::spawn(move || {
        // SAFETY: setns(2) on a namespace file descriptor we own, for this thread only.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let timeout = Duration::from_secs(5);
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&v4, timeout).or_else(|e| {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            TcpStream::connect_timeout(&v6, timeout).map_err(|_| e)
        })
    })
    .join()
    .map_err(|_| std::io::Error::other("the connecting thread panicked"))?
}
