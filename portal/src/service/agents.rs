//! The agents this portal replica holds a WebSocket to: a sender per connected node.
//! A node has at most one live connection: a newer one replaces the older, whose loop
//! then ends. Use cases queue messages here (a `Stop` after a cancel); the broker owns
//! the sockets.

use commons_proto::PortalMsg;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

type Conn = (u64, mpsc::Sender<PortalMsg>);

/// Messages waiting for one agent at most; past it new ones are dropped (and the lease and
/// the next `Hello` settle what they said), so a stuck agent cannot fill the portal's memory.
pub const OUTBOX: usize = 4096;

#[derive(Clone, Default)]
pub struct Registry {
    conns: Arc<Mutex<HashMap<i64, Conn>>>,
    next: Arc<AtomicU64>,
}

impl Registry {
    /// The map; a panic elsewhere while holding the lock left it consistent (every
    /// operation is one map call), so a poisoned lock is used as it is.
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Conn>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection of `node`; returns its id and the messages to send it.
    pub fn register(&self, node: i64) -> (u64, mpsc::Receiver<PortalMsg>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(OUTBOX);
        self.conns().insert(node, (id, tx));
        (id, rx)
    }

    /// Forgets a connection; returns false if a newer one of the node replaced it already.
    pub fn unregister(&self, node: i64, id: u64) -> bool {
        let mut conns = self.conns();
        match conns.get(&node) {
            Some((current, _)) if *current == id => {
                conns.remove(&node);
                true
            }
            _ => false,
        }
    }

    /// Queues a message for a node; false if it is not connected (or its queue is full).
    pub fn send(&self, node: i64, msg: PortalMsg) -> bool {
        match self.conns().get(&node) {
            Some((_, tx)) => match tx.try_send(msg) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(node, "the agent's outbox is full; message dropped");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
            None => false,
        }
    }

    /// The nodes connected to this replica.
    pub fn connected(&self) -> Vec<i64> {
        let mut v: Vec<i64> = self.conns().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Closes this replica's connection of `node`, if it holds one (its credential was
    /// revoked): the connection's loop ends when its outbox closes.
    pub fn disconnect(&self, node: i64) {
        self.conns().remove(&node);
    }

    pub fn is_connected(&self, node: i64) -> bool {
        self.conns().contains_key(&node)
    }
}

/// Why a message could not be passed to an agent.
#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    #[error("the server's agent is not connected")]
    NotConnected,
    #[error(transparent)]
    App(#[from] crate::error::AppError),
}

/// Passes `msg` to `node`'s agent: straight down its WebSocket when this replica holds
/// it, else (PostgreSQL, several replicas) through the mailbox for the replica that does,
/// which polls it every [`MAIL_POLL`]. With SQLite there is one replica: not connected
/// here means not connected.
pub async fn deliver(ctx: &super::Ctx, node: i64, msg: PortalMsg) -> Result<(), DeliverError> {
    if ctx.agents.send(node, msg.clone()) {
        return Ok(());
    }
    if ctx.db.backend != crate::db::Backend::Postgres {
        return Err(DeliverError::NotConnected);
    }
    let body =
        serde_json::to_string(&msg).map_err(|e| crate::error::AppError::Internal(e.into()))?;
    let online = ctx
        .db
        .run(move |c| {
            let online = crate::db::nodes::online_node(c, node)?.is_some();
            if online {
                crate::db::gateway::post(c, node, &body)?;
            }
            Ok::<_, crate::error::AppError>(online)
        })
        .await?;
    if online {
        Ok(())
    } else {
        Err(DeliverError::NotConnected)
    }
}

/// How often a replica looks for mail to its agents.
pub const MAIL_POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// Mail older than this is dropped unread (what it asked for has timed out).
pub const MAIL_TTL_S: i64 = 30;

/// Forwards the mailbox's messages to the agents this replica holds, for as long as the
/// portal runs (PostgreSQL only).
pub async fn forward_mail(ctx: super::Ctx) {
    loop {
        tokio::time::sleep(MAIL_POLL).await;
        let nodes = ctx.agents.connected();
        let ttl = chrono::Duration::seconds(MAIL_TTL_S);
        let mail = ctx
            .db
            .run(move |c| crate::db::gateway::take(c, &nodes, ttl))
            .await;
        match mail {
            Ok(mail) => {
                for (node, body) in mail {
                    match serde_json::from_str::<PortalMsg>(&body) {
                        Ok(msg) => {
                            if !ctx.agents.send(node, msg) {
                                tracing::warn!(node, "mail for an agent that just left; dropped");
                            }
                        }
                        Err(e) => tracing::error!(node, "unreadable agent mail: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("reading the agent mailbox: {e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_connection_replaces_older() {
        let r = Registry::default();
        let (a, _rx_a) = r.register(1);
        let (b, mut rx_b) = r.register(1);
        assert!(
            !r.unregister(1, a),
            "the old connection must not remove the new one"
        );
        assert!(r.send(
            1,
            PortalMsg::Renew {
                lease: commons_proto::Lease {
                    session: 0,
                    seq: 0,
                    valid_for_s: 0
                },
                attempts: vec![],
                time_limits: vec![]
            }
        ));
        assert!(rx_b.try_recv().is_ok());
        assert!(r.unregister(1, b));
        assert!(!r.is_connected(1));
    }
}
