//! Limits of the SSH gateway by source address: new connections per minute per address;
//! failed logins per minute per (address, user name), after which that pair is refused
//! for a minute; and a higher cap of failed logins per address, after which the address
//! itself is refused for a minute. Time is passed in, so the rules are tested without
//! waiting.
//!
//! Why two failure counts: a campus NAT puts many people behind one address. Counting
//! failures per address alone let one person's typo loop (or one prober) lock out
//! everyone behind it; counting per (address, user name) alone let a prober spread its
//! tries over `job-1`, `job-2`, ... The per-address cap bounds that, well above what one
//! user's mistakes reach.
//!
//! A key query (`publickey` without a signature) counts as a failure when it is asked;
//! [`Limiter::forgive`] takes one back when the same connection then logs in with that
//! key (an honest client always asks before it signs).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
/// Addresses (and address-user pairs) tracked at most; the oldest windows are forgotten
/// past it (a flood of spoofed addresses or made-up names cannot grow memory without
/// bound).
const MAX_TRACKED: usize = 100_000;
/// User names are counted by their first this many bytes (the key of the map stays small).
const USER_KEY_BYTES: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    connections: u32,
    failures: u32,
    blocked_until: Option<Instant>,
}

impl Window {
    fn new(now: Instant) -> Self {
        Window {
            start: now,
            connections: 0,
            failures: 0,
            blocked_until: None,
        }
    }

    /// A new minute starts counting afresh (a block runs its own course).
    fn roll(&mut self, now: Instant) {
        if now.duration_since(self.start) >= WINDOW {
            self.start = now;
            self.connections = 0;
            self.failures = 0;
        }
    }

    fn blocked(&self, now: Instant) -> bool {
        self.blocked_until.is_some_and(|b| b > now)
    }

    fn stale(&self, now: Instant) -> bool {
        now.duration_since(self.start) >= WINDOW && !self.blocked(now)
    }
}

#[derive(Debug, Default)]
struct Maps {
    by_addr: HashMap<IpAddr, Window>,
    by_user: HashMap<(IpAddr, String), Window>,
}

#[derive(Debug)]
pub struct Limiter {
    connections_per_minute: u32,
    failures_per_user: u32,
    failures_per_address: u32,
    maps: Mutex<Maps>,
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

/// What a failure blocked, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    No,
    /// This user name from this address, for a minute.
    User,
    /// Everything from this address, for a minute.
    Address,
}

fn user_key(addr: IpAddr, user: &str) -> (IpAddr, String) {
    let mut end = user.len().min(USER_KEY_BYTES);
    while !user.is_char_boundary(end) {
        end -= 1;
    }
    (addr, user[..end].to_string())
}

fn window<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Window>,
    key: K,
    now: Instant,
) -> &mut Window {
    if map.len() >= MAX_TRACKED && !map.contains_key(&key) {
        map.retain(|_, w| !w.stale(now));
    }
    let w = map.entry(key).or_insert_with(|| Window::new(now));
    w.roll(now);
    w
}

impl Limiter {
    /// `failures_per_user` per (address, user name), `failures_per_address` per address.
    pub fn new(
        connections_per_minute: u32,
        failures_per_user: u32,
        failures_per_address: u32,
    ) -> Self {
        Self {
            connections_per_minute,
            failures_per_user,
            failures_per_address,
            maps: Mutex::new(Maps::default()),
        }
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new connection from `addr`.
    pub fn connection(&self, addr: IpAddr, now: Instant) -> Verdict {
        let mut maps = self.maps();
        let w = window(&mut maps.by_addr, addr, now);
        if w.blocked(now) {
            return Verdict::Blocked;
        }
        w.blocked_until = None;
        if w.connections >= self.connections_per_minute {
            return Verdict::TooMany;
        }
        w.connections += 1;
        Verdict::Allow
    }

    /// Counts a failed login (or a key query) by `user` from `addr`; what that blocked.
    pub fn failure(&self, addr: IpAddr, user: &str, now: Instant) -> Blocked {
        let mut maps = self.maps();
        let u = window(&mut maps.by_user, user_key(addr, user), now);
        u.failures += 1;
        let mut blocked = Blocked::No;
        if u.failures >= self.failures_per_user {
            u.blocked_until = Some(now + WINDOW);
            blocked = Blocked::User;
        }
        let a = window(&mut maps.by_addr, addr, now);
        a.failures += 1;
        if a.failures >= self.failures_per_address {
            a.blocked_until = Some(now + WINDOW);
            blocked = Blocked::Address;
        }
        blocked
    }

    /// Takes back one failure of `user` from `addr` (a key query followed by a login
    /// with that key). A block already begun runs its course.
    pub fn forgive(&self, addr: IpAddr, user: &str, now: Instant) {
        let mut maps = self.maps();
        let u = window(&mut maps.by_user, user_key(addr, user), now);
        u.failures = u.failures.saturating_sub(1);
        let a = window(&mut maps.by_addr, addr, now);
        a.failures = a.failures.saturating_sub(1);
    }

    /// Whether `user` from `addr` is refused now (the pair or the whole address).
    pub fn blocked(&self, addr: IpAddr, user: &str, now: Instant) -> bool {
        let mut maps = self.maps();
        if window(&mut maps.by_addr, addr, now).blocked(now) {
            return true;
        }
        window(&mut maps.by_user, user_key(addr, user), now).blocked(now)
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
        let l = Limiter::new(3, 100, 1000);
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
    fn failures_block_the_user_from_the_address_not_the_others_behind_it() {
        let l = Limiter::new(100, 3, 10);
        let t = Instant::now();
        assert_eq!(l.failure(ip(1), "job-1", t), Blocked::No);
        assert_eq!(l.failure(ip(1), "job-1", t), Blocked::No);
        assert_eq!(l.failure(ip(1), "job-1", t), Blocked::User);
        assert!(l.blocked(ip(1), "job-1", t));
        assert!(!l.blocked(ip(1), "job-2", t), "another user behind the NAT");
        assert!(!l.blocked(ip(2), "job-1", t), "the same user elsewhere");
        assert_eq!(l.connection(ip(1), t), Verdict::Allow);
        assert!(
            !l.blocked(ip(1), "job-1", t + Duration::from_secs(61)),
            "the block ends"
        );
    }

    #[test]
    fn the_address_has_a_higher_cap_of_its_own() {
        let l = Limiter::new(100, 3, 5);
        let t = Instant::now();
        for n in 0..4 {
            assert_eq!(l.failure(ip(1), &format!("job-{n}"), t), Blocked::No);
        }
        assert_eq!(l.failure(ip(1), "job-9", t), Blocked::Address);
        assert!(l.blocked(ip(1), "job-77", t), "everyone from it");
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

    #[test]
    fn a_query_followed_by_its_login_costs_nothing() {
        let l = Limiter::new(100, 2, 100);
        let t = Instant::now();
        for _ in 0..10 {
            assert_eq!(l.failure(ip(1), "job-1", t), Blocked::No);
            l.forgive(ip(1), "job-1", t);
        }
        assert!(!l.blocked(ip(1), "job-1", t));
        assert_eq!(l.failure(ip(1), "job-1", t), Blocked::No);
        assert_eq!(l.failure(ip(1), "job-1", t), Blocked::User);
    }

    #[test]
    fn long_names_are_counted_by_their_start() {
        let l = Limiter::new(100, 2, 100);
        let t = Instant::now();
        let long = "é".repeat(100);
        l.failure(ip(1), &long, t);
        l.failure(ip(1), &format!("{long}x"), t);
        assert!(l.blocked(ip(1), &long, t));
    }
}
