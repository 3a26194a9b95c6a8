//! The agents this portal replica holds a WebSocket to: a sender per connected node.
//! A node has at most one live connection: a newer one replaces the older, whose loop
//! then ends. Use cases queue messages here (a `Stop` after a cancel); the broker owns
//! the sockets.

use commons_proto::PortalMsg;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

type Conn = (u64, mpsc::UnboundedSender<PortalMsg>);

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
    pub fn register(&self, node: i64) -> (u64, mpsc::UnboundedReceiver<PortalMsg>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
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

    /// Queues a message for a node; false if it is not connected.
    pub fn send(&self, node: i64, msg: PortalMsg) -> bool {
        match self.conns().get(&node) {
            Some((_, tx)) => tx.send(msg).is_ok(),
            None => false,
        }
    }

    /// The nodes connected to this replica.
    pub fn connected(&self) -> Vec<i64> {
        let mut v: Vec<i64> = self.conns().keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn is_connected(&self, node: i64) -> bool {
        self.conns().contains_key(&node)
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
