//! A relay to a port in a job's container, as a byte stream an HTTP client can speak
//! over.

use crate::service::relays::{FromAgent, Pipe, ToAgent};
use bytes::Bytes;
use commons_proto::relay::RelayCtl;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Bytes buffered in each direction inside this process.
const BUFFER: usize = 256 * 1024;

/// Joins `pipe` to one end of an in-memory stream and returns the other. The relay ends
/// when the returned stream is dropped (the sender to the agent goes with it), or when
/// the app closes its connection.
pub fn into_stream(pipe: Pipe) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(BUFFER);
    let (mut read, mut write) = tokio::io::split(ours);
    let Pipe {
        to_agent,
        mut from_agent,
    } = pipe;
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = Bytes::copy_from_slice(&buf[..n]);
                    if to_agent.send(ToAgent::Data(data)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_agent.send(ToAgent::Ctl(RelayCtl::Eof)).await;
        // Dropping `to_agent` ends the relay.
    });
    tokio::spawn(async move {
        while let Some(msg) = from_agent.recv().await {
            match msg {
                FromAgent::Output(_, data) => {
                    if write.write_all(&data).await.is_err() {
                        break;
                    }
                }
                FromAgent::Ctl(RelayCtl::Eof) => {
                    let _ = write.shutdown().await;
                }
                FromAgent::Ctl(RelayCtl::Closed { message }) => {
                    tracing::debug!("app connection closed by the agent: {message}");
                    break;
                }
                FromAgent::Ctl(_) => {}
            }
        }
        let _ = write.shutdown().await;
    });
    theirs
}
