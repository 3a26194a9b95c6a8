//! The accepted SSH socket, acknowledging at once what it reads during the handshake.
//!
//! OpenSSH's client sends its key exchange with Nagle's algorithm on: its
//! `KEX_ECDH_INIT`, a small packet right behind its `KEXINIT`, waits until the gateway
//! acknowledges the `KEXINIT`. Linux delays that acknowledgement (up to 40 ms) when the
//! connection looks interactive, which it does once the gateway has sent its own
//! `KEXINIT`, so about every other new connection lost 40 ms before the key exchange
//! went on (`ssh_figures --profile`: `expecting SSH2_MSG_KEX_ECDH_REPLY` at 6 ms, the
//! reply at 47 ms). `TCP_QUICKACK` after each of the first reads sends the pending
//! acknowledgement at once; after the handshake the socket is left as it is (the flag
//! costs a system call, and a session's data acknowledges itself).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Reads after which the socket is left alone: the banner, the key exchange and the
/// login take fewer.
const HANDSHAKE_READS: u8 = 16;

/// A TCP stream that acknowledges its first reads at once.
pub struct QuickAck {
    inner: TcpStream,
    reads_left: u8,
}

impl QuickAck {
    pub fn new(inner: TcpStream) -> Self {
        Self {
            inner,
            reads_left: HANDSHAKE_READS,
        }
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.reads_left > 0 && matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before
        {
            self.reads_left -= 1;
            // Best effort: a socket that refuses it only acknowledges later.
            let _ = socket2::SockRef::from(&self.inner).set_tcp_quickack(true);
        }
        read
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes pass both ways unchanged, and only the first reads set the flag.
    #[tokio::test]
    async fn passes_bytes_through_and_leaves_the_socket_after_the_handshake() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(at).await.unwrap();
            for i in 0..20u8 {
                s.write_all(&[i]).await.unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.unwrap();
                assert_eq!(b[0], i + 1);
            }
        });
        let (socket, _) = listener.accept().await.unwrap();
        let mut q = QuickAck::new(socket);
        for i in 0..20u8 {
            let mut b = [0u8; 1];
            q.read_exact(&mut b).await.unwrap();
            assert_eq!(b[0], i);
            q.write_all(&[i + 1]).await.unwrap();
        }
        client.await.unwrap();
        assert_eq!(q.reads_left, 0);
    }
}
