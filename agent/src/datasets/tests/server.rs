//! A small scripted HTTP/1.1 server, plain or TLS with the test CA in `certs/`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

pub const CA_PEM: &[u8] = include_bytes!("certs/ca.pem");
const SERVER_PEM: &[u8] = include_bytes!("certs/server.pem");
const SERVER_KEY: &[u8] = include_bytes!("certs/server.key");

/// What the server answers to one request.
#[derive(Clone)]
pub enum Reply {
    Status(u16),
    Body(Vec<u8>),
    /// Says `Content-Length` of the whole, sends only the first half, and hangs up.
    CutOff(Vec<u8>),
}

pub struct Server {
    pub url: String,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl Server {
    /// Serves `replies` in order (the last one again and again), over TLS when `tls`.
    pub async fn start(replies: Vec<Reply>, tls: bool) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(AtomicUsize::new(0));
        let script = Arc::new(Mutex::new(replies));
        let acceptor = tls.then(acceptor);
        let seen = requests.clone();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let reply = {
                    let mut script = script.lock().expect("script");
                    if script.len() > 1 {
                        script.remove(0)
                    } else {
                        script[0].clone()
                    }
                };
                let seen = seen.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                serve(tls, reply, &seen).await;
                            }
                        }
                        None => serve(tcp, reply, &seen).await,
                    }
                });
            }
        });
        let scheme = if tls { "https" } else { "http" };
        Server {
            url: format!("{scheme}://127.0.0.1:{port}/datasets/imagenet.tar.gz?token=secret"),
            requests,
            connections,
        }
    }

    /// Requests read (over TLS: only after a handshake that succeeded).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Connections accepted, handshakes that failed included.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn acceptor() -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(SERVER_PEM)
        .collect::<Result<_, _>>()
        .expect("test certificate");
    let key = PrivateKeyDer::from_pem_slice(SERVER_KEY).expect("test key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("TLS server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, reply: Reply, seen: &AtomicUsize) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match io.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    seen.fetch_add(1, Ordering::SeqCst);
    let out = match reply {
        Reply::Status(code) => {
            format!("HTTP/1.1 {code} Scripted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .into_bytes()
        }
        Reply::Body(body) => {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(&body);
            out
        }
        Reply::CutOff(body) => {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(&body[..body.len() / 2]);
            out
        }
    };
    let _ = io.write_all(&out).await;
    let _ = io.flush().await;
    let _ = io.shutdown().await;
}
