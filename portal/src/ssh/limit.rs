//! Per-source-address limits of the SSH gateway: new connections per minute, and failed
//! logins per minute after which the address is refused for a minute. Time is passed in,
//! so the rules are tested without waiting.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at most; the oldest windows are forgotten past it (a flood of
/// spoofed addresses cannot grow memory without bound).
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    connections: u32,
    failures: u32,
    blocked_until: Option<Instant>,
}

#[derive(Debug)]
pub struct Limiter {
    connections_per_minute: u32,
    failures_per_minute: u32,
    by_addr: Mutex<HashMap<IpAddr, Window>>,
}

/// Whether a new connection may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Too many connections from this address this minute.
    TooMany,
    /// Too many failed logins from this address: refused until the block ends.
    Blocked,
}

impl Limiter {
    pub fn new(connections_per_minute: u32, failures_per_minute: u32) -> Self {
        Self {
            connections_per_minute,
            failures_per_minute,
            by_addr: Mutex::new(HashMap::new()),
        }
    }

    fn with<T>(&self, addr: IpAddr, now: Instant, f: impl FnOnce(&mut Window) -> T) -> T {
        let mut map = self.by_addr.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_TRACKED && !map.contains_key(&addr) {
            map.retain(|_, w| {
                now.duration_since(w.start) < WINDOW || w.blocked_until.is_some_and(|b| b > now)
            });
        }
        let w = map.entry(addr).or_insert(Window {
            start: now,
            connections: 0,
            failures: 0,
            blocked_until: None,
        });
        if now.duration_since(w.start) >= WINDOW {
            w.start = now;
            w.connections = 0;
            w.failures = 0;
        }
        f(w)
    }

    /// Counts a new connection from `addr`.
    pub fn connection(&self, addr: IpAddr, now: Instant) -> Verdict {
        let (cpm, _) = (self.connections_per_minute, self.failures_per_minute);
        self.with(addr, now, |w| {
            if w.blocked_until.is_some_and(|b| b > now) {
                return Verdict::Blocked;
            }
            w.blocked_until = None;
            if w.connections >= cpm {
                return Verdict::TooMany;
            }
            w.connections += 1;
            Verdict::Allow
        })
    }

    /// Counts a failed login from `addr`; true when that blocks the address.
    pub fn failure(&self, addr: IpAddr, now: Instant) -> bool {
        let fpm = self.failures_per_minute;
        self.with(addr, now, |w| {
            w.failures += 1;
            if w.failures >= fpm {
                w.blocked_until = Some(now + WINDOW);
                true
            } else {
                false
            }
        })
    }

    /// Whether `addr` is blocked now (checked again at each login attempt).
    pub fn blocked(&self, addr: IpAddr, now: Instant) -> bool {
        self.with(addr, now, |w| w.blocked_until.is_some_and(|b| b > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[test]
    fn connections_per_minute_per_address() {
        let l = Limiter::new(3, 100);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(l.connection(ip(1), t), Verdict::Allow);
        }
        assert_eq!(l.connection(ip(1), t), Verdict::TooMany);
        assert_eq!(l.connection(ip(2), t), Verdict::Allow, "another address");
        assert_eq!(
            l.connection(ip(1), t + Duration::from_secs(61)),
            Verdict::Allow,
            "a new minute"
        );
    }

    #[test]
    fn failures_block_the_address_for_a_minute() {
        let l = Limiter::new(100, 3);
        let t = Instant::now();
        assert!(!l.failure(ip(1), t));
        assert!(!l.failure(ip(1), t));
        assert!(l.failure(ip(1), t));
        assert!(l.blocked(ip(1), t));
        assert_eq!(
            l.connection(ip(1), t + Duration::from_secs(30)),
            Verdict::Blocked
        );
        assert_eq!(l.connection(ip(2), t), Verdict::Allow);
        assert_eq!(
            l.connection(ip(1), t + Duration::from_secs(61)),
            Verdict::Allow,
            "the block ends"
        );
    }
}
