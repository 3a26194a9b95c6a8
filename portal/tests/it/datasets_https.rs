//! An `https:` lab dataset end to end with a real agent and the Docker Engine: a lab
//! admin registers `https://.../coco.tar.gz#sha256=HEX` served over TLS by a server this
//! test starts (its certificate from the agent's test CA, which the agent trusts through
//! `--dataset-ca`), a job names it, the agent fetches the archive, checks its SHA-256,
//! unpacks it into its cache and mounts it read-only at `/datasets/<name>`; the same
//! archive published under another SHA-256 fails the staging, naming the dataset.

use crate::support::files as f;
use crate::support::harness::Backend;
use serde_json::json;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CA_PEM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../agent/src/datasets/tests/certs/ca.pem"
);
const SERVER_PEM: &[u8] = include_bytes!("../../../agent/src/datasets/tests/certs/server.pem");
const SERVER_KEY: &[u8] = include_bytes!("../../../agent/src/datasets/tests/certs/server.key");

/// An HTTPS server on 127.0.0.1 (the name its certificate carries) that answers every
/// GET with one archive.
struct ArchiveServer {
    port: u16,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl ArchiveServer {
    fn start(archive: Vec<u8>) -> ArchiveServer {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(SERVER_PEM)
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(SERVER_KEY).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, stopped) = (requests.clone(), stop.clone());
        let archive = Arc::new(archive);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(tcp) = conn else { continue };
                let (config, seen, archive) = (config.clone(), seen.clone(), archive.clone());
                std::thread::spawn(move || {
                    let Ok(tls) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut io = rustls::StreamOwned::new(tls, tcp);
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match io.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    seen.fetch_add(1, Ordering::SeqCst);
                    let mut out = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/gzip\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        archive.len()
                    )
                    .into_bytes();
                    out.extend_from_slice(&archive);
                    let _ = io.write_all(&out);
                    io.conn.send_close_notify();
                    let _ = io.flush();
                });
            }
        });
        ArchiveServer {
            port,
            requests,
            stop,
        }
    }
}

impl Drop for ArchiveServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A `.tar.gz` of `labels.txt` and `sub/b.txt`, made by the system's `tar`.
fn archive() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("labels.txt"), "coco labels\n").unwrap();
    std::fs::write(src.join("sub/b.txt"), "beta\n").unwrap();
    let out = dir.path().join("coco.tar.gz");
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&out)
        .arg("-C")
        .arg(&src)
        .args(["labels.txt", "sub"])
        .status()
        .unwrap();
    assert!(status.success(), "tar: {status}");
    std::fs::read(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_dataset_is_fetched_checked_and_mounted_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |_| {}).await;
    let data = archive();
    let server = ArchiveServer::start(data.clone());
    let url = format!("https://127.0.0.1:{}/sets/coco.tar.gz", server.port);
    let wrong = f::sha256(b"another archive");
    for (name, sha) in [("coco", f::sha256(&data)), ("stale", wrong.clone())] {
        let body = json!({"name": name, "source": format!("{url}#sha256={sha}"),
                          "description": "test data", "visibility": "lab"});
        let (s, v) = p
            .post_json(&p.carol, "/api/v1/labs/vision/datasets", &body)
            .await;
        assert_eq!(s, 201, "{v}");
    }
    let _agent = p
        .agent_with(&p.url, "vision", "fake:1xA100-80GB", |c| {
            c.datasets.ca_file = Some(CA_PEM.into());
        })
        .await;

    let job = |name: &str, command: &str| {
        json!({"image": "commons-demo:latest", "command": ["sh", "-c", command], "gpus": 1,
               "time_limit_minutes": 10, "datasets": [{"lab": "vision", "name": name}]})
    };
    let read = "cat /datasets/coco/labels.txt /datasets/coco/sub/b.txt; \
                if touch /datasets/coco/new 2>/dev/null; then echo WROTE; else echo read-only; fi";
    let id = p.submit(&p.alice, job("coco", read)).await;
    let ends = ["succeeded", "failed", "cancelled"];
    let done = p
        .wait_state(&p.alice, id, &ends, Duration::from_secs(180))
        .await;
    let log = p.logs(&p.alice, id).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{log}");
    for line in [
        "coco labels",
        "beta",
        "read-only",
        "dataset vision/coco at /datasets/coco: fetched into this server's cache",
    ] {
        assert!(log.contains(line), "{line:?} in\n{log}");
    }
    assert!(!log.contains("WROTE"), "{log}");
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);

    // The same bytes published under another SHA-256: the staging fails, naming the
    // dataset and both checksums; nothing of it is mounted.
    let id = p.submit(&p.alice, job("stale", "echo RAN")).await;
    let done = p
        .wait_state(&p.alice, id, &ends, Duration::from_secs(180))
        .await;
    let log = p.logs(&p.alice, id).await;
    assert_eq!(done["state"], "failed", "{done}\n{log}");
    let why = format!("{done}{log}");
    for needle in [
        "dataset vision/stale",
        &format!("its SHA-256 is {}", f::sha256(&data)),
        &format!("not {wrong} as published"),
    ] {
        assert!(why.contains(needle), "{needle:?} in {why}");
    }
    assert!(!log.contains("RAN"), "{log}");
    assert_eq!(server.requests.load(Ordering::SeqCst), 2);
    p.stop().await;
}
