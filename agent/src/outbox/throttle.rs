//! One attempt's output through its [`Bucket`]: what passes, and the lines that say what
//! did not.
//!
//! Invariants:
//! - Every byte the job wrote is either passed on or counted in a marker
//!   (`... N bytes dropped: output over the rate limit (64 KiB/s)`), which sits where the
//!   bytes were, on a line of its own, before the next output that passes.
//! - When the output pauses (a flush interval with nothing new) or ends, the last
//!   [`END_KEEP`] bytes that were dropped are passed after the marker (charged to the
//!   bucket, so the rate holds over time): the lines just before a pause, a hang or the
//!   end (a traceback after a flood) are always in the log.

use super::rate::{Bucket, LogLimit};
use crate::metrics::METRICS;
use std::time::Instant;

/// The end of dropped output kept, to be passed when the output pauses or ends.
pub const END_KEEP: usize = 8 * 1024;

#[derive(Debug)]
pub struct Throttle {
    bucket: Bucket,
    /// Bytes dropped since the last output that passed (those in `end` included).
    dropped: u64,
    /// The end of what was dropped (at most twice `END_KEEP`, trimmed when passed).
    end: String,
    /// Whether what was passed so far ends a line.
    line_start: bool,
}

impl Throttle {
    pub fn new(limit: LogLimit, now: Instant) -> Self {
        Self {
            bucket: Bucket::new(limit, now),
            dropped: 0,
            end: String::new(),
            line_start: true,
        }
    }

    /// A piece of the job's output: appended to `out` if it passes, after the marker for
    /// what was dropped before it; kept aside (and counted) if not.
    pub fn piece(&mut self, s: &str, out: &mut String, now: Instant) {
        if s.is_empty() {
            return;
        }
        if self.bucket.admit(s.len(), now) {
            self.end.clear();
            let n = std::mem::take(&mut self.dropped);
            self.marker(n, out);
            self.pass(s, out);
        } else {
            self.dropped += s.len() as u64;
            self.end.push_str(s);
            if self.end.len() > 2 * END_KEEP {
                self.end = from_line_start(&self.end, END_KEEP).to_string();
            }
        }
    }

    /// Whether output was dropped that no marker has said yet (the watcher then wakes
    /// when the output pauses, to say it).
    pub fn dropping(&self) -> bool {
        self.dropped > 0
    }

    /// The output paused or ended: the marker for what was dropped, then the end of it.
    pub fn pause(&mut self, out: &mut String, now: Instant) {
        if self.dropped == 0 {
            return;
        }
        let end = from_line_start(&self.end, END_KEEP).to_string();
        self.end.clear();
        let n = std::mem::take(&mut self.dropped) - end.len() as u64;
        self.marker(n, out);
        self.bucket.charge(end.len(), now);
        self.pass(&end, out);
    }

    fn marker(&mut self, n: u64, out: &mut String) {
        if n == 0 {
            return;
        }
        METRICS.log_bytes("over_rate", n as usize);
        if !self.line_start {
            out.push('\n');
        }
        let rate = self.bucket.limit().rate_text();
        out.push_str(&format!(
            "... {n} bytes dropped: output over the rate limit ({rate})\n"
        ));
        self.line_start = true;
    }

    fn pass(&mut self, s: &str, out: &mut String) {
        if let Some(last) = s.chars().last() {
            self.line_start = last == '\n';
        }
        out.push_str(s);
    }
}

/// The last `max` bytes of `s` at most, from the start of a line where one starts in them.
fn from_line_start(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    let t = &s[start..];
    // The previous byte ends a line: `t` starts one already.
    if s.as_bytes()[start - 1] == b'\n' {
        return t;
    }
    match t.find('\n') {
        Some(i) if i + 1 < t.len() => &t[i + 1..],
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LIMIT: LogLimit = LogLimit {
        rate: 16 * 1024,
        burst: 16 * 1024,
    };

    fn dropped_in(log: &str) -> u64 {
        log.lines()
            .filter_map(|l| l.strip_prefix("... "))
            .filter_map(|l| l.split_once(" bytes dropped: output over the rate limit"))
            .map(|(n, _)| n.parse::<u64>().unwrap())
            .sum()
    }

    #[test]
    fn every_byte_is_passed_or_counted_and_the_end_is_kept() {
        let t0 = Instant::now();
        let mut th = Throttle::new(LIMIT, t0);
        let mut log = String::new();
        let mut written = 0u64;
        // 100-byte lines every 100 us for 3 s (about 1 MB/s), then a traceback.
        for i in 0..30_000u64 {
            let line = format!("{:099}\n", i);
            written += line.len() as u64;
            th.piece(&line, &mut log, t0 + Duration::from_micros(100 * i));
        }
        let last = "Traceback: the job's last words\n";
        written += last.len() as u64;
        th.piece(last, &mut log, t0 + Duration::from_secs(3));
        th.pause(&mut log, t0 + Duration::from_secs(3));
        let markers = log.lines().filter(|l| l.starts_with("... ")).count();
        let kept: u64 = log
            .lines()
            .filter(|l| !l.starts_with("... "))
            .map(|l| l.len() as u64 + 1)
            .sum();
        assert_eq!(kept + dropped_in(&log), written, "every byte accounted for");
        assert!(log.ends_with(last), "the last words are there");
        assert!(
            kept < 16 * 1024 * 4 + END_KEEP as u64,
            "about the limit: {kept}"
        );
        assert!((2..=5).contains(&markers), "{markers} markers");
        assert!(log.contains("(16 KiB/s)"), "the marker names the limit");
        // Every line is whole: a number of 99 digits or a marker.
        for l in log.lines() {
            assert!(
                l.starts_with("... ") || l.len() == 99 || l == last.trim_end(),
                "{l:?}"
            );
        }
    }

    #[test]
    fn a_marker_starts_a_line_of_its_own() {
        let t0 = Instant::now();
        let mut th = Throttle::new(LIMIT, t0);
        let mut log = String::new();
        th.piece(&"a".repeat(16 * 1024), &mut log, t0);
        th.piece("no newline yet", &mut log, t0);
        th.piece("then this", &mut log, t0 + Duration::from_secs(2));
        assert!(
            log.ends_with(
                "a\n... 14 bytes dropped: output over the rate limit (16 KiB/s)\nthen this"
            ),
            "{:?}",
            &log[log.len() - 100..]
        );
    }

    #[test]
    fn nothing_dropped_nothing_said() {
        let t0 = Instant::now();
        let mut th = Throttle::new(LIMIT, t0);
        let mut log = String::new();
        th.piece("hello\n", &mut log, t0);
        th.pause(&mut log, t0);
        assert_eq!(log, "hello\n");
    }

    #[test]
    fn the_kept_end_starts_at_a_line() {
        let s = format!("{}\nsecond\nthird\n", "x".repeat(100));
        assert_eq!(from_line_start(&s, 20), "second\nthird\n");
        assert_eq!(from_line_start("short", 20), "short");
        assert_eq!(from_line_start(&"y".repeat(50), 20), "y".repeat(20));
        assert_eq!(from_line_start("ab\ncd\n", 3), "cd\n");
    }
}
