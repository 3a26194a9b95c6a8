//! What the portal takes from one agent: bounded messages, at a bounded rate. A message
//! past a bound is refused (and counted) before it touches the database; an agent that
//! keeps sending refused messages is disconnected.
//!
//! Invariants:
//! - Jobs' output (`Logs`) has a rate of its own per connection ([`LOG_RATE_PER_S`]),
//!   apart from everything else ([`RATE_PER_S`]): a flood of output never takes the room
//!   of a heartbeat or a report. Output over its rate is dropped, counted per attempt
//!   ([`LogDrops`]) and said in that attempt's log with its next chunk that passes; it is
//!   never a refusal, so no job's output can disconnect its server.
//! - Refusals leak away ([`Refusals`]): an agent is disconnected when refused messages
//!   pile up faster than [`REFUSALS_LEAK_PER_S`] to [`MAX_REFUSED`], not for a thousand
//!   refusals over a month.

use commons_proto::{AgentMsg, Attempt, JobId};
use std::collections::BTreeMap;
use std::time::Instant;

/// The largest log chunk (the agent sends 64 KiB at most).
pub const MAX_LOG_CHUNK: usize = 256 * 1024;
/// GPUs in an inventory (MIG instances included).
pub const MAX_GPUS: usize = 256;
/// Attempts in one `Hello` or heartbeat.
pub const MAX_REPORTS: usize = 2048;
/// Messages other than output per second, on average, and the burst allowed above it.
pub const RATE_PER_S: f64 = 200.0;
pub const BURST: f64 = 1000.0;
/// Output messages per second, and their burst: a burst holds an agent's whole outbox
/// (512 chunks), which it sends at once after a reconnect.
pub const LOG_RATE_PER_S: f64 = 200.0;
pub const LOG_BURST: f64 = 1000.0;
/// The level of refusals at which the connection is closed, and how fast it falls.
pub const MAX_REFUSED: f64 = 1000.0;
pub const REFUSALS_LEAK_PER_S: f64 = 10.0;
/// Attempts whose dropped output a connection remembers, to say it in their logs.
pub const MAX_DROP_ENTRIES: usize = 1024;

/// Why a message is refused before it is handled.
pub fn check(msg: &AgentMsg) -> Result<(), String> {
    match msg {
        AgentMsg::Hello { gpus, attempts, .. }
            if gpus.len() > MAX_GPUS || attempts.len() > MAX_REPORTS =>
        {
            Err(format!(
                "a Hello with {} GPUs and {} attempts",
                gpus.len(),
                attempts.len()
            ))
        }
        AgentMsg::Heartbeat {
            gpu_stats,
            attempts,
            ..
        } if gpu_stats.len() > MAX_GPUS || attempts.len() > MAX_REPORTS => Err(format!(
            "a heartbeat with {} GPU stats and {} attempts",
            gpu_stats.len(),
            attempts.len()
        )),
        AgentMsg::Logs { chunk, .. } if chunk.len() > MAX_LOG_CHUNK => {
            Err(format!("a log chunk of {} bytes", chunk.len()))
        }
        _ => Ok(()),
    }
}

/// A token bucket per connection, in messages.
#[derive(Debug)]
pub struct Rate {
    per_s: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Rate {
    /// The bucket for messages other than output.
    pub fn new(now: Instant) -> Self {
        Self::with(now, RATE_PER_S, BURST)
    }

    /// The bucket for jobs' output.
    pub fn logs(now: Instant) -> Self {
        Self::with(now, LOG_RATE_PER_S, LOG_BURST)
    }

    fn with(now: Instant, per_s: f64, burst: f64) -> Self {
        Self {
            per_s,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Whether one more message may pass at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_s).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A leaky bucket of refusals per connection.
#[derive(Debug)]
pub struct Refusals {
    level: f64,
    last: Instant,
    /// Refusals since the connection opened (for the log).
    pub total: u64,
}

impl Refusals {
    pub fn new(now: Instant) -> Self {
        Self {
            level: 0.0,
            last: now,
            total: 0,
        }
    }

    /// Counts one refusal at `now`; whether the connection should now be closed.
    pub fn add(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.level = (self.level - dt * REFUSALS_LEAK_PER_S).max(0.0) + 1.0;
        self.total += 1;
        self.level >= MAX_REFUSED
    }
}

/// Output dropped over the output rate, per attempt, until said in its log.
#[derive(Debug, Default)]
pub struct LogDrops {
    bytes: BTreeMap<(JobId, Attempt), u64>,
}

impl LogDrops {
    /// Counts a dropped chunk. Past [`MAX_DROP_ENTRIES`] attempts (only a rogue agent
    /// gets there) a new one goes uncounted: the metric still counts it.
    pub fn add(&mut self, job: JobId, attempt: Attempt, bytes: usize) {
        if self.bytes.len() >= MAX_DROP_ENTRIES && !self.bytes.contains_key(&(job, attempt)) {
            return;
        }
        *self.bytes.entry((job, attempt)).or_default() += bytes as u64;
    }

    /// The line to put before the attempt's next chunk that passes, if any was dropped.
    pub fn marker(&mut self, job: JobId, attempt: Attempt) -> Option<String> {
        let n = self.bytes.remove(&(job, attempt))?;
        Some(format!(
            "... {n} bytes dropped by the portal: output over the rate limit\n"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn oversized_messages_are_refused() {
        let big = AgentMsg::Logs {
            job: 1,
            attempt: 1,
            chunk: "x".repeat(MAX_LOG_CHUNK + 1),
        };
        assert!(check(&big).is_err());
        let ok = AgentMsg::Logs {
            job: 1,
            attempt: 1,
            chunk: "x".repeat(1000),
        };
        assert!(check(&ok).is_ok());
    }

    #[test]
    fn the_rate_is_bounded_with_a_burst() {
        let t = Instant::now();
        let mut r = Rate::new(t);
        let passed = (0..2000).filter(|_| r.take(t)).count();
        assert_eq!(passed, BURST as usize, "the burst, then nothing");
        assert!(
            r.take(t + Duration::from_millis(10)),
            "refilled at the rate"
        );
    }

    #[test]
    fn refusals_leak_away_but_a_pile_closes_the_connection() {
        let t = Instant::now();
        let mut r = Refusals::new(t);
        // Five refusals a second for an hour: under the leak, never closed.
        for i in 0..18_000u64 {
            assert!(!r.add(t + Duration::from_millis(200 * i)), "closed at {i}");
        }
        assert_eq!(r.total, 18_000);
        // A thousand at once: closed.
        let later = t + Duration::from_secs(3601);
        let closed = (0..1000).position(|_| r.add(later));
        assert_eq!(closed, Some(MAX_REFUSED as usize - 1));
    }

    #[test]
    fn dropped_output_is_said_once_per_attempt() {
        let mut d = LogDrops::default();
        d.add(1, 1, 100);
        d.add(1, 1, 50);
        d.add(2, 1, 7);
        assert_eq!(
            d.marker(1, 1).as_deref(),
            Some("... 150 bytes dropped by the portal: output over the rate limit\n")
        );
        assert_eq!(d.marker(1, 1), None);
        assert!(d.marker(2, 1).unwrap().starts_with("... 7 bytes"));
        for job in 0..(MAX_DROP_ENTRIES as i64 + 10) {
            d.add(job, 1, 1);
        }
        assert_eq!(d.bytes.len(), MAX_DROP_ENTRIES, "bounded");
    }
}
