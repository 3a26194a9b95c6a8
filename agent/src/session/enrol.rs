//! Enrolment: the one-time exchange of a lab's enrolment token for this node's own
//! credential, kept in the state dir.
//!
//! A refusal (4xx: an unknown or used token, a bad hostname) ends the agent at once
//! with the portal's words. A portal that cannot answer yet (unreachable, restarting,
//! 5xx) is asked again with growing pauses, as the agent's connection is: an agent
//! started beside a portal that is still coming up, or one answering `database is
//! locked` for a moment, enrols when it can instead of exiting.

use crate::state::{self, NodeCredential};
use crate::AgentConfig;
use anyhow::Context;
use commons_proto::{EnrolRequest, EnrolResponse, ENROL_PATH};
use std::time::Duration;

/// The first pause after a failed try; each next one doubles, up to `max_pause`.
const FIRST_PAUSE: Duration = Duration::from_millis(500);

/// Why one try failed.
#[derive(Debug)]
enum Failure {
    /// The portal said no: asking again would get the same answer.
    Refused(anyhow::Error),
    /// The portal could not answer; a later try may succeed.
    Unavailable(anyhow::Error),
}

/// Enrols this node, asking again while the portal is unavailable, and saves the
/// credential.
pub(super) async fn enrol(
    config: &AgentConfig,
    max_pause: Duration,
) -> anyhow::Result<NodeCredential> {
    let token = config.enrol_token.clone().context(
        "this state dir holds no node credential: start with --enrol-token TOKEN (a lab admin creates one)",
    )?;
    let url = format!("{}{ENROL_PATH}", config.portal.trim_end_matches('/'));
    let request = EnrolRequest {
        token,
        hostname: config.hostname.clone(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
    };
    let client = reqwest::Client::new();
    let mut pause = FIRST_PAUSE;
    let r = loop {
        match try_once(&client, &url, &request).await {
            Ok(r) => break r,
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Unavailable(e)) => {
                tracing::warn!(
                    retry_in_ms = pause.as_millis() as u64,
                    "enrolment not answered: {e:#}"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(max_pause);
            }
        }
    };
    let cred = NodeCredential {
        node_id: r.node_id,
        node_name: r.node_name,
        lab: r.lab,
        credential: r.credential,
        agent_id: format!("{:016x}", rand::random::<u64>()),
    };
    state::save_credential(&config.state_dir, &cred)?;
    tracing::info!(node = cred.node_id, "enrolled");
    Ok(cred)
}

async fn try_once(
    client: &reqwest::Client,
    url: &str,
    request: &EnrolRequest,
) -> Result<EnrolResponse, Failure> {
    let resp = client
        .post(url)
        .json(request)
        .send()
        .await
        .with_context(|| format!("cannot reach the portal at {url}"))
        .map_err(Failure::Unavailable)?;
    let status = resp.status();
    if status.is_success() {
        return resp
            .json()
            .await
            .context("the portal's answer to the enrolment")
            .map_err(Failure::Unavailable);
    }
    let body = resp.text().await.unwrap_or_default();
    let msg = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(String::from))
        .unwrap_or(body);
    let e = anyhow::anyhow!("enrolment refused ({status}): {msg}");
    if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        Err(Failure::Unavailable(e))
    } else {
        Err(Failure::Refused(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A portal that answers each enrolment with the next of `answers` (status, body)
    /// and counts the requests it read.
    async fn portal(answers: Vec<(u16, String)>) -> (String, tokio::task::JoinHandle<usize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let mut n = 0;
            for (status, body) in answers {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then the body its Content-Length names.
                loop {
                    let k = s.read(&mut buf).await.unwrap();
                    req.extend_from_slice(&buf[..k]);
                    let text = String::from_utf8_lossy(&req).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        if req.len() >= end + 4 + len {
                            break;
                        }
                    }
                    assert!(k > 0, "the agent closed its request");
                }
                n += 1;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(reply.as_bytes()).await.unwrap();
                s.shutdown().await.unwrap();
            }
            n
        });
        (url, served)
    }

    fn config(portal: String, state_dir: &std::path::Path) -> AgentConfig {
        AgentConfig {
            enrol_token: Some("tok".into()),
            ..AgentConfig::new(&portal, state_dir)
        }
    }

    #[tokio::test]
    async fn a_portal_that_cannot_answer_yet_is_asked_again() {
        let ok = serde_json::json!({"node_id": 7, "node_name": "h", "lab": "vision",
                                    "credential": "c"})
        .to_string();
        let (url, served) = portal(vec![
            (
                500,
                r#"{"message":"internal error: database is locked"}"#.into(),
            ),
            (503, r#"{"message":"try again"}"#.into()),
            (201, ok),
        ])
        .await;
        let dir = tempfile::tempdir().unwrap();
        let cred = enrol(&config(url, dir.path()), Duration::from_millis(600))
            .await
            .unwrap();
        assert_eq!(cred.node_id, 7);
        assert_eq!(served.await.unwrap(), 3);
        let kept = state::load_credential(dir.path()).unwrap().unwrap();
        assert_eq!(kept.credential, "c");
    }

    #[tokio::test]
    async fn a_refusal_ends_the_agent_with_the_portals_words() {
        let (url, served) = portal(vec![(
            403,
            r#"{"message":"this enrolment token was used"}"#.into(),
        )])
        .await;
        let dir = tempfile::tempdir().unwrap();
        let e = enrol(&config(url, dir.path()), Duration::from_millis(600))
            .await
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("this enrolment token was used"),
            "{e:#}"
        );
        assert_eq!(served.await.unwrap(), 1);
        assert!(state::load_credential(dir.path()).unwrap().is_none());
    }
}
