//! The portal's REST API over HTTP (blocking reqwest): bearer token, JSON in and out, and
//! each failure turned into one [`CliError`] a person can act on.

use crate::config::{self, Credentials};
use crate::error::{CliError, Result};
use reqwest::blocking::{RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// The longest one upload or download may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

pub struct Client {
    http: reqwest::blocking::Client,
    pub url: String,
    token: Option<String>,
}

pub use commons_api::ErrorBody;

impl Client {
    pub fn new(url: &str, token: Option<String>) -> Result<Client> {
        let http = reqwest::blocking::Client::builder()
            .user_agent(concat!("commons/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| CliError::Other(anyhow::anyhow!("cannot set up HTTP: {e}")))?;
        Ok(Client {
            http,
            url: config::normalise_url(url)?,
            token,
        })
    }

    /// A client with the stored (or the environment's) credential.
    pub fn signed_in() -> Result<Client> {
        let Credentials { url, token, .. } = config::load()?;
        Client::new(&url, Some(token))
    }

    fn request(&self, method: reqwest::Method, path: &str) -> RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends, and turns transport errors and 4xx/5xx answers into [`CliError`]s.
    pub fn send(&self, req: RequestBuilder) -> Result<Response> {
        let resp = req.send().map_err(|e| self.unreachable(&e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().unwrap_or_default();
        let body: ErrorBody = serde_json::from_str(&text).unwrap_or_default();
        Err(self.refusal(status.as_u16(), body, status.canonical_reason()))
    }

    fn refusal(&self, status: u16, body: ErrorBody, reason: Option<&str>) -> CliError {
        let message = if body.message.is_empty() {
            format!(
                "the portal answered {status} {}",
                reason.unwrap_or_default()
            )
            .trim_end()
            .to_string()
        } else {
            body.message
        };
        match (status, body.field) {
            (401, _) => CliError::TokenRefused {
                url: self.url.clone(),
                message,
            },
            (403, _) => CliError::Forbidden(message),
            (422, Some(field)) => CliError::Invalid { field, message },
            _ => CliError::Api {
                status,
                code: body.error,
                message,
            },
        }
    }

    pub fn unreachable(&self, e: &reqwest::Error) -> CliError {
        let why = if e.is_timeout() {
            "no answer in time".to_string()
        } else {
            // The innermost cause says it best ("Connection refused (os error 111)").
            let mut cause: &dyn std::error::Error = e;
            while let Some(next) = cause.source() {
                cause = next;
            }
            cause.to_string()
        };
        CliError::Unreachable {
            url: self.url.clone(),
            why,
        }
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.send(self.request(reqwest::Method::GET, path))?;
        self.json(resp)
    }

    pub fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let resp = self.send(self.request(reqwest::Method::POST, path).json(body))?;
        self.json(resp)
    }

    /// A POST that may take long (joining an upload's parts): no time limit but the
    /// connection's.
    pub fn post_long<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let req = self
            .request(reqwest::Method::POST, path)
            .timeout(TRANSFER_TIMEOUT)
            .json(body);
        let resp = self.send(req)?;
        self.json(resp)
    }

    /// A POST whose answer may be a refusal the caller handles itself (the device grant's
    /// `authorization_pending`): the status and the body, whatever they are.
    pub fn post_raw(&self, path: &str, body: &impl Serialize) -> Result<(u16, String)> {
        let resp = self
            .request(reqwest::Method::POST, path)
            .json(body)
            .send()
            .map_err(|e| self.unreachable(&e))?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().map_err(|e| self.unreachable(&e))?))
    }

    /// Turns a refusal read by [`Client::post_raw`] into its error.
    pub fn error_from(&self, status: u16, text: &str) -> CliError {
        let body: ErrorBody = serde_json::from_str(text).unwrap_or_default();
        self.refusal(status, body, None)
    }

    /// An upload: `body` as the request's, with no time limit but the connection's (a
    /// transfer takes as long as it takes). The answer, refusals turned into errors.
    pub fn put_body(&self, path: &str, body: reqwest::blocking::Body) -> Result<Response> {
        let req = self
            .request(reqwest::Method::PUT, path)
            .timeout(TRANSFER_TIMEOUT)
            .header("content-type", "application/octet-stream")
            .body(body);
        self.send(req)
    }

    /// A download: the answer, to be read as it streams in.
    pub fn get_body(&self, path: &str) -> Result<Response> {
        self.send(
            self.request(reqwest::Method::GET, path)
                .timeout(TRANSFER_TIMEOUT),
        )
    }

    pub fn delete(&self, path: &str) -> Result<()> {
        self.send(self.request(reqwest::Method::DELETE, path))?;
        Ok(())
    }

    /// Text from `path`, and the `x-log-bytes` header when there is one.
    pub fn text(&self, path: &str) -> Result<(String, Option<usize>)> {
        let resp = self.send(self.request(reqwest::Method::GET, path))?;
        let total = resp
            .headers()
            .get("x-log-bytes")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let text = resp.text().map_err(|e| self.unreachable(&e))?;
        Ok((text, total))
    }

    fn json<T: DeserializeOwned>(&self, resp: Response) -> Result<T> {
        let text = resp.text().map_err(|e| self.unreachable(&e))?;
        serde_json::from_str(&text).map_err(|e| self.not_understood(e))
    }

    /// An answer already read as JSON (to print it as it came with `--json`), as `T`.
    pub fn parse<T: DeserializeOwned>(&self, v: serde_json::Value) -> Result<T> {
        serde_json::from_value(v).map_err(|e| self.not_understood(e))
    }

    fn not_understood(&self, e: serde_json::Error) -> CliError {
        CliError::Other(anyhow::anyhow!(
            "the portal's answer is not what this commons understands ({e}); is {} a GPU Commons portal of a matching version?",
            self.url
        ))
    }
}
