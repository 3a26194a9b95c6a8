//! What the agent sends the portal besides its own `Hello`s and heartbeats, in two queues:
//! control (`AttemptEvent`s) and job output (`Logs`). The executor and the watchers put
//! messages in through an [`Outbox`]; the connection takes them out of the [`OutboxRx`].
//!
//! Invariants:
//! - Control comes out before output, and the connection sends its `Hello` and heartbeats
//!   before either (`session`), so a report or a lease never waits behind a job's output:
//!   at most the one chunk being written is ahead of it.
//! - Nothing is unbounded. Control holds at most [`CONTROL_MAX`] messages; past that one is
//!   dropped with a warning (every heartbeat carries every attempt's state, so a lost event
//!   costs only a few seconds). Output holds at most [`QUEUE_BYTES`] in [`QUEUE_CHUNKS`]
//!   chunks; a chunk that does not fit (the portal is unreachable or slow) is dropped,
//!   counted per attempt, and said in that attempt's log (`... N bytes dropped: ...`) with
//!   its next chunk that fits, or when its output ends ([`Outbox::finish`]).
//! - An attempt's output leaves in the order it came in, and an attempt's event never
//!   overtakes that attempt's own queued output (other attempts' output it does
//!   overtake). [`Outbox::logs_sent`] lets its watcher wait (bounded) until all of it has
//!   left before the end is recorded, so no heartbeat reports the end before the last
//!   lines either, on a working link.
//! - How fast one attempt's output may come in at all is [`rate`]'s and [`throttle`]'s
//!   business: its watcher passes it through a [`throttle::Throttle`] with this outbox's
//!   [`rate::LogLimit`].

pub mod rate;
pub mod throttle;

use crate::metrics::METRICS;
use crate::reconcile::Key;
use commons_proto::AgentMsg;
use rate::LogLimit;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;

/// Control messages queued at most (a server runs a few dozen attempts at most; each has a
/// handful of events in its life).
pub const CONTROL_MAX: usize = 4096;
/// Output queued at most: about half a minute of one job at the default rate, so a short
/// reconnect loses nothing, and what the portal's per-connection log burst takes at once.
pub const QUEUE_BYTES: usize = 2 * 1024 * 1024;
pub const QUEUE_CHUNKS: usize = 512;

/// The sending half; clones share the queues.
pub struct Outbox {
    shared: Arc<Shared>,
}

/// The receiving half (the connection).
pub struct OutboxRx {
    shared: Arc<Shared>,
}

struct Shared {
    queues: Mutex<Queues>,
    /// Wakes the receiver: something was queued, or the last sender went.
    ready: Notify,
    /// Wakes the watchers waiting for their output to leave.
    taken: Notify,
    senders: AtomicUsize,
    limit: LogLimit,
}

#[derive(Default)]
struct Queues {
    control: VecDeque<AgentMsg>,
    logs: VecDeque<(Key, String)>,
    log_bytes: usize,
    /// Bytes dropped for want of room, per attempt, not yet said in its log.
    dropped: BTreeMap<Key, u64>,
}

/// An outbox whose attempts' output is held to `limit`.
pub fn channel(limit: LogLimit) -> (Outbox, OutboxRx) {
    let shared = Arc::new(Shared {
        queues: Mutex::new(Queues::default()),
        ready: Notify::new(),
        taken: Notify::new(),
        senders: AtomicUsize::new(1),
        limit,
    });
    (
        Outbox {
            shared: shared.clone(),
        },
        OutboxRx { shared },
    )
}

fn lock(m: &Mutex<Queues>) -> MutexGuard<'_, Queues> {
    // The queues are consistent between any two statements that touch them.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The line that says output was dropped because it could not be sent.
fn unsent_marker(n: u64) -> String {
    format!("... {n} bytes dropped: the link to the portal was down or too slow\n")
}

impl Outbox {
    /// Queues a message: `Logs` with the output, anything else with control.
    pub fn send(&self, msg: AgentMsg) {
        match msg {
            AgentMsg::Logs {
                job,
                attempt,
                chunk,
            } => self.output((job, attempt), chunk),
            other => {
                let mut q = lock(&self.shared.queues);
                if q.control.len() >= CONTROL_MAX {
                    tracing::warn!(
                        kind = other.kind(),
                        "the portal is not taking messages; one dropped (heartbeats carry \
                         every attempt's state)"
                    );
                    return;
                }
                q.control.push_back(other);
                drop(q);
                self.shared.ready.notify_one();
            }
        }
    }

    fn output(&self, key: Key, chunk: String) {
        if chunk.is_empty() {
            return;
        }
        let mut q = lock(&self.shared.queues);
        if q.log_bytes + chunk.len() > QUEUE_BYTES || q.logs.len() >= QUEUE_CHUNKS {
            *q.dropped.entry(key).or_default() += chunk.len() as u64;
            METRICS.log_bytes("unsent", chunk.len());
            return;
        }
        let chunk = match q.dropped.remove(&key) {
            Some(n) => unsent_marker(n) + &chunk,
            None => chunk,
        };
        q.log_bytes += chunk.len();
        q.logs.push_back((key, chunk));
        drop(q);
        self.shared.ready.notify_one();
    }

    /// The attempt's output has ended: what it lost for want of room is said now (past
    /// the bound: one line).
    pub fn finish(&self, key: Key) {
        let mut q = lock(&self.shared.queues);
        if let Some(n) = q.dropped.remove(&key) {
            let line = unsent_marker(n);
            q.log_bytes += line.len();
            q.logs.push_back((key, line));
            drop(q);
            self.shared.ready.notify_one();
        }
    }

    /// Waits until none of the attempt's output is queued, or `within` passed; whether it
    /// all left.
    pub async fn logs_sent(&self, key: Key, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let taken = self.shared.taken.notified();
            tokio::pin!(taken);
            // Registered before looking, so a take between the look and the wait wakes us.
            taken.as_mut().enable();
            if !lock(&self.shared.queues)
                .logs
                .iter()
                .any(|(k, _)| *k == key)
            {
                return true;
            }
            if tokio::time::timeout_at(deadline, taken).await.is_err() {
                return false;
            }
        }
    }

    /// The limit each attempt's output is held to.
    pub fn limit(&self) -> LogLimit {
        self.shared.limit
    }
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::SeqCst);
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The last sender: a receiver waiting on an empty queue learns it is over.
            self.shared.ready.notify_one();
        }
    }
}

impl OutboxRx {
    /// The next message, control first; `None` once every sender is gone and the queues
    /// are empty. Cancel-safe: a message is taken only when it is returned.
    pub async fn recv(&mut self) -> Option<AgentMsg> {
        loop {
            if let Some(m) = self.try_recv() {
                return Some(m);
            }
            if self.shared.senders.load(Ordering::SeqCst) == 0 {
                return None;
            }
            // `notify_one` keeps a permit when nobody waits: a message queued between the
            // look and this wait is not missed.
            self.shared.ready.notified().await;
        }
    }

    /// The next message if one is queued, control first; but an attempt's event never
    /// overtakes that attempt's own output (its checkpoint's news, its last lines).
    pub fn try_recv(&mut self) -> Option<AgentMsg> {
        let mut q = lock(&self.shared.queues);
        let own_output = |m: &AgentMsg| {
            let key = event_key(m)?;
            q.logs.iter().position(|(k, _)| *k == key)
        };
        let taken = match q.control.front().map(own_output) {
            Some(Some(i)) => q.logs.remove(i),
            Some(None) => return q.control.pop_front(),
            None => q.logs.pop_front(),
        };
        let ((job, attempt), chunk) = taken?;
        q.log_bytes -= chunk.len();
        drop(q);
        METRICS.log_bytes("sent", chunk.len());
        self.shared.taken.notify_waiters();
        Some(AgentMsg::Logs {
            job,
            attempt,
            chunk,
        })
    }
}

/// The attempt a control message is about.
fn event_key(m: &AgentMsg) -> Option<Key> {
    match m {
        AgentMsg::AttemptEvent { job, attempt, .. } => Some((*job, *attempt)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commons_proto::{AttemptState, StopReason};

    fn logs(job: i64, chunk: &str) -> AgentMsg {
        AgentMsg::Logs {
            job,
            attempt: 1,
            chunk: chunk.into(),
        }
    }

    fn event(job: i64) -> AgentMsg {
        AgentMsg::AttemptEvent {
            job,
            attempt: 1,
            state: AttemptState::Running,
            exit_code: None,
            stop: None::<StopReason>,
            reason: None,
        }
    }

    fn chunk_of(m: Option<AgentMsg>) -> String {
        match m {
            Some(AgentMsg::Logs { chunk, .. }) => chunk,
            other => panic!("not output: {other:?}"),
        }
    }

    #[tokio::test]
    async fn control_overtakes_other_attempts_queued_output() {
        let (tx, mut rx) = channel(LogLimit::default());
        for i in 0..100 {
            tx.send(logs(2, &format!("line {i}\n")));
        }
        tx.send(event(1));
        assert!(matches!(
            rx.recv().await,
            Some(AgentMsg::AttemptEvent { .. })
        ));
        assert_eq!(chunk_of(rx.recv().await), "line 0\n");
    }

    #[tokio::test]
    async fn an_event_does_not_overtake_its_own_attempts_output() {
        let (tx, mut rx) = channel(LogLimit::default());
        tx.send(logs(2, "other job\n"));
        tx.send(logs(1, "checkpoint stored\n"));
        tx.send(event(1));
        assert_eq!(chunk_of(rx.recv().await), "checkpoint stored\n");
        assert!(matches!(
            rx.recv().await,
            Some(AgentMsg::AttemptEvent { job: 1, .. })
        ));
        assert_eq!(chunk_of(rx.recv().await), "other job\n");
    }

    #[tokio::test]
    async fn output_past_the_bound_is_dropped_and_said_with_the_next_chunk() {
        let (tx, mut rx) = channel(LogLimit::default());
        let big = "x".repeat(QUEUE_BYTES / 4);
        for _ in 0..4 {
            tx.send(logs(1, &big));
        }
        // Full: these two are dropped (the second job's too), then room is made.
        tx.send(logs(1, "lost\n"));
        tx.send(logs(2, "lost too\n"));
        for _ in 0..4 {
            assert_eq!(chunk_of(rx.recv().await).len(), big.len());
        }
        tx.send(logs(1, "after\n"));
        assert_eq!(
            chunk_of(rx.recv().await),
            "... 5 bytes dropped: the link to the portal was down or too slow\nafter\n"
        );
        // Job 2 says nothing more: its marker comes when its output ends.
        tx.finish((2, 1));
        assert_eq!(chunk_of(rx.recv().await), unsent_marker(9));
        assert!(rx.try_recv().is_none());
    }

    #[tokio::test]
    async fn chunks_are_bounded_in_number_too() {
        let (tx, mut rx) = channel(LogLimit::default());
        for _ in 0..QUEUE_CHUNKS + 10 {
            tx.send(logs(1, "a\n"));
        }
        let mut n = 0;
        while rx.try_recv().is_some() {
            n += 1;
        }
        assert_eq!(n, QUEUE_CHUNKS);
    }

    #[tokio::test]
    async fn control_is_bounded() {
        let (tx, mut rx) = channel(LogLimit::default());
        for _ in 0..CONTROL_MAX + 10 {
            tx.send(event(1));
        }
        let mut n = 0;
        while rx.try_recv().is_some() {
            n += 1;
        }
        assert_eq!(n, CONTROL_MAX);
    }

    #[tokio::test]
    async fn a_watcher_learns_when_its_output_left() {
        let (tx, mut rx) = channel(LogLimit::default());
        tx.send(logs(1, "one\n"));
        tx.send(logs(2, "other\n"));
        assert!(!tx.logs_sent((1, 1), Duration::from_millis(50)).await);
        let waiter = {
            let tx = tx.clone();
            tokio::spawn(async move { tx.logs_sent((1, 1), Duration::from_secs(30)).await })
        };
        assert_eq!(chunk_of(rx.recv().await), "one\n");
        assert!(waiter.await.unwrap(), "woken once job 1's output left");
        assert!(tx.logs_sent((3, 1), Duration::ZERO).await, "nothing queued");
    }

    #[tokio::test]
    async fn the_receiver_ends_when_the_senders_are_gone() {
        let (tx, mut rx) = channel(LogLimit::default());
        let other = tx.clone();
        tx.send(event(1));
        drop(tx);
        drop(other);
        assert!(rx.recv().await.is_some(), "what was queued still comes");
        assert!(rx.recv().await.is_none());
    }
}
