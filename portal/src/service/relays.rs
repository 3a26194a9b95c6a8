//! SSH relays on the portal's side: the tickets this replica issued and the pipes that
//! join an SSH channel (the gateway's end) to the relay WebSocket an agent dials (the
//! broker's end). See `commons_proto::relay` for the protocol.
//!
//! A ticket is 32 random bytes, good for one dial by the node it was issued for, within
//! [`RELAY_DIAL_TIMEOUT_S`]; it lives in this replica's memory only, which is why the
//! agent is told to dial this replica (`[ssh] relay_url`).

use super::agents::{deliver, DeliverError};
use super::Ctx;
use bytes::Bytes;
use commons_proto::relay::{RelayCtl, RelayTarget, Stream, RELAY_DIAL_TIMEOUT_S};
use commons_proto::{Attempt, JobId, PortalMsg, RelayOpen};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How many frames wait in each direction before the sender waits (back-pressure).
const DEPTH: usize = 64;

/// Portal -> agent.
#[derive(Debug)]
pub enum ToAgent {
    Data(Bytes),
    Ctl(RelayCtl),
}

/// Agent -> portal.
#[derive(Debug)]
pub enum FromAgent {
    Output(Stream, Bytes),
    Ctl(RelayCtl),
}

/// The gateway's end of an open relay. Dropping `to_agent` ends the relay.
pub struct Pipe {
    pub to_agent: mpsc::Sender<ToAgent>,
    pub from_agent: mpsc::Receiver<FromAgent>,
}

/// The broker's end, handed over when the agent dials.
pub struct AgentEnd {
    pub to_agent: mpsc::Receiver<ToAgent>,
    pub from_agent: mpsc::Sender<FromAgent>,
}

struct Pending {
    node: i64,
    end: AgentEnd,
    dialled: oneshot::Sender<()>,
}

/// The tickets this replica issued and nobody dialled yet.
#[derive(Clone, Default)]
pub struct Hub {
    pending: Arc<Mutex<HashMap<String, Pending>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the job's server is not connected to the portal right now; try again in a minute")]
    Offline,
    #[error(
        "the job's server did not answer in {0} s (its agent may be too old to relay SSH, or busy)"
    )]
    NoAnswer(u64),
    #[error(transparent)]
    App(#[from] crate::error::AppError),
}

impl Hub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The broker's end of `ticket`, when `node` may dial it (once).
    pub fn claim(&self, ticket: &str, node: i64) -> Option<AgentEnd> {
        let mut pending = self.lock();
        match pending.get(ticket) {
            Some(p) if p.node == node => {}
            _ => return None,
        }
        let p = pending.remove(ticket)?;
        let _ = p.dialled.send(());
        Some(p.end)
    }

    /// Tickets waiting for a dial (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.lock().len()
    }
}

/// Asks `node`'s agent to dial a relay to `target` in attempt `(job, attempt)` and waits
/// until it has. `relay_url` is this replica's address for agents (none: the portal's).
pub async fn open(
    ctx: &Ctx,
    node: i64,
    job: JobId,
    attempt: Attempt,
    relay_url: Option<String>,
    target: RelayTarget,
) -> Result<Pipe, RelayError> {
    let ticket = hex::encode(rand::random::<[u8; 32]>());
    let (to_tx, to_rx) = mpsc::channel(DEPTH);
    let (from_tx, from_rx) = mpsc::channel(DEPTH);
    let (dialled_tx, dialled_rx) = oneshot::channel();
    ctx.relays.lock().insert(
        ticket.clone(),
        Pending {
            node,
            end: AgentEnd {
                to_agent: to_rx,
                from_agent: from_tx,
            },
            dialled: dialled_tx,
        },
    );
    let msg = PortalMsg::OpenRelay(RelayOpen {
        ticket: ticket.clone(),
        job,
        attempt,
        relay_url,
        target,
    });
    let sent = deliver(ctx, node, msg).await;
    tracing::debug!(step = "OpenRelay sent", "SSH step");
    let outcome = match sent {
        Err(DeliverError::NotConnected) => Err(RelayError::Offline),
        Err(DeliverError::App(e)) => Err(RelayError::App(e)),
        Ok(()) => {
            match tokio::time::timeout(Duration::from_secs(RELAY_DIAL_TIMEOUT_S), dialled_rx).await
            {
                Ok(Ok(())) => Ok(Pipe {
                    to_agent: to_tx,
                    from_agent: from_rx,
                }),
                _ => Err(RelayError::NoAnswer(RELAY_DIAL_TIMEOUT_S)),
            }
        }
    };
    if outcome.is_err() {
        ctx.relays.lock().remove(&ticket);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_good_for_its_node_once() {
        let hub = Hub::default();
        let (to_tx, to_rx) = mpsc::channel(1);
        let (from_tx, _from_rx) = mpsc::channel(1);
        let (d_tx, mut d_rx) = oneshot::channel();
        hub.lock().insert(
            "t".into(),
            Pending {
                node: 7,
                end: AgentEnd {
                    to_agent: to_rx,
                    from_agent: from_tx,
                },
                dialled: d_tx,
            },
        );
        assert!(hub.claim("t", 8).is_none(), "another node's dial");
        assert_eq!(hub.waiting(), 1, "a wrong node does not use the ticket up");
        assert!(hub.claim("x", 7).is_none());
        assert!(hub.claim("t", 7).is_some());
        assert!(d_rx.try_recv().is_ok(), "the gateway learns of the dial");
        assert!(hub.claim("t", 7).is_none(), "once");
        drop(to_tx);
    }
}
