//! The agents' endpoints: one-time enrolment and the WebSocket they keep open.
//!
//! Per connection, messages are handled one at a time in arrival order, so an agent's
//! `AttemptEvent`s are applied in the order they happened.
//!
//! One agent at a time holds a node's credential, decided in the database
//! (`db::node_link`): a `Hello` from another agent process while the holder lives is
//! refused (the connection is closed with the reason, and the node flagged once both
//! are seen alive), so two agents with one credential (a cloned VM or state dir) never
//! both get `Start`s; a connection joins this replica's registry only once its `Hello`
//! is accepted, and a heartbeat counts only from the session that holds the node. The
//! times leases count from are the database's (`db::clock`).

use crate::error::{ApiError, AppError};
use crate::service::agent_link::{self, LinkSettings};
use crate::service::attempts::Timing;
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{EnrolRequest, EnrolResponse, PortalMsg, CONNECT_PATH, ENROL_PATH};
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
    let (node, lab, credential) =
        agent_link::enrol(&state, req.token, req.hostname, req.agent_version).await?;
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
    let node = agent_link::node_for_credential(&state, credential)
        .await
        .map_err(ApiError)?;
    let addr = remote_addr(&req);
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream = stream.max_frame_size(4 << 20);
    let span = tracing::info_span!("agent", node = node.id);
    actix_web::rt::spawn(tracing::Instrument::instrument(
        super::agent_conn::serve(state.into_inner(), node, addr, session, stream),
        span,
    ));
    Ok(response)
}

/// Where an agent connects from, for people: the TCP peer, and the address a proxy says
/// it forwards for (a header anyone can write, so shown as such, never trusted).
fn remote_addr(req: &HttpRequest) -> String {
    let peer = req
        .peer_addr()
        .map_or_else(|| "unknown".to_string(), |a| a.to_string());
    let forwarded = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|h| h.to_str().ok())
        .map(|h| h.chars().take(100).collect::<String>());
    match forwarded {
        Some(f) => format!("{peer} (forwarded for {f})"),
        None => peer,
    }
}

/// How long an agent may be silent before it counts as gone.
pub(super) fn silence_s(state: &AppState) -> u64 {
    state.config.scheduler.heartbeat_s * 3 + 5
}

/// Ends the connection with `why` in its close frame (the agent logs it).
pub(super) async fn refuse(session: actix_ws::Session, why: String) {
    let close = actix_ws::CloseReason {
        code: actix_ws::CloseCode::Policy,
        description: Some(why),
    };
    let _ = session.close(Some(close)).await;
}

/// Counts a refused message; whether the connection is to be closed (refusals piled up
/// faster than they leak away).
pub(super) fn count_refusal(
    state: &AppState,
    node: i64,
    refusals: &mut super::limits::Refusals,
    why: &str,
) -> bool {
    state.metrics.agent_messages_refused.inc();
    let close = refusals.add(std::time::Instant::now());
    let refused = refusals.total;
    if refused.is_power_of_two() {
        tracing::warn!(node, refused, "agent message refused: {why}");
    }
    if close {
        tracing::warn!(node, refused, "too many refused messages: disconnected");
    }
    close
}

/// The connection `conn` (registered once its Hello was accepted) of agent session
/// `session` ends: it leaves the registry, and the node goes offline unless a newer
/// connection (on this replica, or of another session anywhere) holds it.
pub(super) async fn leave(state: &AppState, node: i64, conn: Option<u64>, session: Option<u64>) {
    let (Some(conn), Some(session)) = (conn, session) else {
        return;
    };
    if state.agents.unregister(node, conn) {
        if let Err(e) = agent_link::release(state, node, session).await {
            tracing::warn!(node, "cannot release the node: {e:#}");
        }
        state.wake.notify_one();
    }
}

pub(super) async fn send(
    state: &AppState,
    session: &mut actix_ws::Session,
    msg: &PortalMsg,
) -> Result<(), actix_ws::Closed> {
    state.metrics.message("out", msg.kind());
    match serde_json::to_string(msg) {
        Ok(text) => session.text(text).await,
        Err(e) => {
            // Plain data always serialises; should it not, drop the message, keep the link.
            tracing::error!("cannot encode a message for the agent: {e}");
            Ok(())
        }
    }
}

/// Extends, by `shutdown_lease_s`, the leases of every attempt on the servers connected
/// to this replica, and tells them; returns how many servers were told. Messages are
/// queued to each connection and given a moment to leave before the server stops.
pub async fn extend_leases_for_shutdown(state: &AppState) -> usize {
    let long = state.config.scheduler.shutdown_lease_s;
    let ttl = state.config.scheduler.lease_ttl_s;
    let mut told = 0;
    for node in state.agents.connected() {
        let renew = agent_link::extend_for_shutdown(state, node, ttl, long).await;
        match renew {
            Ok(Some(msg)) => told += usize::from(state.agents.send(node, msg)),
            Ok(None) => {}
            Err(e) => tracing::error!(node, "cannot extend leases for the shutdown: {e:#}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    told
}

/// The lease and grace settings of this portal.
pub fn timing(state: &AppState) -> Timing {
    Timing {
        lease_ttl_s: state.config.scheduler.lease_ttl_s,
        default_grace_s: state.config.policy.default_grace_s,
        default_disk_gb: state.config.policy.default_disk_gb,
    }
}

/// The settings agents' messages are judged by on this portal.
pub(super) fn settings(state: &AppState) -> LinkSettings {
    LinkSettings {
        timing: timing(state),
        heartbeat_s: state.config.scheduler.heartbeat_s,
        silence_s: silence_s(state),
    }
}
