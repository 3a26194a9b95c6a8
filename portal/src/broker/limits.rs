//! What the portal takes from one agent: bounded messages, at a bounded rate. A message
//! past a bound is refused (and counted) before it touches the database; an agent that
//! keeps sending refused messages is disconnected.

use commons_proto::AgentMsg;
use std::time::Instant;

/// The largest log chunk (the agent sends 64 KiB at most).
pub const MAX_LOG_CHUNK: usize = 256 * 1024;
/// GPUs in an inventory (MIG instances included).
pub const MAX_GPUS: usize = 256;
/// Attempts in one `Hello` or heartbeat.
pub const MAX_REPORTS: usize = 2048;
/// Messages per second, on average, and the burst allowed above it.
pub const RATE_PER_S: f64 = 200.0;
pub const BURST: f64 = 1000.0;
/// Refused messages after which the connection is closed.
pub const MAX_REFUSED: u64 = 1000;

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

/// A token bucket per connection.
#[derive(Debug)]
pub struct Rate {
    tokens: f64,
    last: Instant,
}

impl Rate {
    pub fn new(now: Instant) -> Self {
        Self {
            tokens: BURST,
            last: now,
        }
    }

    /// Whether one more message may pass at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * RATE_PER_S).min(BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
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
}
