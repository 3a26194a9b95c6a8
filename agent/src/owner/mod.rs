//! The owner stays in charge of the server: the agent's own decisions ([`watch`]: local
//! use, faults, reclaim, idle guests), the commands on the server ([`socket`]: a local
//! Unix socket that `commons-agent status|lend|drain|undrain|leave|reclaim` talk to),
//! and the server's capacity for the portal ([`capacity`]).
//!
//! Invariants:
//! - The agent acts on local use, faults and `reclaim --now` by itself, without waiting
//!   for the portal (which may be unreachable); it tells the portal by the attempts'
//!   reports and its heartbeats, as for any stop.
//! - Every command that changes a setting goes to the portal, which records it in the
//!   lab's audit log; a command the portal did not accept changed nothing (except that
//!   `reclaim --now` stops the guests here in any case).

pub mod capacity;
pub mod server;
pub mod socket;
pub mod watch;

use crate::executor::Executor;
use crate::gpu::GpuSource;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
pub use watch::IdleRule;

/// The agent's link to the portal, as `status` shows it.
#[derive(Debug, Clone, Default)]
pub struct Link {
    pub connected: bool,
    /// Wall-clock time (RFC 3339) of the last change.
    pub since: String,
    /// Why the last connection failed or ended.
    pub last_error: Option<String>,
}

/// What the session, the watch and the socket share.
pub struct OwnerState {
    pub link: Mutex<Link>,
    /// `reclaim --now` is in force: no guest runs here.
    pub reclaimed: AtomicBool,
    pub idle: IdleRule,
    /// Set once `leave` has deregistered the node: the agent stops.
    pub left: Notify,
}

impl OwnerState {
    pub fn new(idle: IdleRule) -> Arc<Self> {
        Arc::new(Self {
            link: Mutex::new(Link::default()),
            reclaimed: AtomicBool::new(false),
            idle,
            left: Notify::new(),
        })
    }

    pub fn set_link(&self, connected: bool, error: Option<String>) {
        let mut l = self.link.lock().unwrap_or_else(|p| p.into_inner());
        if l.connected != connected || error.is_some() {
            l.since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        }
        l.connected = connected;
        if error.is_some() || connected {
            l.last_error = error;
        }
    }

    pub fn link(&self) -> Link {
        self.link.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::SeqCst)
    }
}

/// How often the watch looks at the GPUs.
pub const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// Runs the watch for as long as the agent runs (see [`watch`]).
pub async fn run_watch(exec: Executor, gpus: Arc<dyn GpuSource>, owner: Arc<OwnerState>) {
    let mut track = watch::IdleTrack::default();
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let attempts = exec.active();
        if attempts.is_empty() {
            continue;
        }
        let stats = match exec.gpu_stats(&*gpus).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("GPU stats for the watch: {e}");
                continue;
            }
        };
        let decisions = watch::decide(
            crate::clock::now(),
            &attempts,
            &stats,
            owner.is_reclaimed(),
            owner.idle,
            &mut track,
        );
        for d in decisions {
            match d {
                watch::Decision::Stop {
                    job,
                    attempt,
                    grace_s,
                    reason,
                    detail,
                } => {
                    tracing::info!(job, attempt, grace_s, %reason, %detail, "stopping on the owner's behalf");
                    exec.stop(job, attempt, grace_s, reason, Some(&detail));
                }
                watch::Decision::Warn { job, attempt, line } => {
                    tracing::info!(job, attempt, "{line}");
                    exec.note(job, attempt, &line);
                }
            }
        }
    }
}
