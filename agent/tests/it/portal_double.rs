//! A test double of the portal's checkpoint API (`commons_proto::CHECKPOINTS_PATH`): a
//! small HTTP/1.1 server on loopback, one request per connection, with the same paths,
//! headers and answers as the portal (parts checked by SHA-256, commits checked whole and
//! idempotent, `latest` with its checksum), every request logged, and switches to fail
//! on purpose (damaged downloads, parts refused, the lab's cap, everything down).

use commons_proto::{
    CheckpointCommit, CheckpointCommitted, CheckpointPart, CHECKPOINTS_PATH,
    CHECKPOINT_ATTEMPT_HEADER, PART_BYTES_HEADER, SHA256_HEADER,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub(crate) const CREDENTIAL: &str = "node-secret";

/// One request as the double saw it, and its answer's status.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub method: String,
    pub path: String,
    pub status: u16,
}

/// A committed checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct Committed {
    pub job: i64,
    pub attempt: i32,
    pub archive: Vec<u8>,
    /// How long the agent said the checkpoint took to write.
    pub write_ms: Option<u64>,
}

#[derive(Default)]
pub(crate) struct State {
    pub part_bytes: u64,
    /// Served by `latest`: the archive, the checksum to announce, the attempt.
    pub latest: Option<(Vec<u8>, String, i32)>,
    staged: BTreeMap<(i64, i32), BTreeMap<u32, Vec<u8>>>,
    pub commits: Vec<Committed>,
    pub seen: Vec<Seen>,
    /// PUTs of part `n` at or above this fail with 503.
    pub fail_parts_from: Option<u32>,
    /// Every request fails with 503.
    pub down: bool,
    /// Commits are refused: the lab is over its cap.
    pub cap: bool,
    /// Commits take this long to answer.
    pub commit_delay: Duration,
    /// Parts take this long to answer.
    pub part_delay: Duration,
    /// As a portal that predates `write_ms`: a commit with a field it does not know is
    /// refused (400).
    pub before_write_ms: bool,
    /// The inputs API: the files listed (path, contents, announced SHA-256).
    pub inputs: Vec<(String, Vec<u8>, String)>,
    /// GETs of an input file fail with 503 this many more times, by path.
    pub input_failures: BTreeMap<String, u32>,
    /// The listing is refused (422) with this message.
    pub inputs_refused: Option<String>,
    /// Staging reports received.
    pub staging: Vec<serde_json::Value>,
    /// Input files take this long to answer.
    pub input_delay: Duration,
    /// Listings give each input a signed URL of the double's "store" (`/store/{path}?
    /// sig=...`), valid this many seconds.
    pub signed_valid_s: Option<u32>,
    /// GETs of the store are refused (403, as an expired URL) this many more times.
    pub store_refusals: u32,
    /// GETs of the store that carried an `Authorization` header.
    pub store_saw_credential: u32,
}

#[derive(Clone)]
pub(crate) struct PortalDouble {
    pub url: String,
    pub state: Arc<Mutex<State>>,
}

impl PortalDouble {
    pub(crate) async fn start(part_bytes: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            part_bytes,
            ..Default::default()
        }));
        let s = state.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, s.clone()));
            }
        });
        Self { url, state }
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Serves `archive` as the job's latest checkpoint, announcing `sha256`.
    pub(crate) fn set_latest(&self, archive: Vec<u8>, sha256: Option<&str>, attempt: i32) {
        let sha = sha256.map_or_else(|| hex::encode(Sha256::digest(&archive)), str::to_string);
        self.with(|s| s.latest = Some((archive, sha, attempt)));
    }

    pub(crate) fn commits(&self) -> Vec<Committed> {
        self.with(|s| s.commits.clone())
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.with(|s| s.seen.clone())
    }

    /// Successful PUTs of each part number.
    pub(crate) fn parts_accepted(&self) -> BTreeMap<u32, usize> {
        let mut out = BTreeMap::new();
        for s in self.seen() {
            if s.method == "PUT" && s.status == 200 {
                let n = s.path.rsplit('/').next().unwrap().parse().unwrap();
                *out.entry(n).or_default() += 1;
            }
        }
        out
    }
}

struct Request {
    method: String,
    path: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

async fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

type Answer = (u16, Vec<(String, String)>, Vec<u8>);

fn error(status: u16, code: &str, message: &str) -> Answer {
    let body = serde_json::json!({"error": code, "message": message});
    (status, vec![], body.to_string().into_bytes())
}

fn json(value: impl serde::Serialize) -> Answer {
    (200, vec![], serde_json::to_vec(&value).unwrap())
}

async fn serve(mut conn: TcpStream, state: Arc<Mutex<State>>) {
    let Some(req) = read_request(&mut conn).await else {
        return;
    };
    let (delay, part_delay, input_delay) = {
        let s = state.lock().unwrap();
        (s.commit_delay, s.part_delay, s.input_delay)
    };
    if req.path.ends_with("/commit") && !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if req.method == "PUT" && req.path.contains("/parts/") && !part_delay.is_zero() {
        tokio::time::sleep(part_delay).await;
    }
    let file = req.path.strip_prefix(commons_proto::INPUTS_PATH);
    if file.is_some_and(|f| f.matches('/').count() >= 3) {
        tokio::time::sleep(input_delay).await;
    }
    let (status, headers, body) = answer(&req, &mut state.lock().unwrap());
    state.lock().unwrap().seen.push(Seen {
        method: req.method.clone(),
        path: req.path.clone(),
        status,
    });
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(&body).await;
    let _ = conn.shutdown().await;
}

fn answer(req: &Request, s: &mut State) -> Answer {
    if let Some(rest) = req.path.strip_prefix("/store/") {
        return store(req, s, rest);
    }
    if req.headers.get("authorization").map(String::as_str) != Some(&format!("Bearer {CREDENTIAL}"))
    {
        return error(401, "unauthenticated", "node credential required");
    }
    if s.down {
        return error(503, "unavailable", "the store is down");
    }
    if let Some(rest) = req.path.strip_prefix(commons_proto::INPUTS_PATH) {
        return inputs(s, rest);
    }
    if req.path.starts_with(commons_proto::STAGING_PATH) {
        s.staging.push(serde_json::from_slice(&req.body).unwrap());
        return (204, vec![], vec![]);
    }
    let Some(rest) = req.path.strip_prefix(CHECKPOINTS_PATH) else {
        return error(404, "not_found", "no such path");
    };
    let seg: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match (req.method.as_str(), seg.as_slice()) {
        ("GET", [_job, "latest"]) => match &s.latest {
            None => error(404, "not_found", "checkpoint"),
            Some((archive, sha, attempt)) => (
                200,
                vec![
                    (SHA256_HEADER.into(), sha.clone()),
                    (CHECKPOINT_ATTEMPT_HEADER.into(), attempt.to_string()),
                ],
                archive.clone(),
            ),
        },
        ("GET", [job, attempt, "parts"]) => {
            let key = (job.parse().unwrap(), attempt.parse().unwrap());
            let parts: Vec<CheckpointPart> = s
                .staged
                .get(&key)
                .into_iter()
                .flatten()
                .map(|(n, d)| CheckpointPart {
                    n: *n,
                    bytes: d.len() as u64,
                    sha256: hex::encode(Sha256::digest(d)),
                })
                .collect();
            let (code, _, body) = json(parts);
            (
                code,
                vec![(PART_BYTES_HEADER.into(), s.part_bytes.to_string())],
                body,
            )
        }
        ("PUT", [job, attempt, "parts", n]) => {
            let n: u32 = n.parse().unwrap();
            if s.fail_parts_from.is_some_and(|from| n >= from) {
                return error(503, "unavailable", "try again");
            }
            if req.body.len() as u64 > s.part_bytes {
                return error(413, "too_large", "part too large");
            }
            let sha = hex::encode(Sha256::digest(&req.body));
            if req.headers.get(SHA256_HEADER) != Some(&sha) {
                return error(422, "invalid", "damaged part");
            }
            let key = (job.parse().unwrap(), attempt.parse().unwrap());
            s.staged.entry(key).or_default().insert(n, req.body.clone());
            json(CheckpointPart {
                n,
                bytes: req.body.len() as u64,
                sha256: sha,
            })
        }
        ("POST", [job, attempt, "commit"]) => commit(s, job, attempt, &req.body),
        _ => error(404, "not_found", "no such route"),
    }
}

/// `GET {INPUTS_PATH}/{job}/{attempt}[/{path}]`.
fn inputs(s: &mut State, rest: &str) -> Answer {
    let seg: Vec<&str> = rest.trim_start_matches('/').splitn(3, '/').collect();
    match seg.as_slice() {
        [_, _] => match &s.inputs_refused {
            Some(m) => error(422, "invalid", m),
            None => json(
                s.inputs
                    .iter()
                    .map(|(path, data, sha)| {
                        let mut f =
                            serde_json::json!({"path": path, "size": data.len(), "sha256": sha});
                        if let Some(valid) = s.signed_valid_s {
                            f["url"] = format!("/store/{path}?sig=granted").into();
                            f["url_valid_s"] = valid.into();
                        }
                        f
                    })
                    .collect::<Vec<_>>(),
            ),
        },
        [_, _, path] => {
            if let Some(n) = s.input_failures.get_mut(*path).filter(|n| **n > 0) {
                *n -= 1;
                return error(503, "unavailable", "the store is down");
            }
            match s.inputs.iter().find(|f| f.0 == *path) {
                Some((_, data, _)) => (200, vec![], data.clone()),
                None => error(404, "not_found", "file"),
            }
        }
        _ => error(404, "not_found", "no such route"),
    }
}

/// `GET /store/{path}?sig=...`: the double's object store, behind signed URLs only.
fn store(req: &Request, s: &mut State, rest: &str) -> Answer {
    if req.headers.contains_key("authorization") {
        s.store_saw_credential += 1;
    }
    if s.store_refusals > 0 {
        s.store_refusals -= 1;
        return (
            403,
            vec![],
            b"<Error><Code>AccessDenied</Code></Error>".to_vec(),
        );
    }
    let Some((path, "sig=granted")) = rest.split_once('?') else {
        return (
            403,
            vec![],
            b"<Error><Code>SignatureDoesNotMatch</Code></Error>".to_vec(),
        );
    };
    match s.inputs.iter().find(|f| f.0 == path) {
        Some((_, data, _)) => (200, vec![], data.clone()),
        None => (
            404,
            vec![],
            b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
        ),
    }
}

fn commit(s: &mut State, job: &str, attempt: &str, body: &[u8]) -> Answer {
    let key: (i64, i32) = (job.parse().unwrap(), attempt.parse().unwrap());
    let c: CheckpointCommit = serde_json::from_slice(body).unwrap();
    if s.before_write_ms && c.write_ms.is_some() {
        return error(
            400,
            "bad_request",
            "the body is not a commit {parts, bytes, sha256}: unknown field `write_ms`",
        );
    }
    if s.cap {
        return error(
            409,
            "checkpoint_cap",
            "lab vision's checkpoints would use 51.2 of 50 GB",
        );
    }
    let staged = s.staged.remove(&key).unwrap_or_default();
    if staged.is_empty() {
        // A commit sent again after its answer was lost.
        if let Some(i) = s.commits.iter().rposition(|k| {
            (k.job, k.attempt) == key && hex::encode(Sha256::digest(&k.archive)) == c.sha256
        }) {
            return json(CheckpointCommitted {
                id: i as i64 + 1,
                at: "2026-12-02T00:00:00Z".into(),
            });
        }
    }
    let mut archive = Vec::new();
    for n in 0..c.parts {
        match staged.get(&n) {
            Some(d) => archive.extend_from_slice(d),
            None => {
                s.staged.insert(key, staged);
                return error(422, "invalid", &format!("part {n} is missing"));
            }
        }
    }
    if archive.len() as u64 != c.bytes || hex::encode(Sha256::digest(&archive)) != c.sha256 {
        return error(422, "invalid", "the parts do not add up");
    }
    let sha = c.sha256.clone();
    s.latest = Some((archive.clone(), sha, key.1));
    s.commits.push(Committed {
        job: key.0,
        attempt: key.1,
        archive,
        write_ms: c.write_ms,
    });
    json(CheckpointCommitted {
        id: s.commits.len() as i64,
        at: "2026-12-02T00:00:00Z".into(),
    })
}

/// The files of a tar + zstd archive: path -> content (directories and links left out).
pub(crate) fn files_of(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let tar = zstd::decode_all(archive).unwrap();
    let mut ar = tar::Archive::new(&tar[..]);
    let mut out = BTreeMap::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.header().entry_type().is_file() {
            let path = e.path().unwrap().display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            out.insert(path, data);
        }
    }
    out
}
