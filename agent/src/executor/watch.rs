//! The one watcher of a container: forwards its logs, waits for its end, drains the logs,
//! and records the end in the table.
//!
//! Invariants: a failed wait is not an end. The container is inspected again: still
//! running, it is watched again (its log stream restarted if that ended too); ended, its
//! exit code counts; gone, it is lost (reported as stopped with `StopReason::Lost`, which
//! the portal requeues). An end the guard caused (`stopped.json`) is recorded with the
//! guard's reason, never as the job's own exit. The output goes through the attempt's
//! [`Throttle`] (its `--log-rate`); all of it, dropped or not, goes into the tail kept for
//! `result.json`. The end is recorded once the output has left the outbox too (or after
//! [`LOG_DRAIN`]), so the portal gets an attempt's last lines before its end.

use super::{lock, upgrade, Executor, Inner, Table};
use crate::clock;
use crate::outbox::throttle::Throttle;
use crate::outbox::Outbox;
use crate::reconcile::{Key, Phase, Stopping, Why};
use crate::runtime::{ContainerRuntime, ContainerStatus};
use crate::store::{self, LOG_TAIL_MAX};
use commons_proto::AgentMsg;
use futures_util::StreamExt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Logs are sent in chunks of this many bytes, or once a chunk's first byte waited the
/// flush interval.
const LOG_CHUNK: usize = 16 * 1024;
const LOG_FLUSH: Duration = Duration::from_millis(300);
/// How long the end of a container's log stream may take after the container ended, and
/// then how long its output may take to leave the outbox.
const LOG_DRAIN: Duration = Duration::from_secs(5);
/// Pause before watching a container again after a failed wait.
const WAIT_RETRY: Duration = Duration::from_secs(1);

impl<R: ContainerRuntime> Executor<R> {
    /// Spawns the one watcher of a container; `logs_since` is wall-clock (Docker's filter).
    pub(super) fn follow(
        &self,
        t: &mut Table,
        key: Key,
        container: String,
        logs_since: Option<Duration>,
    ) {
        let tail = Arc::new(Mutex::new(String::new()));
        t.tails.insert(key, tail.clone());
        tokio::spawn(watch(
            self.weak(),
            self.inner.runtime.clone(),
            self.inner.events.clone(),
            key,
            container,
            logs_since,
            tail,
        ));
    }
}

async fn watch<R: ContainerRuntime>(
    weak: Weak<Inner<R>>,
    runtime: Arc<R>,
    events: Outbox,
    key: Key,
    container: String,
    logs_since: Option<Duration>,
    tail: Arc<Mutex<String>>,
) {
    let (job, attempt) = key;
    let spawn_logs = |since| {
        tokio::spawn(forward_logs(
            runtime.logs(&container, since),
            events.clone(),
            key,
            tail.clone(),
        ))
    };
    let mut logs = spawn_logs(logs_since);
    let end: Result<i64, String> = loop {
        let err = match runtime.wait(&container).await {
            Ok(code) => break Ok(code),
            Err(e) => e,
        };
        if weak.strong_count() == 0 {
            return;
        }
        match runtime.inspect(&container).await {
            Ok(ContainerStatus::Exited(code)) => break Ok(code),
            Ok(ContainerStatus::Gone) => break Err(err.to_string()),
            Ok(ContainerStatus::Running) => {
                tracing::warn!(
                    job,
                    attempt,
                    "waiting for container {container} failed ({err}); it still runs, watching it again"
                );
                if logs.is_finished() {
                    logs = spawn_logs(Some(clock::wall_now()));
                }
            }
            Err(e) => tracing::warn!(
                job,
                attempt,
                "waiting for container {container} failed ({err}), and so did inspecting it ({e}); trying again"
            ),
        }
        tokio::time::sleep(WAIT_RETRY).await;
    };
    // The log stream ends with the container; give it a moment to drain, and its output
    // a moment to leave (on a link that is down, the end goes first and the rest later).
    let _ = tokio::time::timeout(LOG_DRAIN, logs).await;
    events.logs_sent(key, LOG_DRAIN).await;
    let Some(exec) = upgrade(&weak) else { return };
    if record_end(&exec, key, container, end) {
        exec.step(clock::now());
    }
}

/// Records how the container of `key` ended (with the guard's reason, when the guard
/// stopped it), unless the attempt has moved on to another container; whether it did.
fn record_end<R: ContainerRuntime>(
    exec: &Executor<R>,
    key: Key,
    container: String,
    end: Result<i64, String>,
) -> bool {
    let (job, attempt) = key;
    let by_guard = exec.inner.store.read_stopped(key);
    let mut t = exec.table();
    let Some(h) = t.have.get_mut(&key) else {
        return false;
    };
    let ours = matches!(&h.phase,
        Phase::Running { container: c } | Phase::Draining { container: c } if *c == container);
    if !ours {
        return false;
    }
    if h.stopping.is_none() {
        match by_guard {
            Ok(Some(s)) => {
                tracing::warn!(job, attempt, reason = %s.reason, "the attempt's guard stopped it");
                h.stopping = Some(Stopping {
                    why: Why::of(s.reason),
                    grace: Duration::from_secs(s.grace_s),
                    since: clock::from_ms(s.at_ms),
                    issued: true,
                });
            }
            Ok(None) => {}
            Err(e) => tracing::error!(job, attempt, "{e}"),
        }
    }
    h.phase = match end {
        Ok(exit_code) => Phase::Ended {
            container,
            exit_code,
        },
        Err(error) => Phase::Lost { container, error },
    };
    true
}

/// Sends a container's output as `Logs` messages, held to the outbox's limit and batched:
/// a chunk leaves when it is full or its first byte waited [`LOG_FLUSH`] (so a job that
/// prints steadily is read live, not when a chunk fills). Keeps the output's end in
/// `tail` (for `result.json`).
async fn forward_logs(
    stream: impl futures_util::Stream<Item = String>,
    events: Outbox,
    key: Key,
    tail: Arc<Mutex<String>>,
) {
    let (job, attempt) = key;
    let mut stream = std::pin::pin!(stream);
    let mut throttle = Throttle::new(events.limit(), Instant::now());
    let mut buf = String::new();
    // When the chunk's first byte came, and when the last output did.
    let mut since: Option<Instant> = None;
    let mut last = Instant::now();
    let flush = |buf: &mut String| {
        if !buf.is_empty() {
            events.send(AgentMsg::Logs {
                job,
                attempt,
                chunk: std::mem::take(buf),
            });
        }
    };
    loop {
        // Wake to send the chunk, or to end a drop once the output paused; else wait.
        let paused_at = throttle.dropping().then(|| last + LOG_FLUSH);
        let due = since.map(|t| t + LOG_FLUSH);
        let wake = match (paused_at, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next = match wake {
            Some(w) => tokio::time::timeout_at(w.into(), stream.next()).await,
            None => Ok(stream.next().await),
        };
        let now = Instant::now();
        match next {
            Ok(Some(s)) => {
                last = now;
                keep_tail(&tail, &s);
                throttle.piece(&s, &mut buf, now);
                if buf.len() >= LOG_CHUNK {
                    flush(&mut buf);
                }
                since = match since {
                    _ if buf.is_empty() => None,
                    None => Some(now),
                    kept => kept,
                };
            }
            Ok(None) => break,
            Err(_) => {
                if now >= last + LOG_FLUSH {
                    throttle.pause(&mut buf, now);
                }
                flush(&mut buf);
                since = None;
            }
        }
    }
    throttle.pause(&mut buf, Instant::now());
    flush(&mut buf);
    events.finish(key);
}

/// Appends to the kept end of the output, trimming it now and then (at twice the size kept,
/// so trimming costs little).
fn keep_tail(tail: &Mutex<String>, s: &str) {
    let mut t = lock(tail);
    t.push_str(s);
    if t.len() > 2 * LOG_TAIL_MAX {
        *t = store::tail(&t, LOG_TAIL_MAX).to_string();
    }
}
