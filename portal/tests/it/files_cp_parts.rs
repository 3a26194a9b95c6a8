//! `commons cp` of a file over one part (8 MiB): the real binary sends it in parts
//! (`/api/v1/uploads`) through a proxy in front of the portal that records each request
//! it passes on (what reached the portal) and can drop one request's connection or hold
//! one forever. A lost part is sent again; a copy killed mid-way, run again, resumes the
//! same upload and sends only the parts the portal lacks.

use crate::cli::{Cli, Ran};
use crate::support::files::{self as f, list, noise, paths, sha256};
use crate::support::harness::{wait_for, Backend};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const PART: usize = 8 << 20;

/// What the proxy does, once, to a request whose target ends with a suffix.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Closes the connection without passing the request on.
    Drop,
    /// Reads no more of it and never answers.
    Hold,
}

#[derive(Default)]
struct Seen {
    /// `METHOD TARGET` of each request passed on, with the body when it is small.
    passed: Vec<(String, String)>,
    faults: Vec<(String, Fault)>,
}

/// An HTTP/1.1 proxy in front of the portal.
struct Proxy {
    url: String,
    seen: Arc<Mutex<Seen>>,
    held: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Proxy {
    async fn start(portal_url: &str, faults: Vec<(&str, Fault)>) -> Proxy {
        let to = portal_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Seen {
            passed: Vec::new(),
            faults: faults
                .into_iter()
                .map(|(s, f)| (s.to_string(), f))
                .collect(),
        }));
        let (held, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s, h, d) = (seen.clone(), held.clone(), dropped.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (to, s, h, d) = (to.clone(), s.clone(), h.clone(), d.clone());
                tokio::spawn(async move {
                    if let Ok(portal) = TcpStream::connect(&to).await {
                        let _ = relay(conn, portal, s, h, d).await;
                    }
                });
            }
        });
        Proxy {
            url: format!("http://127.0.0.1:{port}"),
            seen,
            held,
            dropped,
        }
    }

    /// The requests passed on to the portal that concern uploads in parts.
    fn uploads(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.passed
            .iter()
            .map(|(r, _)| r.clone())
            .filter(|r| r.contains("/api/v1/uploads"))
            .collect()
    }

    fn body_of(&self, request: &str) -> Option<String> {
        let seen = self.seen.lock().unwrap();
        seen.passed
            .iter()
            .find(|(r, _)| r == request)
            .map(|(_, b)| b.clone())
    }

    fn forget(&self) {
        self.seen.lock().unwrap().passed.clear();
    }
}

/// Passes requests from `client` to `portal` one at a time (a head, then exactly its
/// `content-length` of body), and every answer back as it comes.
async fn relay(
    client: TcpStream,
    portal: TcpStream,
    seen: Arc<Mutex<Seen>>,
    held: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let (from_client, mut to_client) = client.into_split();
    let (mut from_portal, mut to_portal) = portal.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_portal, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    let mut from_client = BufReader::new(from_client);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            if from_client.read_until(b'\n', &mut line).await? == 0 {
                return Ok(());
            }
            head.extend_from_slice(&line);
            if line == b"\r\n" {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let request: String = text
            .lines()
            .next()
            .unwrap_or("")
            .rsplit_once(' ')
            .map(|(r, _)| r.to_string())
            .unwrap_or_default();
        let len: u64 = text
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        let fault = {
            let mut s = seen.lock().unwrap();
            let i = s.faults.iter().position(|(end, _)| request.ends_with(end));
            i.map(|i| s.faults.remove(i).1)
        };
        match fault {
            Some(Fault::Drop) => {
                back.abort();
                dropped.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Some(Fault::Hold) => {
                held.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            None => {}
        }
        to_portal.write_all(&head).await?;
        let mut body = String::new();
        if len <= 4096 {
            let mut small = vec![0u8; len as usize];
            from_client.read_exact(&mut small).await?;
            to_portal.write_all(&small).await?;
            body = String::from_utf8_lossy(&small).into_owned();
        } else {
            let mut rest = (&mut from_client).take(len);
            tokio::io::copy(&mut rest, &mut to_portal).await?;
        }
        seen.lock().unwrap().passed.push((request, body));
    }
}

/// A copy of a 4-part file through the proxy: part 2's first try loses its connection
/// (sent again after a wait), part 3 never gets through and the copy is killed; run
/// again, it resumes the same upload with parts 3 and 4 only, and the file is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_cp_resumes_its_upload_sending_only_the_missing_parts() {
    let store = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, store.path(), |_| {}).await;
    let data = noise(3 * PART + 12_345, 21);
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big.bin").display().to_string();
    std::fs::write(&big, &data).unwrap();
    let proxy = Proxy::start(
        &p.url,
        vec![("/parts/1", Fault::Drop), ("/parts/2", Fault::Hold)],
    )
    .await;
    let cli = Cli::new();
    cli.ok(&["login", &proxy.url, "--token", &p.alice]).await;

    // The first run: parts 1 and 2 go (part 2 on its second try), part 3 hangs, and the
    // copy is killed there.
    let mut first = cli.command(&["cp", &big, "files:data/big.bin"]);
    let mut child = first
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(90), "the copy to reach part 3", || {
        let held = proxy.held.load(Ordering::SeqCst);
        let ended = child.try_wait().ok().flatten().is_some();
        async move { held == 1 || ended }
    })
    .await;
    let still_running = child.try_wait().unwrap().is_none();
    child.start_kill().unwrap();
    let killed: Ran = child.wait_with_output().await.unwrap().into();
    assert!(
        still_running && proxy.held.load(Ordering::SeqCst) == 1,
        "the copy should hang at part 3, not end: {killed}\nthe portal got {:?}",
        proxy.uploads()
    );
    assert_eq!(proxy.dropped.load(Ordering::SeqCst), 1, "{killed}");
    assert!(
        killed.stderr.contains("part 2 of 4 failed") && killed.stderr.contains("trying again"),
        "{killed}"
    );
    // The portal's view: one upload, its first two parts received, no file yet.
    let mine = p.get_json(&p.alice, "/api/v1/uploads").await;
    assert_eq!(mine.as_array().map(Vec::len), Some(1), "{mine}");
    let id = mine[0]["id"].as_i64().unwrap();
    assert_eq!(mine[0]["path"], "data/big.bin", "{mine}");
    assert_eq!(mine[0]["received"], serde_json::json!([0, 1]), "{mine}");
    assert!(paths(&list(&p, &p.alice, "/api/v1/files", "").await.body).is_empty());
    let up = format!("/api/v1/uploads/{id}");
    assert_eq!(
        proxy.uploads(),
        [
            "GET /api/v1/uploads".to_string(),
            "POST /api/v1/uploads".into(),
            format!("PUT {up}/parts/0"),
            format!("PUT {up}/parts/1"),
        ],
        "part 1's lost try never reached the portal"
    );
    // The start named the file's SHA-256, so the portal checks the join.
    let start = proxy.body_of("POST /api/v1/uploads").unwrap();
    let start: serde_json::Value = serde_json::from_str(&start).unwrap();
    assert_eq!(start["sha256"], sha256(&data), "{start}");
    assert_eq!(start["size"], data.len(), "{start}");

    // The second run resumes upload `id`: parts 3 and 4 only (the API counts from 0),
    // then the join.
    proxy.forget();
    let again = cli.ok(&["cp", &big, "files:data/big.bin"]).await;
    assert!(
        again
            .stderr
            .contains(&format!("resuming upload {id}, 2 of 4 parts already sent")),
        "{again}"
    );
    assert!(
        again.stderr.contains("-> files:data/big.bin (25.2 MB)"),
        "{again}"
    );
    assert_eq!(
        proxy.uploads(),
        [
            "GET /api/v1/uploads".to_string(),
            format!("PUT {up}/parts/2"),
            format!("PUT {up}/parts/3"),
            format!("POST {up}/complete"),
        ]
    );
    let (s, _, body) = f::get(&p, &p.alice, "/api/v1/files", "data/big.bin", None).await;
    assert!(s == 200 && body == data, "{s}: {} bytes", body.len());
    assert_eq!(
        p.get_json(&p.alice, "/api/v1/uploads").await,
        serde_json::json!([])
    );

    // A file that changed since an upload of the same size began: the portal refuses the
    // join (the start's checksum), and the copy sends it whole again.
    let changed = noise(data.len(), 22);
    let (s, v) = p
        .post_json(
            &p.alice,
            "/api/v1/uploads",
            &serde_json::json!({"path": "data/big.bin", "size": data.len(), "sha256": sha256(&data)}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    std::fs::write(&big, &changed).unwrap();
    let r = cli.ok(&["cp", &big, "files:data/big.bin"]).await;
    assert!(r.stderr.contains("changed since upload"), "{r}");
    let (s, _, body) = f::get(&p, &p.alice, "/api/v1/files", "data/big.bin", None).await;
    assert!(s == 200 && body == changed, "{s}: {} bytes", body.len());
    assert_eq!(
        p.get_json(&p.alice, "/api/v1/uploads").await,
        serde_json::json!([])
    );
}
