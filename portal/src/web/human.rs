//! Numbers and times as a person reads them: "12 min", "3.4 h", "5 min ago",
//! "2026-12-03 14:05 UTC+01:00". Pure functions; the pages call them when they build
//! their views.

use chrono::{FixedOffset, NaiveDateTime};

/// A duration in seconds with sensible precision: "40 s", "12 min", "3.4 h", "2.5 days".
pub fn duration(secs: i64) -> String {
    let s = secs.max(0);
    if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min", s / 60)
    } else if s < 48 * 3600 {
        hours(s as f64 / 3600.0)
    } else {
        format!("{:.1} days", s as f64 / 86400.0)
    }
}

/// GPU-hours (or hours): "0", "12 min" under an hour, "3.4 h", "27 h" from 10 on.
pub fn hours(h: f64) -> String {
    if h <= 0.0 || !h.is_finite() {
        "0".to_string()
    } else if h < 1.0 {
        let m = (h * 60.0).round() as i64;
        if m == 0 {
            "< 1 min".to_string()
        } else {
            format!("{m} min")
        }
    } else if h < 10.0 {
        format!("{h:.1} h")
    } else {
        format!("{h:.0} h")
    }
}

/// How long ago `t` was, from `now`: "just now", "5 min ago", "3.4 h ago"; a time
/// ahead is "in 5 min".
pub fn ago(t: NaiveDateTime, now: NaiveDateTime) -> String {
    let s = (now - t).num_seconds();
    if s.abs() < 10 {
        "just now".to_string()
    } else if s > 0 {
        format!("{} ago", duration(s))
    } else {
        format!("in {}", duration(-s))
    }
}

/// A UTC time in the zone `offset_s` seconds east of UTC, with the offset shown:
/// "2026-12-03 14:05 UTC+01:00" ("UTC" alone when the offset is 0).
pub fn at(t: NaiveDateTime, offset_s: i32) -> String {
    let Some(zone) = FixedOffset::east_opt(offset_s) else {
        return format!("{} UTC", t.format("%Y-%m-%d %H:%M"));
    };
    let local = t.and_utc().with_timezone(&zone);
    if offset_s == 0 {
        format!("{} UTC", local.format("%Y-%m-%d %H:%M"))
    } else {
        format!(
            "{} UTC{}",
            local.format("%Y-%m-%d %H:%M"),
            local.format("%:z")
        )
    }
}

/// The machine-readable form for `<time datetime>` (UTC, RFC 3339).
pub fn iso(t: NaiveDateTime) -> String {
    t.and_utc().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A time as the pages show it: when (with its offset) and how long ago.
#[derive(Debug, Clone)]
pub struct When {
    pub iso: String,
    pub at: String,
    pub ago: String,
}

impl When {
    pub fn new(t: NaiveDateTime, now: NaiveDateTime, offset_s: i32) -> When {
        When {
            iso: iso(t),
            at: at(t, offset_s),
            ago: ago(t, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    #[test]
    fn durations_have_sensible_precision() {
        assert_eq!(duration(-5), "0 s");
        assert_eq!(duration(40), "40 s");
        assert_eq!(duration(12 * 60 + 30), "12 min");
        assert_eq!(duration(3 * 3600 + 24 * 60), "3.4 h");
        assert_eq!(duration(30 * 3600), "30 h");
        assert_eq!(duration(60 * 3600), "2.5 days");
    }

    #[test]
    fn hours_read_as_people_say_them() {
        assert_eq!(hours(0.0), "0");
        assert_eq!(hours(0.2), "12 min");
        assert_eq!(hours(0.001), "< 1 min");
        assert_eq!(hours(3.44), "3.4 h");
        assert_eq!(hours(27.4), "27 h");
        assert_eq!(hours(f64::NAN), "0");
    }

    #[test]
    fn times_show_their_offset_and_how_long_ago() {
        let x = t("2026-12-03 13:05:00");
        assert_eq!(at(x, 3600), "2026-12-03 14:05 UTC+01:00");
        assert_eq!(at(x, -5 * 3600), "2026-12-03 08:05 UTC-05:00");
        assert_eq!(at(x, 0), "2026-12-03 13:05 UTC");
        assert_eq!(ago(x, t("2026-12-03 13:10:00")), "5 min ago");
        assert_eq!(ago(x, t("2026-12-03 13:05:03")), "just now");
        assert_eq!(ago(t("2026-12-03 13:15:00"), x), "in 10 min");
        assert_eq!(iso(x), "2026-12-03T13:05:00Z");
    }
}
