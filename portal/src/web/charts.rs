//! Charts drawn on the server as inline SVG: no chart library, no script, readable
//! without colour (each bar has a title with its number; the table beside it has them
//! all; a line chart carries its summary in words).

use super::human;
use crate::service::utilization::WeekUsage;
use crate::service::utilization::{Point, Utilization};
use chrono::NaiveDateTime;
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

/// Colours of the attempts' lines, in turn (each readable on white, AA for large marks).
const ATTEMPT_COLOURS: [&str; 4] = ["#0969da", "#8250df", "#1a7f37", "#bc4c00"];

/// The colour of the `i`-th attempt shown.
pub fn attempt_colour(i: usize) -> &'static str {
    ATTEMPT_COLOURS[i % ATTEMPT_COLOURS.len()]
}

/// Most points drawn per attempt: a longer series is averaged in this many runs of
/// neighbouring samples (its memory peaks kept).
const MAX_POINTS: usize = 240;

/// `points` thinned to at most `max`: (time, utilisation, memory in GB).
fn thin(points: &[Point], max: usize) -> Vec<Sample> {
    let per = points.len().div_ceil(max.max(1)).max(1);
    points
        .chunks(per)
        .map(|run| {
            let util = run.iter().map(|p| p.utilization_pct).sum::<f64>() / run.len() as f64;
            let mem = run.iter().map(|p| p.memory_used_mb).max().unwrap_or(0);
            (run[run.len() - 1].at, util, mem as f64 / 1024.0)
        })
        .collect()
}

/// A thinned sample: (time, utilisation, memory in GB).
type Sample = (NaiveDateTime, f64, f64);

/// Where the utilisation chart draws: its size, margins and time axis.
struct Frame {
    first: NaiveDateTime,
    span: f64,
    w: f64,
    h: f64,
    left: f64,
    right: f64,
}

impl Frame {
    fn plot_w(&self) -> f64 {
        self.w - self.left - self.right
    }

    fn x_of(&self, t: NaiveDateTime) -> f64 {
        self.left + self.plot_w() * (t - self.first).num_seconds() as f64 / self.span
    }
}

/// One panel of the chart: its top, height, axis maximum and unit, and a point's value.
struct Panel {
    top: f64,
    height: f64,
    max: f64,
    unit: &'static str,
    value: fn(&Sample) -> f64,
}

/// A job's GPU utilisation (percent, top) and memory used (GB, bottom) over time, one
/// line per attempt, each attempt's start marked; the time axis counts from the first
/// sample. `None` without samples (the page says "no samples yet" instead).
pub fn utilization_svg(u: &Utilization) -> Option<String> {
    let series: Vec<Vec<Sample>> = u
        .attempts
        .iter()
        .map(|a| thin(&a.samples, MAX_POINTS))
        .collect();
    let first = series.iter().flatten().map(|p| p.0).min()?;
    let last = series.iter().flatten().map(|p| p.0).max()?;
    let span = (last - first)
        .num_seconds()
        .max(u.sample_interval_s as i64)
        .max(1) as f64;
    let mem_max = nice_max(series.iter().flatten().map(|p| p.2).fold(0.0, f64::max));
    let frame = Frame {
        first,
        span,
        w: 640.0,
        h: 290.0,
        left: 44.0,
        right: 12.0,
    };
    let panels = [
        Panel {
            top: 22.0,
            height: 110.0,
            max: 100.0,
            unit: "%",
            value: |p| p.1,
        },
        Panel {
            top: 170.0,
            height: 90.0,
            max: mem_max,
            unit: "GB",
            value: |p| p.2,
        },
    ];
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" viewBox="0 0 {w} {h}" role="img" aria-labelledby="util-chart-title util-chart-desc" xmlns="http://www.w3.org/2000/svg"><title id="util-chart-title">GPU utilisation (percent) and GPU memory used (GB) of job-{job} over time, one line per attempt</title><desc id="util-chart-desc">{desc}</desc>"#,
        w = frame.w,
        h = frame.h,
        job = u.job,
        desc = escape(&u.summary.words()),
    );
    for panel in &panels {
        draw_panel(&mut s, &frame, panel, &series);
    }
    if series.len() > 1 {
        mark_attempts(&mut s, &frame, &series, u);
    }
    time_axis(&mut s, &frame);
    s.push_str("</svg>");
    Some(s)
}

/// A panel's title, grid and one line (or dot) per attempt.
fn draw_panel(s: &mut String, f: &Frame, p: &Panel, series: &[Vec<Sample>]) {
    let (left, top, ph, max) = (f.left, p.top, p.height, p.max);
    let _ = write!(
        s,
        r##"<text x="{left}" y="{y:.1}" font-size="11" fill="#57606a">{what}</text>"##,
        y = top - 8.0,
        what = if p.unit == "%" {
            "GPU utilisation, %"
        } else {
            "GPU memory used, GB"
        },
    );
    for i in 0..=2 {
        let v = max * i as f64 / 2.0;
        let y = top + ph - ph * i as f64 / 2.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{x2}" y1="{y:.1}" y2="{y:.1}" stroke="#d0d7de"/><text x="{tx:.1}" y="{ty:.1}" font-size="11" text-anchor="end" fill="#57606a">{v}</text>"##,
            x2 = f.w - f.right,
            tx = left - 4.0,
            ty = y + 4.0,
            v = axis_label(v),
        );
    }
    for (i, pts) in series.iter().enumerate() {
        let colour = attempt_colour(i);
        let y_of = |q: &Sample| top + ph - ph * ((p.value)(q) / max).min(1.0);
        if let [one] = pts.as_slice() {
            let _ = write!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#,
                x = f.x_of(one.0),
                y = y_of(one),
            );
        } else {
            let line: Vec<String> = pts
                .iter()
                .map(|q| format!("{:.1},{:.1}", f.x_of(q.0), y_of(q)))
                .collect();
            let _ = write!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
                line.join(" ")
            );
        }
    }
}

/// Where each later attempt began.
fn mark_attempts(s: &mut String, f: &Frame, series: &[Vec<Sample>], u: &Utilization) {
    for (i, pts) in series.iter().enumerate() {
        let (Some(p), Some(a)) = (pts.first(), u.attempts.get(i)) else {
            continue;
        };
        let x = f.x_of(p.0);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="14" y2="260" stroke="{c}" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{ty}" font-size="11" fill="{c}">attempt {n}</text>"##,
            c = attempt_colour(i),
            tx = x + 3.0,
            ty = 146.0 + 10.0 * (i % 2) as f64,
            n = a.attempt,
        );
    }
}

/// Five time labels from 0 to the span.
fn time_axis(s: &mut String, f: &Frame) {
    for i in 0..=4 {
        let x = f.left + f.plot_w() * i as f64 / 4.0;
        let secs = (f.span * i as f64 / 4.0).round() as i64;
        let label = if i == 0 {
            "0".to_string()
        } else {
            human::duration(secs)
        };
        let _ = write!(
            s,
            r##"<text x="{x:.1}" y="{y}" font-size="11" text-anchor="{anchor}" fill="#57606a">{label}</text>"##,
            y = f.h - 8.0,
            anchor = match i {
                0 => "start",
                4 => "end",
                _ => "middle",
            },
        );
    }
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

    /// GPUs at once against a limit of GPUs ("3 in use of 4").
    pub fn gpus(used_text: String, used: f64, limit: Option<f64>) -> UseBar {
        UseBar::new(used_text, used, limit, |l| format!("of {l:.0}"))
    }

    /// GPU-hours against a limit of GPU-hours ("12 h used of 40 h").
    pub fn hours(used_text: String, used: f64, limit: Option<f64>) -> UseBar {
        UseBar::new(used_text, used, limit, |l| format!("of {l} h"))
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
    fn utilisation_is_a_line_per_attempt_with_its_summary_and_long_runs_are_thinned() {
        use crate::service::utilization::{build, Utilization};
        let t0 = chrono::NaiveDate::from_ymd_opt(2026, 12, 8)
            .unwrap()
            .and_hms_opt(10, 0, 0)
            .unwrap();
        let sample = |attempt, min: i64, util: f64| crate::service::utilization::Sample {
            job_id: 7,
            attempt,
            at: t0 + chrono::Duration::minutes(min),
            utilization_pct: util,
            memory_used_mb: 2048,
        };
        let config = crate::config::UtilizationConfig::default();
        let empty = build(7, vec![], &Default::default(), &config);
        assert!(
            utilization_svg(&empty).is_none(),
            "no chart without samples"
        );
        let mut rows: Vec<_> = (0..1000).map(|m| sample(1, m, 50.0)).collect();
        rows.push(sample(2, 1200, 100.0));
        let u: Utilization = build(7, rows, &Default::default(), &config);
        let svg = utilization_svg(&u).unwrap();
        // Two panels: a line for attempt 1 in each, a dot for attempt 2's one sample.
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains(">attempt 2</text>"), "its start is marked");
        let points = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        // At most 240 points: 1,000 samples in runs of 5.
        assert_eq!(points.split(' ').count(), 200);
        assert!(
            svg.contains(
                "<desc id=\"util-chart-desc\">mean 50 %, peak 100 %, memory up to 2.0 GB</desc>"
            ),
            "{svg}"
        );
        assert!(
            svg.contains(">20 h</text>"),
            "the time axis in words: {svg}"
        );
        assert_eq!(thin(&[], 10), vec![]);
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
