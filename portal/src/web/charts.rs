//! Charts drawn on the server as inline SVG: no chart library, no script, readable
//! without colour (each bar has a title with its number; the table beside it has them
//! all).

use super::human;
use crate::db::usage::WeekUsage;
use std::fmt::Write;

/// The series of the usage chart: name, colour, value of a week.
type Series = (&'static str, &'static str, fn(&WeekUsage) -> f64);

const SERIES: [Series; 3] = [
    ("used", "#0969da", |w| w.used),
    ("of which borrowed", "#8250df", |w| w.borrowed),
    ("lent", "#1a7f37", |w| w.lent),
];

/// A round top for the axis at or above `max`: 1, 2 or 5 times a power of ten.
fn nice_max(max: f64) -> f64 {
    // At least one GPU-hour: a near-empty week does not fill the chart.
    if max <= 1.0 || !max.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * p)
}

/// Text made safe inside SVG markup.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A tick of the hours axis: "0", "2.5", "20".
fn axis_label(v: f64) -> String {
    if v.fract() == 0.0 || v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// GPU-hours by week (oldest on the left) as grouped bars: used, borrowed, lent.
pub fn usage_svg(weeks: &[WeekUsage]) -> String {
    let (w, h, left, bottom, top) = (640.0, 240.0, 44.0, 28.0, 12.0);
    let max = nice_max(
        weeks
            .iter()
            .flat_map(|wk| SERIES.iter().map(move |s| (s.2)(wk)))
            .fold(0.0, f64::max),
    );
    let plot_h = h - bottom - top;
    let n = weeks.len().max(1) as f64;
    let group = (w - left - 8.0) / n;
    let bar = (group - 10.0) / SERIES.len() as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" viewBox="0 0 {w} {h}" role="img" aria-labelledby="usage-chart-title" xmlns="http://www.w3.org/2000/svg"><title id="usage-chart-title">GPU-hours by week: used by the lab, of which borrowed, and lent to other labs</title>"#
    );
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let y = top + plot_h - plot_h * i as f64 / 4.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{w}" y1="{y:.1}" y2="{y:.1}" stroke="#d0d7de"/><text x="{x:.1}" y="{ty:.1}" font-size="11" text-anchor="end" fill="#57606a">{v}</text>"##,
            x = left - 4.0,
            ty = y + 4.0,
            v = axis_label(v)
        );
    }
    for (i, wk) in weeks.iter().rev().enumerate() {
        let x0 = left + 4.0 + group * i as f64;
        for (k, (name, colour, value)) in SERIES.iter().enumerate() {
            let v = value(wk);
            let bh = plot_h * v / max;
            let _ = write!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{bw:.1}" height="{bh:.1}" fill="{colour}"><title>week of {week}: {name} {hours}</title></rect>"#,
                x = x0 + 4.0 + bar * k as f64,
                y = top + plot_h - bh,
                bw = (bar - 2.0).max(1.0),
                week = wk.week.format("%d %b"),
                hours = escape(&human::hours(v)),
            );
        }
        let _ = write!(
            s,
            r##"<text x="{x:.1}" y="{y}" font-size="11" text-anchor="middle" fill="#57606a">{label}</text>"##,
            x = x0 + group / 2.0,
            y = h - 8.0,
            label = wk.week.format("%d %b"),
        );
    }
    s.push_str("</svg>");
    s
}

/// The legend's entries: (name, colour).
pub fn usage_legend() -> Vec<(&'static str, &'static str)> {
    SERIES.iter().map(|(n, c, _)| (*n, *c)).collect()
}

/// Use against a quota, as text and a bar.
pub(crate) struct UseBar {
    pub text: String,
    /// Width of the bar in percent; none without a limit.
    pub pct: Option<String>,
    pub over: bool,
}

impl UseBar {
    pub fn new(used_text: String, used: f64, limit: Option<f64>, of: fn(f64) -> String) -> UseBar {
        match limit {
            Some(l) => UseBar {
                text: format!("{used_text} {}", of(l)),
                pct: Some(format!(
                    "{:.0}",
                    if l > 0.0 { used / l * 100.0 } else { 100.0 }.clamp(0.0, 100.0)
                )),
                over: used > l,
            },
            None => UseBar {
                text: used_text,
                pct: None,
                over: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_bars_fill_to_the_limit_and_say_when_over() {
        let b = UseBar::new("3 in use".into(), 3.0, Some(4.0), |l| format!("of {l:.0}"));
        assert_eq!(
            (b.text.as_str(), b.pct.as_deref(), b.over),
            ("3 in use of 4", Some("75"), false)
        );
        let b = UseBar::new("6 in use".into(), 6.0, Some(4.0), |l| format!("of {l:.0}"));
        assert_eq!((b.pct.as_deref(), b.over), (Some("100"), true));
        assert!(UseBar::new("1 used".into(), 1.0, None, |_| String::new())
            .pct
            .is_none());
    }

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.2), 5.0);
        assert_eq!(nice_max(17.0), 20.0);
        assert_eq!(nice_max(100.0), 100.0);
        assert_eq!(nice_max(0.01), 1.0);
        assert_eq!(axis_label(0.25), "0.25");
        assert_eq!(axis_label(2.5), "2.5");
        assert_eq!(axis_label(20.0), "20");
    }

    #[test]
    fn each_week_has_a_bar_per_series_with_its_number() {
        let week = |d: &str, used| WeekUsage {
            week: chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap(),
            used,
            borrowed: 1.0,
            lent: 0.5,
        };
        let svg = usage_svg(&[week("2026-11-30", 3.4), week("2026-11-23", 12.0)]);
        assert_eq!(svg.matches("<rect").count(), 6);
        assert!(svg.contains("week of 30 Nov: used 3.4 h"), "{svg}");
        assert!(svg.contains("week of 23 Nov: lent 30 min"));
        let tiny = usage_svg(&[week("2026-11-30", 0.001)]);
        assert!(tiny.contains("used &lt; 1 min"), "text is escaped: {tiny}");
        // Oldest week on the left.
        assert!(svg.find(">23 Nov<").unwrap() < svg.find(">30 Nov<").unwrap());
    }
}
