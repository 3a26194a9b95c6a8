//! Lending rules: whether a node lends to a given guest job now, and the weekly-window
//! arithmetic behind "lend at nights and weekends".
//!
//! Invariants:
//! - `now` is UTC seconds since the Unix epoch (1970-01-01 was a Thursday); windows are
//!   in campus local time, `now + utc_offset_s`.
//! - A guest may start in a window only if its time limit ends before the window (or a
//!   chain of adjoining windows) closes, so closing a window never needs a preemption.
//! - These checks concern guests only; a lab's own jobs ignore its lending rules (and
//!   its disk floor, which keeps guests out).

use crate::model::{Node, QueuedJob, Time};
use crate::policy::{LendMode, WeeklyWindow, WEEK_MINUTES};

const WEEK_S: i64 = WEEK_MINUTES as i64 * 60;

/// Seconds since Monday 00:00 local time.
pub(crate) fn second_of_week(now: Time, utc_offset_s: i32) -> i64 {
    let local = now.saturating_add(i64::from(utc_offset_s));
    // The epoch day was a Thursday, three days after Monday.
    (local.rem_euclid(WEEK_S) + 3 * 86_400).rem_euclid(WEEK_S)
}

/// When lending ends if it is open at `now`, following adjoining windows.
///
/// 1. Find a window that contains `now` (by second of the week); none: closed.
/// 2. Its end is the candidate end; while another window contains that instant, move
///    the end to that window's end (at most one step per window, so it terminates).
/// 3. If the chain covers the whole week, lending never ends.
pub(crate) fn window_end(windows: &[WeeklyWindow], now: Time, utc_offset_s: i32) -> Option<Time> {
    let sow = second_of_week(now, utc_offset_s);
    // Offset (seconds from `sow`, in 0..WEEK_S) until the end of a window that contains
    // the instant `at` seconds after `sow`.
    let end_after = |at: i64| -> Option<i64> {
        let point = (sow + at).rem_euclid(WEEK_S);
        windows.iter().find_map(|w| {
            let start = i64::from(w.start_minute % WEEK_MINUTES) * 60;
            let end = i64::from(w.end_minute % WEEK_MINUTES) * 60;
            let len = (end - start).rem_euclid(WEEK_S);
            let len = if len == 0 { WEEK_S } else { len };
            let into = (point - start).rem_euclid(WEEK_S);
            (into < len).then_some(at + len - into)
        })
    };
    let mut end = end_after(0)?;
    for _ in 0..windows.len() {
        if end >= WEEK_S {
            return Some(Time::MAX);
        }
        match end_after(end) {
            Some(next) if next > end => end = next,
            _ => break,
        }
    }
    if end >= WEEK_S {
        return Some(Time::MAX);
    }
    Some(now.saturating_add(end))
}

/// Why a node does not take a guest job, whatever its GPUs do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LendBlock {
    /// The owner reclaimed the node.
    Reclaimed,
    /// Its agent's disk is under its free-space floor.
    LowDisk,
    /// Its reported GPUs await its lab admin's approval.
    Unapproved,
    /// Lend never.
    Never,
    /// Lends in windows and none is open now.
    WindowClosed,
    /// A window is open, but the job would not end before it closes (or has no limit).
    WindowTooShort,
    /// The job's lab may not borrow here.
    Borrower,
    /// The job's time limit is above the node's longest guest job.
    TooLong,
    /// The job asks for a share of a GPU and the node's GPUs take no shares
    /// ([`crate::Lending::share_gpus`]).
    NoSharing,
}

impl LendBlock {
    /// Researcher-facing text, with the node's name.
    pub(crate) fn describe(self, node: &str, job: &QueuedJob, rules: &crate::Lending) -> String {
        match self {
            LendBlock::Reclaimed => format!("the owner of node {node} has reclaimed it"),
            LendBlock::LowDisk => format!(
                "node {node} is low on disk space (under its agent's free-space floor) and \
                 takes no new guests"
            ),
            LendBlock::Unapproved => format!(
                "node {node} reports GPUs its lab admin has not approved yet, so it takes no \
                 guests"
            ),
            LendBlock::Never => format!("node {node} does not lend its GPUs"),
            LendBlock::WindowClosed => {
                format!("node {node} lends only in its time windows, and none is open now")
            }
            LendBlock::WindowTooShort if job.time_limit_s <= 0 => {
                format!("node {node} lends only in time windows, to jobs with a time limit")
            }
            LendBlock::WindowTooShort => format!(
                "node {node} lends only in time windows, and a job of {} would not end \
                 before the current one closes",
                crate::reason::hours(job.time_limit_s)
            ),
            LendBlock::Borrower => format!("node {node} does not lend to your lab"),
            LendBlock::NoSharing => {
                format!("node {node} does not share its GPUs (it lends whole GPUs only)")
            }
            LendBlock::TooLong => format!(
                "node {node} lends only to jobs of at most {}",
                crate::reason::hours(rules.max_guest_time_limit_s.unwrap_or(0))
            ),
        }
    }
}

/// The node-level lending check for a guest job (GPU idleness and the lent-GPU limit
/// are checked per GPU by the caller). `lend_until` is [`crate::Lending::lend_until`].
pub(crate) fn guest_block(
    node: &Node,
    lend_until: Option<Time>,
    job: &QueuedJob,
    now: Time,
) -> Option<LendBlock> {
    let rules = &node.lending;
    if node.reclaim {
        return Some(LendBlock::Reclaimed);
    }
    if node.low_disk {
        return Some(LendBlock::LowDisk);
    }
    if node.inventory_unapproved {
        return Some(LendBlock::Unapproved);
    }
    if rules.mode == LendMode::Never {
        return Some(LendBlock::Never);
    }
    if !rules.borrowers.is_empty() && !rules.borrowers.contains(&job.lab) {
        return Some(LendBlock::Borrower);
    }
    if let Some(max) = rules.max_guest_time_limit_s {
        if job.time_limit_s <= 0 || job.time_limit_s > max {
            return Some(LendBlock::TooLong);
        }
    }
    match lend_until {
        None => Some(LendBlock::WindowClosed),
        Some(Time::MAX) => None,
        Some(until) if job.time_limit_s > 0 && now.saturating_add(job.time_limit_s) <= until => {
            None
        }
        Some(_) => Some(LendBlock::WindowTooShort),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-01-01 00:00 UTC, a Monday.
    const MONDAY: Time = 1_704_067_200;

    #[test]
    fn epoch_weekday_is_thursday() {
        assert_eq!(second_of_week(0, 0), 3 * 86_400);
        assert_eq!(second_of_week(MONDAY, 0), 0);
        assert_eq!(second_of_week(MONDAY + 3600, -3600), 0);
    }

    #[test]
    fn window_table() {
        let nights = WeeklyWindow::daily(&[0, 1, 2, 3, 4, 5, 6], 20 * 60, 8 * 60);
        let weekend = vec![WeeklyWindow::weekend()];
        let h = 3600;
        let cases: Vec<(&str, &[WeeklyWindow], Time, Option<Time>)> = vec![
            (
                "monday noon, nights: closed",
                &nights,
                MONDAY + 12 * h,
                None,
            ),
            (
                "monday 21:00, nights: until tuesday 08:00",
                &nights,
                MONDAY + 21 * h,
                Some(MONDAY + 32 * h),
            ),
            (
                "monday 03:00 is sunday's night",
                &nights,
                MONDAY + 3 * h,
                Some(MONDAY + 8 * h),
            ),
            (
                "weekend on friday: closed",
                &weekend,
                MONDAY + 4 * 24 * h,
                None,
            ),
            (
                "weekend on saturday: until monday",
                &weekend,
                MONDAY + 5 * 24 * h + 5,
                Some(MONDAY + 7 * 24 * h),
            ),
        ];
        for (name, windows, now, want) in cases {
            assert_eq!(window_end(windows, now, 0), want, "{name}");
        }
    }

    #[test]
    fn adjoining_windows_chain() {
        let mut w = WeeklyWindow::daily(&[4], 20 * 60, 24 * 60);
        w.push(WeeklyWindow::weekend());
        let friday_9pm = MONDAY + (4 * 24 + 21) * 3600;
        assert_eq!(window_end(&w, friday_9pm, 0), Some(MONDAY + 7 * 24 * 3600));
        let all_week = [WeeklyWindow {
            start_minute: 0,
            end_minute: 0,
        }];
        assert_eq!(window_end(&all_week, friday_9pm, 0), Some(Time::MAX));
    }
}
