//! GPU-time bookkeeping of one simulation: busy GPU-seconds inside the measured span,
//! per hour for the plots, and GPU-seconds of work lost to stops.
//!
//! The measured span is `[first submission, last submission]` of the workload; time
//! outside it (the drain after the last arrival) is simulated but not counted here.

/// Accumulates busy and lost GPU time over the span `[start, end]`.
#[derive(Debug, Clone)]
pub struct Accounting {
    start: i64,
    end: i64,
    last: i64,
    busy_gpus: u64,
    /// Busy GPU-seconds inside the span.
    pub busy_gpu_s: f64,
    /// Lost GPU-seconds (work redone after a stop) inside the span.
    pub lost_in_span_gpu_s: f64,
    /// Lost GPU-seconds over the whole run.
    pub lost_gpu_s: f64,
    /// Busy GPU-seconds of each hour of the span, from `start`.
    pub hourly: Vec<f64>,
}

pub const BUCKET_S: i64 = 3_600;

impl Accounting {
    pub fn new(start: i64, end: i64) -> Accounting {
        let buckets = ((end - start) / BUCKET_S + 1).max(1) as usize;
        Accounting {
            start,
            end,
            last: start,
            busy_gpus: 0,
            busy_gpu_s: 0.0,
            lost_in_span_gpu_s: 0.0,
            lost_gpu_s: 0.0,
            hourly: vec![0.0; buckets],
        }
    }

    /// GPUs held by jobs right now.
    pub fn busy_gpus(&self) -> u64 {
        self.busy_gpus
    }

    /// Move the clock to `now`, counting the GPUs busy since the last call.
    pub fn advance(&mut self, now: i64) {
        if now <= self.last {
            return;
        }
        let (a, b) = (self.last.max(self.start), now.min(self.end));
        if self.busy_gpus > 0 && b > a {
            let g = self.busy_gpus as f64;
            self.busy_gpu_s += g * (b - a) as f64;
            let mut t = a;
            while t < b {
                let k = ((t - self.start) / BUCKET_S) as usize;
                let bucket_end = self.start + (k as i64 + 1) * BUCKET_S;
                let until = bucket_end.min(b);
                if let Some(h) = self.hourly.get_mut(k) {
                    *h += g * (until - t) as f64;
                }
                t = until;
            }
        }
        self.last = now;
    }

    /// `gpus` more GPUs are held from now on (call [`Accounting::advance`] first).
    pub fn take(&mut self, gpus: u64) {
        self.busy_gpus += gpus;
    }

    /// `gpus` GPUs are released now.
    pub fn release(&mut self, gpus: u64) {
        self.busy_gpus -= gpus;
    }

    /// A job on `gpus` GPUs lost the `lost_s` seconds of work just before `now`.
    pub fn lose(&mut self, now: i64, lost_s: i64, gpus: u64) {
        let g = gpus as f64;
        self.lost_gpu_s += g * lost_s as f64;
        let (a, b) = ((now - lost_s).max(self.start), now.min(self.end));
        if b > a {
            self.lost_in_span_gpu_s += g * (b - a) as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_inside_the_span() {
        let mut a = Accounting::new(100, 100 + 2 * BUCKET_S);
        a.advance(50);
        a.take(2);
        a.advance(100 + BUCKET_S + 600);
        a.release(1);
        a.advance(100 + 10 * BUCKET_S);
        assert_eq!(
            a.busy_gpu_s,
            (2 * (BUCKET_S + 600) + (BUCKET_S - 600)) as f64
        );
        assert_eq!(a.hourly[0], (2 * BUCKET_S) as f64);
        assert_eq!(a.hourly[1], (2 * 600 + BUCKET_S - 600) as f64);
        a.lose(200, 200, 4);
        assert_eq!(a.lost_gpu_s, 800.0);
        assert_eq!(a.lost_in_span_gpu_s, 400.0);
    }
}
