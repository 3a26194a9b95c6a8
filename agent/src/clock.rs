//! The agent's clock for leases and time limits, and the log of its numbered messages.
//!
//! Leases and time limits are measured on `CLOCK_BOOTTIME` ([`now`]): monotonic (no NTP
//! step or operator can move it), counting while the machine is suspended, and shared by
//! every process of the boot, so the agent and its guards (`guard`) read the same deadline
//! from `lease.json`. It restarts at every boot, so a deadline on disk is only good with the
//! [`boot_id`] it was written under.
//!
//! A lease from the portal names one of this process's messages (`Lease {session, seq}`)
//! and counts from when the agent *sent* it ([`SentLog`]). The time is taken before the
//! message is written to the socket, so the agent's deadline is never later than the
//! portal's, which counts from when it *received* the message.
//!
//! Invariants: `seq` strictly increases within a process; a lease naming another session,
//! or a `seq` no longer (or never) in the log, grants nothing; the current connection's
//! `Hello` stays in the log however many heartbeats follow it.

use commons_proto::Lease;
use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

/// How many recent `seq`s the log keeps (besides the current connection's `Hello`).
pub const KEPT_SEQS: usize = 256;

/// Time since boot on `CLOCK_BOOTTIME` (falling back to `CLOCK_MONOTONIC`, which cannot
/// fail, on a kernel without it).
pub fn now() -> Duration {
    read(libc::CLOCK_BOOTTIME)
        .or_else(|| read(libc::CLOCK_MONOTONIC))
        .unwrap_or_default()
}

fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

/// This boot's identity (`/proc/sys/kernel/random/boot_id`); empty when unreadable, which
/// no deadline written on disk matches.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Milliseconds of a boot-clock time, for files.
pub fn to_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub fn from_ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Wall-clock time since the Unix epoch. Used only where the outside world speaks it:
/// Docker's log filter and the end time kept for people in `result.json`; never for a
/// lease or a time limit.
pub fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// The messages (`Hello`, `Heartbeat`) this agent process numbered, with when it sent each.
#[derive(Debug, Clone)]
pub struct SentLog {
    session: u64,
    next_seq: u64,
    recent: VecDeque<(u64, Duration)>,
    hello: Option<(u64, Duration)>,
}

impl SentLog {
    pub fn new(session: u64) -> Self {
        Self {
            session,
            next_seq: 1,
            recent: VecDeque::with_capacity(KEPT_SEQS),
            hello: None,
        }
    }

    /// The random number that names this agent process in `Hello.session`.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Numbers a message about to be sent at `now`. A `Hello` starts a connection and is
    /// kept for as long as that connection lasts (the next `Hello` replaces it).
    pub fn stamp(&mut self, now: Duration, hello: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.recent.len() == KEPT_SEQS {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, now));
        if hello {
            self.hello = Some((seq, now));
        }
        seq
    }

    /// When message `seq` was sent, if it is still known.
    pub fn sent_at(&self, seq: u64) -> Option<Duration> {
        if let Some((s, at)) = self.hello {
            if s == seq {
                return Some(at);
            }
        }
        // `recent` is sorted by seq: consecutive numbers, oldest first.
        let first = self.recent.front()?.0;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.recent
            .get(i)
            .filter(|(s, _)| *s == seq)
            .map(|(_, at)| *at)
    }

    /// The deadline a lease gives: `sent_at(seq) + valid_for_s`, or `None` when it names
    /// another session or an unknown `seq` (it grants nothing).
    pub fn deadline(&self, lease: &Lease) -> Option<Duration> {
        if lease.session != self.session {
            return None;
        }
        let at = self.sent_at(lease.seq)?;
        Some(at.saturating_add(Duration::from_secs(lease.valid_for_s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(session: u64, seq: u64, valid_for_s: u64) -> Lease {
        Lease {
            session,
            seq,
            valid_for_s,
        }
    }

    #[test]
    fn the_boot_clock_moves_forward() {
        let a = now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(now() > a);
        assert!(a > Duration::ZERO);
    }

    #[test]
    fn a_lease_counts_from_when_its_message_was_sent() {
        let mut log = SentLog::new(7);
        let t0 = Duration::from_secs(100);
        let hello = log.stamp(t0, true);
        let hb = log.stamp(t0 + Duration::from_secs(5), false);
        assert!(hb > hello);
        assert_eq!(
            log.deadline(&lease(7, hb, 30)),
            Some(Duration::from_secs(135))
        );
        assert_eq!(
            log.deadline(&lease(7, hello, 30)),
            Some(Duration::from_secs(130))
        );
        assert_eq!(log.deadline(&lease(8, hb, 30)), None, "another session");
        assert_eq!(log.deadline(&lease(7, hb + 1, 30)), None, "never sent");
    }

    #[test]
    fn old_seqs_are_forgotten_but_the_connections_hello_is_kept() {
        let mut log = SentLog::new(1);
        let hello = log.stamp(Duration::from_secs(1), true);
        let first_hb = log.stamp(Duration::from_secs(2), false);
        for i in 0..KEPT_SEQS as u64 {
            log.stamp(Duration::from_secs(3 + i), false);
        }
        assert_eq!(log.sent_at(first_hb), None, "too old");
        assert_eq!(log.sent_at(hello), Some(Duration::from_secs(1)));
        let last = log.stamp(Duration::from_secs(9999), false);
        assert_eq!(log.sent_at(last), Some(Duration::from_secs(9999)));
        let again = log.stamp(Duration::from_secs(10_000), true);
        assert_eq!(
            log.sent_at(hello),
            None,
            "a new connection's Hello replaces it"
        );
        assert_eq!(log.sent_at(again), Some(Duration::from_secs(10_000)));
    }
}
