//! The relay WebSocket an agent dials for one SSH channel (`commons_proto::relay`):
//! `GET /api/agent/v1/relay/{ticket}` with the node's credential. The ticket must be one
//! this replica issued for this node and nobody used; the socket is then joined to the
//! SSH channel waiting for it (`service::relays`).
//!
//! The socket is served on the actix worker that accepted it (its stream is not `Send`);
//! two bounded channels carry the frames to and from the gateway, so a slow SSH client
//! slows the agent down instead of filling memory.

use crate::error::{ApiError, AppError};
use crate::service::relays::{AgentEnd, FromAgent, ToAgent};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::relay::{RelayCtl, Stream, RELAY_CHUNK_BYTES, RELAY_PATH};
use futures_util::StreamExt;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(&format!("{RELAY_PATH}/{{ticket}}"), web::get().to(dial));
}

async fn dial(
    state: web::Data<AppState>,
    req: HttpRequest,
    ticket: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    tracing::debug!(step = "relay dial arrives", "SSH step");
    let node = super::checkpoints::node(&state, &req)
        .await
        .map_err(ApiError)?;
    let end = state
        .relays
        .claim(&ticket, node.id)
        .ok_or(ApiError(AppError::NotFound("relay ticket")))?;
    tracing::debug!(step = "relay dialled", "SSH step");
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream = stream.max_frame_size(RELAY_CHUNK_BYTES + 1024);
    actix_web::rt::spawn(pump(end, session, stream));
    Ok(response)
}

async fn pump(end: AgentEnd, mut session: actix_ws::Session, mut stream: actix_ws::MessageStream) {
    let AgentEnd {
        mut to_agent,
        from_agent,
    } = end;
    loop {
        tokio::select! {
            msg = stream.next() => {
                let out = match msg {
                    Some(Ok(actix_ws::Message::Binary(b))) => {
                        let Some(tag) = b.first().copied().and_then(Stream::from_byte) else {
                            tracing::warn!("relay frame without a stream tag; relay closed");
                            break;
                        };
                        FromAgent::Output(tag, b.slice(1..))
                    }
                    Some(Ok(actix_ws::Message::Text(t))) => match serde_json::from_str::<RelayCtl>(&t) {
                        Ok(c) => FromAgent::Ctl(c),
                        Err(e) => {
                            tracing::warn!("unreadable relay message: {e}");
                            continue;
                        }
                    },
                    Some(Ok(actix_ws::Message::Ping(b))) => {
                        if session.pong(&b).await.is_err() { break }
                        continue;
                    }
                    Some(Ok(actix_ws::Message::Close(_))) | None => break,
                    Some(Err(e)) => {
                        tracing::warn!("relay socket: {e}");
                        break;
                    }
                    Some(Ok(_)) => continue,
                };
                if from_agent.send(out).await.is_err() {
                    // The SSH channel is gone.
                    break;
                }
            }
            out = to_agent.recv() => {
                let sent = match out {
                    Some(ToAgent::Data(b)) => session.binary(b).await,
                    Some(ToAgent::Ctl(c)) => match serde_json::to_string(&c) {
                        Ok(t) => session.text(t).await,
                        Err(_) => continue,
                    },
                    None => break,
                };
                if sent.is_err() { break }
            }
        }
    }
    let _ = session.close(None).await;
}
