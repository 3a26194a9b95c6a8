//! How fast one job's output may leave the agent: a token bucket in bytes, one per attempt
//! (`--log-rate`, `--log-burst`).
//!
//! Invariants:
//! - Over any span of time, what an attempt's bucket lets through (with what was charged
//!   to it) is at most `burst + rate * span` bytes. What must pass whatever the bucket
//!   holds (a marker, the end of a flood) is charged too, possibly below zero, so it delays
//!   what follows rather than adding to it.
//! - Once output is refused, nothing passes until a second's worth (`rate`, at most
//!   `burst`) is back: a flood's log alternates about a second of output with one marker,
//!   not a marker per line.

use std::time::Instant;

/// One attempt's output limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimit {
    /// Bytes per second, sustained.
    pub rate: u64,
    /// Bytes that may pass at once after a quiet spell (a job's start-up banner, a
    /// traceback).
    pub burst: u64,
}

/// The least of each: a Docker log line is up to 16 KiB, and a limit under a line a
/// second would drop every line.
pub const MIN_RATE: u64 = 1024;
pub const MIN_BURST: u64 = 16 * 1024;
/// The most of each: far past what the portal keeps of a job (4 MiB) in a second.
pub const MAX_BYTES: u64 = 1 << 30;

/// The defaults, measured and explained in the book (docs/src/reports/performance.md,
/// "A noisy guest"): far above what
/// a training job prints, far below what one flooding job would cost the portal.
pub const DEFAULT_RATE: u64 = 64 * 1024;
pub const DEFAULT_BURST: u64 = 1024 * 1024;

impl Default for LogLimit {
    fn default() -> Self {
        Self {
            rate: DEFAULT_RATE,
            burst: DEFAULT_BURST,
        }
    }
}

impl LogLimit {
    /// A limit from the flags' values, checked.
    pub fn new(rate: u64, burst: u64) -> Result<Self, String> {
        if !(MIN_RATE..=MAX_BYTES).contains(&rate) {
            return Err(format!(
                "--log-rate: {rate} bytes a second is out of range ({MIN_RATE} to {MAX_BYTES})"
            ));
        }
        if !(MIN_BURST..=MAX_BYTES).contains(&burst) {
            return Err(format!(
                "--log-burst: {burst} bytes is out of range ({MIN_BURST} to {MAX_BYTES})"
            ));
        }
        Ok(Self { rate, burst })
    }

    /// The rate as people read it (`64 KiB/s`).
    pub fn rate_text(&self) -> String {
        format!("{}/s", bytes_text(self.rate))
    }
}

/// `65536` as `64 KiB`, `1048576` as `1 MiB`, `1000` as `1000 bytes`.
pub fn bytes_text(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// A size for the flags: `65536`, `64K`, `64KiB`, `1M`, `1MiB` (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a size: write e.g. 65536, 64K or 1M");
    let n: u64 = num.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(scale).ok_or_else(bad)
}

/// One attempt's bucket.
#[derive(Debug)]
pub struct Bucket {
    limit: LogLimit,
    tokens: f64,
    last: Instant,
    /// Refusing until a second's worth is back.
    refusing: bool,
}

impl Bucket {
    /// A full bucket: a job's first output passes up to the burst.
    pub fn new(limit: LogLimit, now: Instant) -> Self {
        Self {
            limit,
            tokens: limit.burst as f64,
            last: now,
            refusing: false,
        }
    }

    pub fn limit(&self) -> LogLimit {
        self.limit
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.limit.rate as f64).min(self.limit.burst as f64);
    }

    /// Whether `n` bytes may pass at `now` (taken from the bucket if so).
    pub fn admit(&mut self, n: usize, now: Instant) -> bool {
        self.refill(now);
        // A piece larger than the burst needs a full bucket, not more than it holds.
        let need = (n as f64).min(self.limit.burst as f64);
        if self.refusing {
            let second = self.limit.rate.min(self.limit.burst) as f64;
            if self.tokens < need.max(second) {
                return false;
            }
            self.refusing = false;
        }
        if self.tokens >= need {
            self.tokens -= n as f64;
            true
        } else {
            self.refusing = true;
            false
        }
    }

    /// Takes `n` bytes that pass whatever the bucket holds (it may go below zero).
    pub fn charge(&mut self, n: usize, now: Instant) {
        self.refill(now);
        self.tokens -= n as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LIMIT: LogLimit = LogLimit {
        rate: 64 * 1024,
        burst: 1024 * 1024,
    };

    /// Feeds 2,000-byte lines every `every` for `span`; returns the bytes let through.
    fn flood(b: &mut Bucket, start: Instant, span: Duration, every: Duration) -> u64 {
        let mut passed = 0;
        let mut t = Duration::ZERO;
        while t < span {
            if b.admit(2000, start + t) {
                passed += 2000;
            }
            t += every;
        }
        passed
    }

    #[test]
    fn a_flood_gets_the_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(LIMIT, t0);
        let passed = flood(
            &mut b,
            t0,
            Duration::from_secs(60),
            Duration::from_micros(50),
        );
        let most = LIMIT.burst + 60 * LIMIT.rate;
        assert!(passed <= most, "{passed} > {most}");
        // Within a second's worth of the bound: the limit is a floor too, not only a cap.
        assert!(
            passed + LIMIT.rate + 2000 >= most,
            "{passed} far under {most}"
        );
    }

    #[test]
    fn a_refused_flood_resumes_after_a_seconds_worth_not_per_line() {
        let t0 = Instant::now();
        let mut b = Bucket::new(LIMIT, t0);
        // Empty the bucket.
        flood(
            &mut b,
            t0,
            Duration::from_secs(1),
            Duration::from_micros(50),
        );
        // Lines every millisecond for 10 s: count the switches from refused to passed.
        let mut resumed = 0;
        let mut was = true;
        for ms in 1000..11_000 {
            let ok = b.admit(2000, t0 + Duration::from_millis(ms));
            if ok && !was {
                resumed += 1;
            }
            was = ok;
        }
        assert!(
            (8..=11).contains(&resumed),
            "resumed {resumed} times in 10 s"
        );
    }

    #[test]
    fn a_quiet_job_is_never_limited() {
        let t0 = Instant::now();
        let mut b = Bucket::new(LIMIT, t0);
        // 200 bytes ten times a second for an hour: every line passes.
        for i in 0..36_000u64 {
            assert!(
                b.admit(200, t0 + Duration::from_millis(100 * i)),
                "line {i}"
            );
        }
    }

    #[test]
    fn what_is_charged_delays_what_follows() {
        let t0 = Instant::now();
        let mut b = Bucket::new(LIMIT, t0);
        b.charge(LIMIT.burst as usize + 64 * 1024, t0);
        assert!(!b.admit(100, t0 + Duration::from_millis(900)), "still owed");
        assert!(b.admit(100, t0 + Duration::from_millis(2100)));
    }

    #[test]
    fn sizes_and_limits_parse_and_check() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("1M"), Ok(1 << 20));
        for bad in ["", "K", "1.5M", "-1", "1T", "99999999999999999999G"] {
            assert!(
                parse_bytes(bad).unwrap_err().contains("not a size"),
                "{bad}"
            );
        }
        assert!(LogLimit::new(512, 1 << 20)
            .unwrap_err()
            .contains("--log-rate"));
        assert!(LogLimit::new(1 << 16, 1024)
            .unwrap_err()
            .contains("--log-burst"));
        assert_eq!(LogLimit::new(65536, 1 << 20), Ok(LogLimit::default()));
        assert_eq!(LogLimit::default().rate_text(), "64 KiB/s");
        assert_eq!(bytes_text(1000), "1000 bytes");
    }
}
