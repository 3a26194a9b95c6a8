//! The portal's checkpoint API as the agent calls it (`commons_proto::CHECKPOINTS_PATH`
//! documents the calls): plain HTTP beside the WebSocket, every call with the node's
//! credential as a Bearer token.
//!
//! Each call is one request; retrying is the caller's ([`super::upload`]), guided by
//! [`ApiError::is_final`]: the portal's refusals (409 `checkpoint_cap`,
//! `checkpoint_attempt_cap`, `job_ended`, `checkpoint_superseded`; 404 for an attempt this
//! node no longer holds; 401/403) are final, while unreachable portals, 5xx (507: the
//! store is at its free-space floor), and damage on the way (422 for a part, a download
//! whose checksum does not match) are worth another try.
//!
//! Invariants: the credential never appears in `Debug` output or errors; a download is
//! streamed to a file and hashed on the way, and is only ever used once its size and
//! SHA-256 match what the portal announced.

use commons_proto::{
    checkpoint_commit_path, checkpoint_latest_path, checkpoint_part_path, checkpoint_parts_path,
    Attempt, CheckpointCommit, CheckpointCommitted, CheckpointPart, JobId,
    CHECKPOINT_ATTEMPT_HEADER, PART_BYTES_HEADER, SHA256_HEADER,
};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::Duration;
use thiserror::Error;
use tokio::io::AsyncWriteExt;

/// How patiently checkpoints travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The first pause after a failure; it doubles after each one, up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Downloads tried before a restore gives up (and the job starts fresh).
    pub restore_tries: u32,
    /// The upload after an attempt stopped gives up after failing this long without
    /// progress, and the attempt is reported anyway.
    pub give_up_after: Duration,
    /// Rounds a periodic snapshot is tried before it waits for the next interval.
    pub snapshot_tries: u32,
    /// The longest one request for a part, the parts list or a commit may take.
    pub request_timeout: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            restore_tries: 4,
            give_up_after: Duration::from_secs(10 * 60),
            snapshot_tries: 3,
            request_timeout: Duration::from_secs(5 * 60),
        }
    }
}

impl Policy {
    /// The pause after the `n`th failure in a row (from 1), with up to a quarter of jitter
    /// so that a campus of agents does not retry in step.
    pub fn backoff(&self, n: u32) -> Duration {
        let base = self
            .first_backoff
            .saturating_mul(1u32 << n.saturating_sub(1).min(16))
            .min(self.max_backoff);
        let quarter = u64::try_from(base.as_millis() / 4).unwrap_or(u64::MAX);
        base + Duration::from_millis(rand::random::<u64>() % quarter.max(1))
    }
}

#[derive(Debug, Error)]
pub enum ApiError {
    #[error("cannot reach the portal: {0}")]
    Transport(String),
    #[error("the portal answered {status}{}: {message}", code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Status {
        status: u16,
        code: Option<String>,
        message: String,
    },
    #[error("the download was damaged on the way: {0}")]
    Damaged(String),
    #[error("{0}")]
    Local(#[from] std::io::Error),
}

impl ApiError {
    /// Whether trying again cannot help.
    pub fn is_final(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Damaged(_) => false,
            // 413: the part size changed under us; 422: a part damaged on the way or
            // missing at commit. Both heal by listing the parts again.
            Self::Status { status, .. } => !matches!(status, 408 | 413 | 422 | 429 | 500..),
            Self::Local(_) => true,
        }
    }

    /// The portal's error code (`checkpoint_cap`, ...), if it gave one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub(crate) fn transport(e: reqwest::Error) -> ApiError {
    // The URL may be printed, never a header: the credential stays out of errors.
    ApiError::Transport(e.without_url().to_string())
}

/// A checkpoint downloaded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    pub bytes: u64,
    pub sha256: String,
    /// The attempt that stored it, as the portal says.
    pub attempt: Option<Attempt>,
}

/// The checkpoint API of one portal, with this node's credential.
#[derive(Clone)]
pub struct CheckpointClient {
    http: reqwest::Client,
    base: String,
    credential: String,
    policy: Policy,
}

impl std::fmt::Debug for CheckpointClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointClient")
            .field("base", &self.base)
            .field("credential", &"<hidden>")
            .field("policy", &self.policy)
            .finish()
    }
}

impl CheckpointClient {
    /// `portal` is the portal's base URL (`https://gpu.campus.edu`).
    pub fn new(portal: &str, credential: &str, policy: Policy) -> Result<Self, ApiError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // A download may take long, but never stall for long.
            .read_timeout(Duration::from_secs(60))
            .build()
            .map_err(transport)?;
        Ok(Self {
            http,
            base: portal.trim_end_matches('/').to_string(),
            credential: credential.to_string(),
            policy,
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A request to the portal with the node's credential (`outputs` calls through it too).
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.credential)
    }

    /// A GET of a signed object URL (absolute, or relative to the portal) with nothing of
    /// ours: no credential goes with it, wherever it points (`crate::signed`).
    pub(crate) fn signed_get(&self, url: &str) -> Result<reqwest::RequestBuilder, ApiError> {
        let base = reqwest::Url::parse(&self.base)
            .map_err(|e| ApiError::Transport(format!("the portal's address: {e}")))?;
        let full = base.join(url).map_err(|e| {
            ApiError::Transport(format!(
                "a signed URL ({}) does not parse: {e}",
                crate::signed::redacted(url)
            ))
        })?;
        Ok(self.http.get(full))
    }

    /// Downloads the job's latest checkpoint into `to` (replacing it); `None` when the
    /// portal has none (404).
    pub async fn latest(&self, job: JobId, to: &Path) -> Result<Option<Download>, ApiError> {
        let resp = self
            .request(reqwest::Method::GET, &checkpoint_latest_path(job))
            .send()
            .await
            .map_err(transport)?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let mut resp = ok(resp).await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let want = header(SHA256_HEADER)
            .map(|s| s.trim().to_ascii_lowercase())
            .ok_or_else(|| ApiError::Damaged(format!("no {SHA256_HEADER} header")))?;
        let attempt = header(CHECKPOINT_ATTEMPT_HEADER).and_then(|a| a.parse().ok());
        let announced = resp.content_length();
        let mut file = tokio::fs::File::create(to).await?;
        let mut sha = Sha256::new();
        let mut bytes = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            sha.update(&chunk);
            bytes += chunk.len() as u64;
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        let got = hex::encode(sha.finalize());
        if announced.is_some_and(|n| n != bytes) {
            return Err(ApiError::Damaged(format!(
                "{bytes} bytes arrived of {}",
                announced.unwrap_or_default()
            )));
        }
        if got != want {
            return Err(ApiError::Damaged(format!(
                "its SHA-256 is {got}, the portal said {want}"
            )));
        }
        Ok(Some(Download {
            bytes,
            sha256: got,
            attempt,
        }))
    }

    /// The parts of the attempt's next checkpoint already uploaded, and the largest part
    /// the portal takes.
    pub async fn parts(
        &self,
        job: JobId,
        attempt: Attempt,
    ) -> Result<(Vec<CheckpointPart>, u64), ApiError> {
        let resp = self
            .request(reqwest::Method::GET, &checkpoint_parts_path(job, attempt))
            .timeout(self.policy.request_timeout)
            .send()
            .await
            .map_err(transport)?;
        let resp = ok(resp).await?;
        let part_bytes = resp
            .headers()
            .get(PART_BYTES_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| ApiError::Status {
                status: 502,
                code: None,
                message: format!("the parts list has no valid {PART_BYTES_HEADER} header"),
            })?;
        let parts = resp.json().await.map_err(transport)?;
        Ok((parts, part_bytes))
    }

    /// Uploads part `n`, whose SHA-256 is `sha256`.
    pub async fn put_part(
        &self,
        job: JobId,
        attempt: Attempt,
        n: u32,
        data: Vec<u8>,
        sha256: &str,
    ) -> Result<(), ApiError> {
        let resp = self
            .request(reqwest::Method::PUT, &checkpoint_part_path(job, attempt, n))
            .timeout(self.policy.request_timeout)
            .header(SHA256_HEADER, sha256)
            .body(data)
            .send()
            .await
            .map_err(transport)?;
        ok(resp).await.map(drop)
    }

    /// Commits the parts uploaded so far as one checkpoint.
    pub async fn commit(
        &self,
        job: JobId,
        attempt: Attempt,
        commit: &CheckpointCommit,
    ) -> Result<CheckpointCommitted, ApiError> {
        match self.commit_once(job, attempt, commit).await {
            // A portal that predates `write_ms` refuses unknown fields (400): the same
            // commit without it.
            Err(e) if e.status() == Some(400) && commit.write_ms.is_some() => {
                let plain = CheckpointCommit {
                    write_ms: None,
                    ..commit.clone()
                };
                self.commit_once(job, attempt, &plain).await
            }
            done => done,
        }
    }

    async fn commit_once(
        &self,
        job: JobId,
        attempt: Attempt,
        commit: &CheckpointCommit,
    ) -> Result<CheckpointCommitted, ApiError> {
        let resp = self
            .request(reqwest::Method::POST, &checkpoint_commit_path(job, attempt))
            .timeout(self.policy.request_timeout)
            .json(commit)
            .send()
            .await
            .map_err(transport)?;
        ok(resp).await?.json().await.map_err(transport)
    }
}

/// The response if it is a success, else the portal's error (`{error, message}`).
pub(crate) async fn ok(resp: reqwest::Response) -> Result<reqwest::Response, ApiError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    let json = serde_json::from_str::<serde_json::Value>(&body).ok();
    let field = |k: &str| {
        json.as_ref()
            .and_then(|v| v[k].as_str())
            .map(str::to_string)
    };
    let mut message = field("message").unwrap_or(body);
    message.truncate(1000);
    Err(ApiError::Status {
        status: status.as_u16(),
        code: field("error"),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_final_and_damage_is_not() {
        let status = |status: u16, code: Option<&str>| ApiError::Status {
            status,
            code: code.map(str::to_string),
            message: "m".into(),
        };
        assert!(status(409, Some("checkpoint_cap")).is_final());
        assert!(status(409, Some("checkpoint_attempt_cap")).is_final());
        assert!(!status(507, Some("insufficient_storage")).is_final());
        assert!(status(404, None).is_final());
        assert!(status(401, None).is_final());
        assert!(!status(422, None).is_final());
        assert!(!status(503, None).is_final());
        assert!(!ApiError::Transport("reset".into()).is_final());
        assert!(!ApiError::Damaged("sha".into()).is_final());
        assert_eq!(
            status(409, Some("checkpoint_cap")).to_string(),
            "the portal answered 409 (checkpoint_cap): m"
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = Policy {
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            ..Policy::default()
        };
        let within = |n, lo: u64| {
            let d = p.backoff(n);
            assert!(
                d >= Duration::from_millis(lo) && d < Duration::from_millis(lo + lo / 4 + 1),
                "{n}: {d:?}"
            );
        };
        within(1, 100);
        within(2, 200);
        within(3, 350);
        within(40, 350);
    }

    #[test]
    fn debug_hides_the_credential() {
        let c = CheckpointClient::new("http://p/", "secret-cred", Policy::default()).unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("secret-cred") && shown.contains("http://p\""),
            "{shown}"
        );
    }
}
