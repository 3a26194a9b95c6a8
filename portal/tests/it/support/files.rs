//! The files API from a test: a portal whose store is a fresh local directory (or moto's
//! S3), and uploads, downloads and listings as a client sends them.

use crate::support::harness::{Backend, TestPortal};
use futures_util::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::Path;

/// A portal whose object store is `dir` (its files go under `dir/files/`), with
/// `[files]` as `adjust` leaves it.
pub async fn portal_in(
    backend: Backend,
    dir: &Path,
    adjust: impl FnOnce(&mut commons_portal::config::FilesConfig) + 'static,
) -> TestPortal {
    let store = format!("file://{}", dir.display());
    TestPortal::builder(backend)
        .config(move |c| {
            c.checkpoints.store = Some(store);
            adjust(&mut c.files);
        })
        .start()
        .await
}

/// The API path of `path` in the space `base` (`/api/v1/files`, `/api/v1/labs/x/files`).
pub fn url(p: &TestPortal, base: &str, path: &str) -> String {
    format!("{}{base}/{}", p.url, commons_api::files::encode_path(path))
}

pub fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// What the portal answered: status and body (JSON, or its text).
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

async fn answer(r: reqwest::Response) -> Answer {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

/// PUT `data` (with its length) at `path`.
pub async fn put(p: &TestPortal, token: &str, base: &str, path: &str, data: &[u8]) -> Answer {
    let r = p
        .http
        .put(url(p, base, path))
        .bearer_auth(token)
        .body(data.to_vec())
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// PUT `data` as a stream of `chunk`-byte pieces without a length (chunked encoding), as
/// a client that does not know the size sends it.
pub async fn put_streamed(
    p: &TestPortal,
    token: &str,
    base: &str,
    path: &str,
    data: Vec<u8>,
    chunk: usize,
) -> Answer {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        data.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(pieces).boxed());
    let r = p
        .http
        .put(url(p, base, path))
        .bearer_auth(token)
        .body(body)
        .send()
        .await;
    match r {
        Ok(r) => answer(r).await,
        // The portal may answer and close while the body is still on its way.
        Err(e) => Answer {
            status: 0,
            body: Value::String(format!("{e:?}")),
        },
    }
}

/// GET `path` with an optional `Range`: status, headers and bytes.
pub async fn get(
    p: &TestPortal,
    token: &str,
    base: &str,
    path: &str,
    range: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut req = p.http.get(url(p, base, path)).bearer_auth(token);
    if let Some(r) = range {
        req = req.header("range", r);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.bytes().await.unwrap().to_vec())
}

/// The listing of `base` under `prefix`: status and body.
pub async fn list(p: &TestPortal, token: &str, base: &str, prefix: &str) -> Answer {
    let r = p
        .http
        .get(format!("{}{base}", p.url))
        .query(&[("prefix", prefix)])
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// The paths of a listing.
pub fn paths(listing: &Value) -> Vec<String> {
    listing
        .as_array()
        .unwrap_or_else(|| panic!("a listing is an array: {listing}"))
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect()
}

pub async fn delete(p: &TestPortal, token: &str, base: &str, path: &str) -> Answer {
    let r = p
        .http
        .delete(url(p, base, path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// Every file (not folder) under `dir`, relative to it, sorted.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn go(at: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(at) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                go(&path, root, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out.sort();
    out
}

/// `n` bytes that do not repeat in any short period.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
