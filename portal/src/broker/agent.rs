//! The agents' endpoints: one-time enrolment and the WebSocket they keep open.
//!
//! Per connection, messages are handled one at a time in arrival order, so an agent's
//! `AttemptEvent`s are applied in the order they happened.

use crate::db::models::Node;
use crate::db::{jobs, nodes};
use crate::error::{ApiError, AppError};
use crate::service::attempts;
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{AgentMsg, EnrolRequest, EnrolResponse, PortalMsg, CONNECT_PATH, ENROL_PATH};
use futures_util::StreamExt;
use std::time::Duration;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(ENROL_PATH, web::post().to(enrol))
        .route(CONNECT_PATH, web::get().to(connect));
}

async fn enrol(
    state: web::Data<AppState>,
    body: web::Json<EnrolRequest>,
) -> Result<HttpResponse, ApiError> {
    let req = body.into_inner();
    let (node, lab, credential) = state
        .db
        .run(move |c| nodes::enrol(c, &req.token, &req.hostname, &req.agent_version))
        .await?;
    tracing::info!(node = node.id, lab = %lab.slug, "node enrolled");
    Ok(HttpResponse::Created().json(EnrolResponse {
        node_id: node.id,
        node_name: node.name,
        lab: lab.slug,
        credential,
    }))
}

async fn connect(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let credential = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_string)
        .ok_or_else(|| ApiError(AppError::Unauthenticated("node credential required".into())))?;
    let node = state
        .db
        .run(move |c| nodes::node_by_credential(c, &credential))
        .await
        .map_err(ApiError)?
        .ok_or_else(|| {
            ApiError(AppError::Unauthenticated(
                "unknown or revoked node credential".into(),
            ))
        })?;
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream = stream.max_frame_size(4 << 20);
    actix_web::rt::spawn(serve(state.into_inner(), node, session, stream));
    Ok(response)
}

async fn serve(
    state: std::sync::Arc<AppState>,
    node: Node,
    mut session: actix_ws::Session,
    mut stream: actix_ws::MessageStream,
) {
    let (conn, mut outbox) = state.agents.register(node.id);
    tracing::info!(node = node.id, name = %node.name, "agent connected");
    let silence = Duration::from_secs(state.config.scheduler.heartbeat_s * 3 + 5);
    loop {
        tokio::select! {
            msg = tokio::time::timeout(silence, stream.next()) => {
                let text = match msg {
                    Err(_) => { tracing::warn!(node = node.id, "agent went silent"); break }
                    Ok(None) | Ok(Some(Err(_))) => break,
                    Ok(Some(Ok(actix_ws::Message::Text(t)))) => t,
                    Ok(Some(Ok(actix_ws::Message::Ping(b)))) => {
                        if session.pong(&b).await.is_err() { break }
                        continue;
                    }
                    Ok(Some(Ok(actix_ws::Message::Close(_)))) => break,
                    Ok(Some(Ok(_))) => continue,
                };
                match serde_json::from_str::<AgentMsg>(&text) {
                    Ok(m) => match handle(&state, node.id, m).await {
                        Ok(replies) => {
                            for r in replies {
                                if send(&mut session, &r).await.is_err() { break }
                            }
                        }
                        Err(e) => tracing::error!(node = node.id, "agent message failed: {e:#}"),
                    },
                    Err(e) => tracing::warn!(node = node.id, "unreadable agent message: {e}"),
                }
            }
            out = outbox.recv() => {
                let Some(out) = out else { break };
                if send(&mut session, &out).await.is_err() { break }
            }
        }
    }
    if state.agents.unregister(node.id, conn) {
        let id = node.id;
        let _ = state.db.run(move |c| nodes::set_online(c, id, false)).await;
        state.wake.notify_one();
    }
    tracing::info!(node = node.id, "agent disconnected");
    let _ = session.close(None).await;
}

async fn send(session: &mut actix_ws::Session, msg: &PortalMsg) -> Result<(), actix_ws::Closed> {
    match serde_json::to_string(msg) {
        Ok(text) => session.text(text).await,
        Err(e) => {
            // Plain data always serialises; should it not, drop the message, keep the link.
            tracing::error!("cannot encode a message for the agent: {e}");
            Ok(())
        }
    }
}

/// Applies one agent message; returns the replies to send.
async fn handle(state: &AppState, node: i64, msg: AgentMsg) -> Result<Vec<PortalMsg>, AppError> {
    let ttl = chrono::Duration::seconds(state.config.scheduler.lease_ttl_s as i64);
    let heartbeat_s = state.config.scheduler.heartbeat_s;
    let lease_ttl_s = state.config.scheduler.lease_ttl_s;
    let (replies, wake) = state
        .db
        .run(move |c| -> Result<(Vec<PortalMsg>, bool), AppError> {
            let mut replies = Vec::new();
            let mut wake = false;
            match msg {
                AgentMsg::Hello {
                    agent_version,
                    gpus,
                    attempts: reports,
                    ..
                } => {
                    nodes::upsert_gpus(c, node, &agent_version, &gpus)?;
                    replies.push(PortalMsg::Welcome {
                        node_id: node,
                        heartbeat_s,
                        lease_ttl_s,
                    });
                    for r in &reports {
                        let out = attempts::apply_report(c, node, r)?;
                        replies.extend(out.stop);
                    }
                    attempts::reconcile_missing(c, node, &reports)?;
                    replies.extend(attempts::pending_stops(c, node)?);
                    replies.push(attempts::renew(c, node, ttl)?);
                    wake = true;
                }
                AgentMsg::Heartbeat {
                    gpu_stats,
                    attempts: reports,
                } => {
                    wake |= nodes::update_gpu_stats(c, node, &gpu_stats)?;
                    for r in &reports {
                        let out = attempts::apply_report(c, node, r)?;
                        wake |= out.freed;
                        replies.extend(out.stop);
                    }
                    replies.push(attempts::renew(c, node, ttl)?);
                    replies.extend(attempts::undelivered_starts(c, node, &reports)?);
                }
                AgentMsg::AttemptEvent {
                    job,
                    attempt,
                    state: st,
                    exit_code,
                    reason,
                } => {
                    let r = commons_proto::AttemptReport {
                        job,
                        attempt,
                        state: st,
                        exit_code,
                        reason,
                    };
                    let out = attempts::apply_report(c, node, &r)?;
                    wake |= out.freed;
                    replies.extend(out.stop);
                }
                AgentMsg::Logs {
                    job,
                    attempt,
                    chunk,
                } => jobs::append_log(c, job, attempt, &chunk)?,
            }
            Ok((replies, wake))
        })
        .await?;
    if wake {
        state.wake.notify_one();
    }
    Ok(replies)
}
