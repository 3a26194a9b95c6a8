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

use crate::db::models::{AgentClock, Node};
use crate::db::node_link::{self, Beat, Claim};
use crate::db::{nodes, now};
use crate::error::{ApiError, AppError};
use crate::service::attempts::{self, Timing};
use crate::service::output::{self, Verdict};
use crate::service::samples::{self, Sampler};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_proto::{
    AgentMsg, EnrolRequest, EnrolResponse, PortalMsg, CONNECT_PATH, ENROL_PATH, PROTOCOL_VERSION,
};
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
        .map_err(ApiError::from)?
        .ok_or_else(|| {
            ApiError(AppError::Unauthenticated(
                "unknown or revoked node credential".into(),
            ))
        })?;
    let addr = remote_addr(&req);
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream = stream.max_frame_size(4 << 20);
    let span = tracing::info_span!("agent", node = node.id);
    actix_web::rt::spawn(tracing::Instrument::instrument(
        serve(state.into_inner(), node, addr, session, stream),
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
fn silence_s(state: &AppState) -> u64 {
    state.config.scheduler.heartbeat_s * 3 + 5
}

/// Ends the connection with `why` in its close frame (the agent logs it).
async fn refuse(session: actix_ws::Session, why: String) {
    let close = actix_ws::CloseReason {
        code: actix_ws::CloseCode::Policy,
        description: Some(why),
    };
    let _ = session.close(Some(close)).await;
}

async fn serve(
    state: std::sync::Arc<AppState>,
    node: Node,
    addr: String,
    mut session: actix_ws::Session,
    mut stream: actix_ws::MessageStream,
) {
    // In this replica's registry (for `Start`s and `Stop`s) only once its Hello is
    // accepted: a refused second agent must not displace the one that holds the node.
    let mut registered: Option<(u64, tokio::sync::mpsc::Receiver<PortalMsg>)> = None;
    tracing::info!(node = node.id, name = %node.name, %addr, "agent connected");
    let silence = Duration::from_secs(silence_s(&state));
    // The agent process's session, from its `Hello`: leases name it.
    let mut agent_session: Option<u64> = None;
    let opened = std::time::Instant::now();
    let mut rate = super::limits::Rate::new(opened);
    let mut log_rate = super::limits::Rate::logs(opened);
    let mut refusals = super::limits::Refusals::new(opened);
    let mut log_drops = super::limits::LogDrops::default();
    // This connection's view of the node's running attempts, for their utilisation.
    let sampler = std::sync::Arc::new(std::sync::Mutex::new(Sampler::new(
        state.config.utilization.sample_interval_s,
    )));
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
                    Ok(AgentMsg::Hello { protocol, .. }) if protocol != PROTOCOL_VERSION => {
                        let why = format!(
                            "this portal speaks agent protocol {PROTOCOL_VERSION}, the agent {protocol}: \
                             install the agent that matches the portal"
                        );
                        tracing::warn!(node = node.id, "agent refused: {why}");
                        refuse(session, why).await;
                        leave(&state, node.id, registered.as_ref().map(|r| r.0), agent_session).await;
                        return;
                    }
                    Ok(mut m) => {
                        let kind = m.kind();
                        state.metrics.message("in", kind);
                        let at = std::time::Instant::now();
                        // Output has a rate of its own; over it, a chunk is dropped (and
                        // said in the job's log later), never refused.
                        let verdict = match &m {
                            AgentMsg::Logs { job, attempt, chunk } if !log_rate.take(at) => {
                                state.metrics.agent_log_chunks_dropped.inc();
                                log_drops.add(*job, *attempt, chunk.len());
                                continue;
                            }
                            AgentMsg::Logs { .. } => super::limits::check(&m),
                            _ if rate.take(at) => super::limits::check(&m),
                            _ => Err("over the message rate".to_string()),
                        };
                        if let (Ok(()), AgentMsg::Logs { job, attempt, chunk }) = (&verdict, &mut m) {
                            if let Some(line) = log_drops.marker(*job, *attempt) {
                                chunk.insert_str(0, &line);
                            }
                        }
                        if let Err(why) = verdict {
                            if count_refusal(&state, node.id, &mut refusals, &why) {
                                break;
                            }
                            continue;
                        }
                        let hello = match &m {
                            AgentMsg::Hello { session, attempts, .. } => {
                                Some((*session, attempts.clone()))
                            }
                            _ => None,
                        };
                        let began = std::time::Instant::now();
                        let handled =
                            handle(&state, node.id, &addr, agent_session, &sampler, m).await;
                        let mut catch_up = None;
                        if let (Some((s, reports)), Ok(_)) = (&hello, &handled) {
                            // Accepted: this session holds the node now.
                            agent_session = Some(*s);
                            if registered.is_none() {
                                registered = Some(state.agents.register(node.id));
                                catch_up = Some((*s, reports.clone()));
                            }
                        }
                        state
                            .metrics
                            .agent_message_duration
                            .get_or_create(&crate::metrics::KindLabel { kind })
                            .observe(began.elapsed().as_secs_f64());
                        match handled {
                            Ok(mut replies) => {
                                if let Some((s, reports)) = catch_up {
                                    // Placed while it was not yet registered here: the
                                    // scheduler could not deliver those.
                                    let (id, timing) = (node.id, timing(&state));
                                    match state.db.run(move |c| {
                                        attempts::starts_after_registering(c, id, s, &reports, timing)
                                    }).await {
                                        Ok(more) => replies.extend(more),
                                        Err(e) => tracing::warn!(node = node.id, "starts after registering: {e:#}"),
                                    }
                                }
                                for r in replies {
                                    if send(&state, &mut session, &r).await.is_err() { break }
                                }
                            }
                            Err(AppError::Unauthenticated(why)) => {
                                tracing::warn!(node = node.id, "agent disconnected: {why}");
                                refuse(session, why).await;
                                leave(&state, node.id, registered.as_ref().map(|r| r.0), agent_session).await;
                                return;
                            }
                            Err(AppError::Conflict { message, .. }) if hello.is_some() => {
                                tracing::warn!(node = node.id, %addr, "agent refused: {message}");
                                state.metrics.agent_messages_refused.inc();
                                refuse(session, message).await;
                                leave(&state, node.id, registered.as_ref().map(|r| r.0), agent_session).await;
                                return;
                            }
                            Err(AppError::Forbidden(why)) => {
                                if count_refusal(&state, node.id, &mut refusals, &why) {
                                    break;
                                }
                            }
                            Err(e) => tracing::error!(node = node.id, "agent message failed: {e:#}"),
                        }
                    }
                    Err(e) => tracing::warn!(node = node.id, "unreadable agent message: {e}"),
                }
            }
            out = async {
                match registered.as_mut() {
                    Some((_, outbox)) => outbox.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(out) = out else { break };
                if send(&state, &mut session, &out).await.is_err() { break }
            }
        }
    }
    leave(
        &state,
        node.id,
        registered.as_ref().map(|r| r.0),
        agent_session,
    )
    .await;
    tracing::info!(node = node.id, "agent disconnected");
    let _ = session.close(None).await;
}

/// Counts a refused message; whether the connection is to be closed (refusals piled up
/// faster than they leak away).
fn count_refusal(
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
async fn leave(state: &AppState, node: i64, conn: Option<u64>, session: Option<u64>) {
    let (Some(conn), Some(session)) = (conn, session) else {
        return;
    };
    if state.agents.unregister(node, conn) {
        let _ = state
            .db
            .run(move |c| node_link::release(c, node, session))
            .await;
        state.wake.notify_one();
    }
}

async fn send(
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
        let renew = state
            .db
            .run(move |c| {
                let Some(clock) = nodes::node_by_id(c, node)?.agent_clock() else {
                    return Ok::<_, AppError>(None);
                };
                // What the agent's last heartbeat renewed (its reports are not at hand).
                let last = attempts::Renewable::RenewedUntil(clock.lease_until(ttl));
                attempts::renew(c, node, &clock, long, last).map(Some)
            })
            .await;
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

/// Applies one agent message; returns the replies to send.
async fn handle(
    state: &AppState,
    node: i64,
    addr: &str,
    session: Option<u64>,
    sampler: &std::sync::Arc<std::sync::Mutex<Sampler>>,
    msg: AgentMsg,
) -> Result<Vec<PortalMsg>, AppError> {
    let sampler = sampler.clone();
    let timing = timing(state);
    let heartbeat_s = state.config.scheduler.heartbeat_s;
    let lease_ttl_s = state.config.scheduler.lease_ttl_s;
    // When output arrived, for an attempt's last lines (see `service::output`); leases
    // count on the database's clock (`node_link`).
    let received_at = now();
    let metrics = state.metrics.clone();
    let silence = chrono::Duration::seconds(silence_s(state) as i64);
    let addr = addr.to_string();
    let (replies, wake) = state
        .db
        .run(move |c| -> Result<(Vec<PortalMsg>, bool), AppError> {
            let mut replies = Vec::new();
            let mut wake = false;
            match msg {
                AgentMsg::Hello {
                    agent_version,
                    session,
                    seq,
                    gpus,
                    attempts: reports,
                    capacity,
                    disk,
                    ..
                } => {
                    // Leases count from when this message arrived, on the database's
                    // clock (the agent counts from when it left, on its own).
                    let received_at = match node_link::claim(c, node, session, seq, &addr, silence)?
                    {
                        Claim::Taken { received_at } => received_at,
                        Claim::Held { by, seen } => {
                            return Err(AppError::conflict(
                                "credential_in_use",
                                format!(
                                    "another agent with this node's credential is connected \
                                     (from {by}, last heard {} UTC): two agents must not share \
                                     one credential (a cloned server or state dir?), so this one \
                                     is refused while the other runs; the node's page shows both",
                                    seen.map_or("-".to_string(), |t| t
                                        .format("%H:%M:%S")
                                        .to_string())
                                ),
                            ));
                        }
                        Claim::Revoked => {
                            return Err(AppError::Unauthenticated(
                                "the node's credential was revoked".into(),
                            ))
                        }
                    };
                    if let Some(cap) = &capacity {
                        nodes::set_capacity(c, node, cap)?;
                    }
                    if let Some(d) = &disk {
                        nodes::set_disk(c, node, d)?;
                    }
                    let clock = AgentClock {
                        session,
                        seq,
                        received_at,
                    };
                    nodes::upsert_gpus(c, node, &agent_version, &gpus)?;
                    crate::service::inventory::judge(c, node, &gpus)?;
                    replies.push(PortalMsg::Welcome {
                        node_id: node,
                        heartbeat_s,
                        lease_ttl_s,
                    });
                    for r in &reports {
                        let out = attempts::apply_report(c, node, r, timing)?;
                        replies.extend(out.stop);
                    }
                    attempts::reconcile_missing(c, node, &reports)?;
                    replies.extend(attempts::pending_stops(c, node, timing)?);
                    let jobs = attempts::reported_jobs(&reports);
                    let which = attempts::Renewable::Reported(&jobs);
                    replies.push(attempts::renew(c, node, &clock, lease_ttl_s, which)?);
                    replies.extend(attempts::undelivered_starts(
                        c, node, &reports, &clock, timing,
                    )?);
                    wake = true;
                }
                AgentMsg::Heartbeat {
                    seq,
                    gpu_stats,
                    attempts: reports,
                    capacity,
                    disk,
                } => {
                    let session = session
                        .ok_or_else(|| AppError::BadRequest("a heartbeat before Hello".into()))?;
                    // Revoked on any replica, or the node taken over by another agent
                    // session: refused here too, and nothing is renewed.
                    let received_at = match node_link::beat(c, node, session, seq)? {
                        Beat::Counted {
                            received_at,
                            contended,
                        } => {
                            if contended {
                                tracing::warn!(
                                    node,
                                    "two agents used this node's credential at once: the \
                                     node is flagged for its lab admin"
                                );
                            }
                            received_at
                        }
                        Beat::Superseded => {
                            return Err(AppError::Unauthenticated(
                                "another agent with this node's credential holds the node now"
                                    .into(),
                            ))
                        }
                        Beat::Revoked => {
                            return Err(AppError::Unauthenticated(
                                "the node's credential was revoked".into(),
                            ))
                        }
                    };
                    let clock = AgentClock {
                        session,
                        seq,
                        received_at,
                    };
                    if let Some(cap) = &capacity {
                        nodes::set_capacity(c, node, cap)?;
                    }
                    // Sent only when it changed: the scheduler looks again.
                    if let Some(d) = &disk {
                        nodes::set_disk(c, node, d)?;
                        wake = true;
                    }
                    wake |= nodes::update_gpu_stats(c, node, &gpu_stats)?;
                    let (stops, freed) =
                        crate::service::reports::apply_reports(c, node, &reports, timing)?;
                    wake |= freed;
                    replies.extend(stops);
                    let jobs = attempts::reported_jobs(&reports);
                    let which = attempts::Renewable::Reported(&jobs);
                    replies.push(attempts::renew(c, node, &clock, lease_ttl_s, which)?);
                    replies.extend(attempts::undelivered_starts(
                        c, node, &reports, &clock, timing,
                    )?);
                    // Last, and never in the way of the leases: a sample lost is a dot
                    // missing from a chart.
                    let mut sampler = sampler.lock().unwrap_or_else(|e| e.into_inner());
                    let at = received_at;
                    if let Err(e) = samples::record(c, &mut sampler, node, &gpu_stats, &reports, at)
                    {
                        tracing::warn!(node, "utilisation samples not written: {e:#}");
                    }
                }
                AgentMsg::AttemptEvent {
                    job,
                    attempt,
                    state: st,
                    exit_code,
                    stop,
                    reason,
                } => {
                    let r = commons_proto::AttemptReport {
                        job,
                        attempt,
                        state: st,
                        exit_code,
                        stop,
                        reason,
                    };
                    let out = attempts::apply_report(c, node, &r, timing)?;
                    wake |= out.freed;
                    replies.extend(out.stop);
                }
                AgentMsg::Logs {
                    job,
                    attempt,
                    chunk,
                } => match output::append(c, node, job, attempt, &chunk, received_at)? {
                    Verdict::Written => {}
                    Verdict::Over => {
                        metrics.agent_messages_refused.inc();
                        tracing::debug!(
                            node,
                            job,
                            attempt,
                            "output of an attempt that is over dropped"
                        );
                    }
                    Verdict::Foreign => {
                        return Err(AppError::Forbidden(format!(
                            "output for job {job} attempt {attempt}, which this node does not run"
                        )));
                    }
                },
            }
            Ok((replies, wake))
        })
        .await?;
    if wake {
        state.wake.notify_one();
    }
    Ok(replies)
}
