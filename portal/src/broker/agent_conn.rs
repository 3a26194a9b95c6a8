//! One agent's WebSocket, from its first frame to its last: frames are read one at a
//! time, judged against the connection's rates, handed to `service::agent_link`, and
//! answered in order; what the scheduler sends the node (once its `Hello` is accepted)
//! is written between them.

use super::agent::{count_refusal, leave, refuse, send, settings, silence_s};
use super::limits::{LogDrops, Rate, Refusals};
use crate::db::models::Node;
use crate::error::AppError;
use crate::service::agent_link::{self, Link, LinkSettings};
use crate::service::samples::Sampler;
use crate::state::AppState;
use commons_proto::{AgentMsg, PortalMsg, PROTOCOL_VERSION};
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the connection does after a frame.
enum Flow {
    Go,
    /// Close it quietly (the agent left, went silent, or was refused too often).
    End,
    /// Close it saying why (the agent logs the reason).
    Refuse(String),
}

/// One connection's state.
struct Conn {
    state: Arc<AppState>,
    node: i64,
    addr: String,
    set: LinkSettings,
    /// In this replica's registry (for `Start`s and `Stop`s) only once its Hello is
    /// accepted: a refused second agent must not displace the one that holds the node.
    registered: Option<(u64, tokio::sync::mpsc::Receiver<PortalMsg>)>,
    /// The agent process's session (from its `Hello`: leases name it), and this
    /// connection's view of the node's running attempts, for their utilisation.
    link: Link,
    rate: Rate,
    log_rate: Rate,
    refusals: Refusals,
    log_drops: LogDrops,
}

pub(super) async fn serve(
    state: Arc<AppState>,
    node: Node,
    addr: String,
    mut session: actix_ws::Session,
    mut stream: actix_ws::MessageStream,
) {
    tracing::info!(node = node.id, name = %node.name, %addr, "agent connected");
    let silence = Duration::from_secs(silence_s(&state));
    let mut conn = Conn::new(state, node.id, addr);
    let flow = loop {
        tokio::select! {
            msg = tokio::time::timeout(silence, stream.next()) => {
                let text = match msg {
                    Err(_) => {
                        tracing::warn!(node = node.id, "agent went silent");
                        break Flow::End;
                    }
                    Ok(None) | Ok(Some(Err(_))) => break Flow::End,
                    Ok(Some(Ok(actix_ws::Message::Text(t)))) => t,
                    Ok(Some(Ok(actix_ws::Message::Ping(b)))) => {
                        if session.pong(&b).await.is_err() {
                            break Flow::End;
                        }
                        continue;
                    }
                    Ok(Some(Ok(actix_ws::Message::Close(_)))) => break Flow::End,
                    Ok(Some(Ok(_))) => continue,
                };
                match conn.text(&mut session, &text).await {
                    Flow::Go => {}
                    end => break end,
                }
            }
            out = async {
                match conn.registered.as_mut() {
                    Some((_, outbox)) => outbox.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(out) = out else { break Flow::End };
                if send(&conn.state, &mut session, &out).await.is_err() {
                    break Flow::End;
                }
            }
        }
    };
    let registered = conn.registered.as_ref().map(|r| r.0);
    match flow {
        Flow::Refuse(why) => {
            refuse(session, why).await;
            leave(&conn.state, conn.node, registered, conn.link.session).await;
        }
        _ => {
            leave(&conn.state, conn.node, registered, conn.link.session).await;
            tracing::info!(node = conn.node, "agent disconnected");
            let _ = session.close(None).await;
        }
    }
}

impl Conn {
    fn new(state: Arc<AppState>, node: i64, addr: String) -> Conn {
        let opened = Instant::now();
        let sampler = Sampler::new(state.config.utilization.sample_interval_s);
        Conn {
            set: settings(&state),
            link: Link {
                node,
                addr: addr.clone(),
                session: None,
                sampler: Arc::new(Mutex::new(sampler)),
                gpus: Arc::default(),
            },
            state,
            node,
            addr,
            registered: None,
            rate: Rate::new(opened),
            log_rate: Rate::logs(opened),
            refusals: Refusals::new(opened),
            log_drops: LogDrops::default(),
        }
    }

    /// One text frame: decoded, judged, handled, answered.
    async fn text(&mut self, session: &mut actix_ws::Session, text: &str) -> Flow {
        let mut m = match serde_json::from_str::<AgentMsg>(text) {
            Ok(AgentMsg::Hello { protocol, .. }) if protocol != PROTOCOL_VERSION => {
                let why = format!(
                    "this portal speaks agent protocol {PROTOCOL_VERSION}, the agent \
                     {protocol}: install the agent that matches the portal"
                );
                tracing::warn!(node = self.node, "agent refused: {why}");
                return Flow::Refuse(why);
            }
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(node = self.node, "unreadable agent message: {e}");
                return Flow::Go;
            }
        };
        let kind = m.kind();
        self.state.metrics.message("in", kind);
        match self.admit(&mut m) {
            Ok(true) => {}
            Ok(false) => return Flow::Go,
            Err(why) => return self.refused(&why),
        }
        let began = Instant::now();
        let hello = match &m {
            AgentMsg::Hello {
                session, attempts, ..
            } => Some((*session, attempts.clone())),
            _ => None,
        };
        let handled = agent_link::apply(&self.state, self.set, &self.link, m).await;
        let mut catch_up = None;
        if let (Some((s, reports)), Ok(_)) = (&hello, &handled) {
            // Accepted: this session holds the node now.
            self.link.session = Some(*s);
            if self.registered.is_none() {
                self.registered = Some(self.state.agents.register(self.node));
                catch_up = Some((*s, reports.clone()));
            }
        }
        self.state
            .metrics
            .agent_message_duration
            .get_or_create(&crate::metrics::KindLabel { kind })
            .observe(began.elapsed().as_secs_f64());
        match handled {
            Ok(replies) => self.answer(session, replies, catch_up).await,
            Err(AppError::Unauthenticated(why)) => {
                tracing::warn!(node = self.node, "agent disconnected: {why}");
                Flow::Refuse(why)
            }
            Err(AppError::Conflict { message, .. }) if hello.is_some() => {
                tracing::warn!(node = self.node, addr = %self.addr, "agent refused: {message}");
                self.state.metrics.agent_messages_refused.inc();
                Flow::Refuse(message)
            }
            Err(AppError::Forbidden(why)) => self.refused(&why),
            Err(e) => {
                tracing::error!(node = self.node, "agent message failed: {e:#}");
                Flow::Go
            }
        }
    }

    /// Whether a message is within the connection's rates and limits: `Ok(false)` drops
    /// it quietly (output over its own rate is dropped, and said in the job's log later,
    /// never refused); `Err` refuses it.
    fn admit(&mut self, m: &mut AgentMsg) -> Result<bool, String> {
        let at = Instant::now();
        let verdict = match &*m {
            AgentMsg::Logs {
                job,
                attempt,
                chunk,
            } if !self.log_rate.take(at) => {
                self.state.metrics.agent_log_chunks_dropped.inc();
                self.log_drops.add(*job, *attempt, chunk.len());
                return Ok(false);
            }
            AgentMsg::Logs { .. } => super::limits::check(m),
            _ if self.rate.take(at) => super::limits::check(m),
            _ => Err("over the message rate".to_string()),
        };
        verdict?;
        if let AgentMsg::Logs {
            job,
            attempt,
            chunk,
        } = m
        {
            if let Some(line) = self.log_drops.marker(*job, *attempt) {
                chunk.insert_str(0, &line);
            }
        }
        Ok(true)
    }

    /// A refused message: counted, and the connection closed once refusals pile up.
    fn refused(&mut self, why: &str) -> Flow {
        if count_refusal(&self.state, self.node, &mut self.refusals, why) {
            Flow::End
        } else {
            Flow::Go
        }
    }

    /// Sends the replies, and after an accepted first `Hello` the `Start`s placed while
    /// the node was not yet registered here (the scheduler could not deliver those).
    async fn answer(
        &mut self,
        session: &mut actix_ws::Session,
        mut replies: Vec<PortalMsg>,
        catch_up: Option<(u64, Vec<commons_proto::AttemptReport>)>,
    ) -> Flow {
        if let Some((s, reports)) = catch_up {
            let more =
                agent_link::starts_after_registering(&self.state, self.set, self.node, s, reports)
                    .await;
            match more {
                Ok(more) => replies.extend(more),
                Err(e) => tracing::warn!(node = self.node, "starts after registering: {e:#}"),
            }
        }
        for r in replies {
            if send(&self.state, session, &r).await.is_err() {
                return Flow::End;
            }
        }
        Flow::Go
    }
}
