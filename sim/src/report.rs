//! The HTML report of a replay: one self-contained `index.html` with the figures as
//! tables and four inline SVG plots drawn with plotters (SVG backend, no font
//! libraries: text is left to the browser):
//! 1. utilisation over time per policy (daily mean of the hourly busy share);
//! 2. CDF of job completion time; 3. CDF of waiting time (log time axes);
//! 4. owner waits per lab against the same lab's under `isolated`.
//!
//! The plots sample each CDF at a few hundred points so the page stays small.

use crate::accounting::BUCKET_S;
use crate::metrics::Samples;
use crate::policy::PolicyKind;
use crate::replay::Replay;
use crate::trace::Workload;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (860, 420);

fn color(p: PolicyKind) -> RGBColor {
    match p {
        PolicyKind::Isolated => RGBColor(120, 120, 120),
        PolicyKind::ShareFifo => RGBColor(214, 96, 0),
        PolicyKind::Commons => RGBColor(0, 90, 200),
        PolicyKind::CommonsNoCkpt => RGBColor(0, 160, 80),
        PolicyKind::CommonsBoost => RGBColor(150, 40, 170),
        PolicyKind::ShareBackfill => RGBColor(200, 160, 0),
        PolicyKind::ShareFairshare => RGBColor(200, 30, 30),
        PolicyKind::CommonsOld => RGBColor(110, 170, 240),
        PolicyKind::OldPlace => RGBColor(60, 200, 200),
        PolicyKind::OldVictims => RGBColor(90, 90, 200),
        PolicyKind::OldHysteresis => RGBColor(160, 110, 60),
        PolicyKind::OldStopCkpt => RGBColor(230, 120, 180),
        PolicyKind::OldElsewhere => RGBColor(120, 200, 80),
        PolicyKind::OldPatience => RGBColor(250, 180, 60),
        PolicyKind::OldSaves => RGBColor(90, 140, 90),
    }
}

/// The policies the plots show: all but the one-knob variants (`old+...`), which only
/// the tables list (thirteen lines would hide the ones that matter).
fn plotted(replay: &Replay) -> impl Iterator<Item = &crate::SimOutput> {
    replay
        .outputs
        .iter()
        .filter(|o| !o.policy.name().starts_with("old+"))
}

fn plot_err<E: std::fmt::Display>(e: E) -> io::Error {
    io::Error::other(format!("plotting failed: {e}"))
}

/// Write `index.html` into `dir` (created if missing) and return its path.
pub fn write(dir: &Path, work: &Workload, replay: &Replay, wall_s: f64) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let html = render(work, replay, wall_s)?;
    let path = dir.join("index.html");
    std::fs::write(&path, html)?;
    Ok(path)
}

/// The whole page.
pub fn render(work: &Workload, replay: &Replay, wall_s: f64) -> io::Result<String> {
    let mut h = header(work, replay, wall_s);
    h += &figures_table(&replay.summary);
    h += &targets_table(&replay.summary);
    h += &per_lab_table(replay);
    h += "<h2>Utilisation over time</h2>\n";
    h += &utilization_plot(work, replay)?;
    let samples: Vec<(PolicyKind, Samples)> = plotted(replay)
        .map(|o| (o.policy, Samples::new(work, o)))
        .collect();
    h += "<h2>Job completion time</h2>\n";
    h += &cdf_plot("CDF of job completion time", &samples, |s| &s.jct)?;
    h += "<h2>Waiting time</h2>\n";
    h += &cdf_plot(
        "CDF of waiting time (first start - submission)",
        &samples,
        |s| &s.wait,
    )?;
    h += "<h2>Owner waits against isolated</h2>\n<p>Each point is a lab: its mean wait for jobs that ran on its own GPUs, under a policy (y) and under <code>isolated</code> (x). Below the diagonal the lab's owners wait less than alone.</p>\n";
    h += &owner_plot(replay)?;
    h += "</body></html>\n";
    Ok(h)
}

/// The page's head and its first paragraph: the workload, the campus, the speed.
fn header(work: &Workload, replay: &Replay, wall_s: f64) -> String {
    let s = &replay.summary;
    let mut h = String::new();
    let simulated: i64 = replay
        .outputs
        .iter()
        .map(|o| o.end_time - work.span.0)
        .sum();
    let _ = write!(
        h,
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>commons-sim replay</title>\n\
         <style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}\
         th:first-child,td:first-child{{text-align:left}}</style></head><body>\n\
         <h1>GPU Commons: trace replay</h1>\n<p>{} jobs ({} capped to one node) over {:.1} days; \
         campus of {} labs, {} nodes, {} GPUs; grace {} s; checkpoints {}; {} departures. \
         Wall time {:.1} s, simulated/wall {:.0}x.</p>\n",
        s.jobs,
        s.capped_jobs,
        s.span_s as f64 / 86_400.0,
        s.campus.labs,
        s.campus.nodes,
        s.campus.gpus,
        s.campus.grace_seconds,
        s.campus
            .checkpoint_interval_minutes
            .map_or("none".to_string(), |m| format!("every {m} min")),
        s.campus.departures,
        wall_s,
        simulated as f64 / wall_s.max(1e-9),
    );
    h
}

/// Every policy's figures, one row each.
fn figures_table(s: &crate::replay::RunSummary) -> String {
    let mut h = String::new();
    h += "<h2>Figures</h2>\n<table><tr><th>policy</th><th>utilization</th><th>goodput</th>\
          <th>JCT mean (h)</th><th>JCT p95 (h)</th><th>wait mean (h)</th><th>owner wait mean (h)</th>\
          <th>interactive wait mean (h)</th><th>interactive wait p95 (h)</th>\
          <th>batch wait mean (h)</th><th>batch wait p95 (h)</th><th>preemptions</th><th>lost GPU-h</th><th>labs worse off</th><th>completed</th></tr>\n";
    let hours = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.2}", v / 3600.0));
    for (name, m) in &s.policies {
        let _ = writeln!(
            h,
            "<tr><td>{name}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td></tr>",
            m.utilization,
            m.goodput,
            hours(m.jct_mean_s),
            hours(m.jct_p95_s),
            hours(m.wait_mean_s),
            hours(m.owner_wait_mean_s),
            hours(m.interactive_wait_mean_s),
            hours(m.interactive_wait_p95_s),
            hours(m.batch_wait_mean_s),
            hours(m.batch_wait_p95_s),
            m.preemptions,
            m.lost_gpu_hours,
            m.labs_worse_off.map_or("-".into(), |n| n.to_string()),
            m.completed_jobs
        );
    }
    h += "</table>\n";
    h
}

/// The targets for `commons`.
fn targets_table(s: &crate::replay::RunSummary) -> String {
    let mut h = String::new();
    h += "<h2>Targets (commons against each baseline)</h2>\n<table><tr><th>target</th><th>value</th><th>limit</th><th>met</th></tr>\n";
    for t in &s.targets {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.name,
            t.value.map_or("-".into(), |v| format!("{v:.3}")),
            t.limit,
            if t.met { "yes" } else { "no" }
        );
    }
    h += "</table>\n";
    h
}

/// Mean JCT and owner wait of every lab under every policy, in hours.
fn per_lab_table(replay: &Replay) -> String {
    let policies = &replay.summary.policies;
    let mut h = String::from(
        "<h2>Per lab</h2>\n<p>Mean JCT / mean owner wait in hours; jobs in brackets.</p>\n<table><tr><th>lab</th>",
    );
    for name in policies.keys() {
        let _ = write!(h, "<th>{name}</th>");
    }
    h += "</tr>\n";
    let hours = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.2}", v / 3600.0));
    for lab in &replay.campus.labs {
        let jobs = policies
            .values()
            .next()
            .and_then(|m| m.per_lab.get(&lab.name))
            .map_or(0, |l| l.jobs);
        let _ = write!(h, "<tr><td>{} ({jobs})</td>", lab.name);
        for m in policies.values() {
            let l = m.per_lab.get(&lab.name);
            let _ = write!(
                h,
                "<td>{} / {}</td>",
                hours(l.and_then(|l| l.jct_mean_s)),
                hours(l.and_then(|l| l.owner_wait_mean_s))
            );
        }
        h += "</tr>\n";
    }
    h + "</table>\n"
}

fn utilization_plot(work: &Workload, replay: &Replay) -> io::Result<String> {
    let gpus = replay.campus.total_gpus().max(1) as f64;
    let per_day = (86_400 / BUCKET_S) as usize;
    let days = ((work.span.1 - work.span.0) as f64 / 86_400.0).max(1.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..days, 0f64..1f64)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("day of the trace")
            .y_desc("busy GPUs / campus GPUs (daily mean)")
            .draw()
            .map_err(plot_err)?;
        for o in plotted(replay) {
            let hourly = &o.accounting.hourly;
            let points: Vec<(f64, f64)> = hourly
                .chunks(per_day)
                .enumerate()
                .map(|(d, c)| {
                    let busy: f64 = c.iter().sum();
                    (
                        d as f64 + 0.5,
                        busy / (gpus * (c.len() as i64 * BUCKET_S) as f64),
                    )
                })
                .collect();
            let c = color(o.policy);
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(plot_err)?
                .label(o.policy.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg + "\n")
}

/// Seconds as a short label: "30s", "17m", "2.5h", "12d".
fn human(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.0}s")
    } else if s < 3_600.0 {
        format!("{:.0}m", s / 60.0)
    } else if s < 86_400.0 {
        format!("{:.1}h", s / 3_600.0)
    } else {
        format!("{:.1}d", s / 86_400.0)
    }
}

/// Fraction of `sorted` at or below `x`.
fn cdf_at(sorted: &[f64], x: f64) -> f64 {
    sorted.partition_point(|v| *v <= x) as f64 / sorted.len().max(1) as f64
}

fn cdf_plot(
    title: &str,
    samples: &[(PolicyKind, Samples)],
    pick: impl Fn(&Samples) -> &Vec<f64>,
) -> io::Result<String> {
    let max = samples
        .iter()
        .filter_map(|(_, s)| pick(s).last().copied())
        .fold(10.0f64, f64::max)
        * 1.2;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d((1f64..max).log_scale(), 0f64..1f64)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("time (log scale; 0 drawn at 1 s)")
            .x_label_formatter(&|v| human(*v))
            .y_desc("fraction of completed jobs")
            .draw()
            .map_err(plot_err)?;
        let steps = 300;
        for (p, s) in samples {
            let v = pick(s);
            let points: Vec<(f64, f64)> = (0..=steps)
                .map(|i| {
                    let x = max.powf(i as f64 / steps as f64);
                    (x, cdf_at(v, x))
                })
                .collect();
            let c = color(*p);
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(plot_err)?
                .label(p.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg + "\n")
}

fn owner_plot(replay: &Replay) -> io::Result<String> {
    let policies = &replay.summary.policies;
    let Some(iso) = policies.get(PolicyKind::Isolated.name()) else {
        return Ok("<p>(isolated was not simulated)</p>\n".into());
    };
    let mut points: Vec<(PolicyKind, f64, f64)> = Vec::new();
    for o in plotted(replay) {
        let m = &policies[o.policy.name()];
        for (lab, l) in &m.per_lab {
            let base = iso.per_lab.get(lab).and_then(|b| b.owner_wait_mean_s);
            if let (Some(x), Some(y)) = (base, l.owner_wait_mean_s) {
                points.push((o.policy, x.max(1.0), y.max(1.0)));
            }
        }
    }
    let max = points.iter().fold(10.0f64, |m, p| m.max(p.1).max(p.2)) * 1.5;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (SIZE.1 + 200, SIZE.1 + 40)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d((1f64..max).log_scale(), (1f64..max).log_scale())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("owner wait under isolated (mean per lab)")
            .y_desc("owner wait under the policy")
            .x_label_formatter(&|v| human(*v))
            .y_label_formatter(&|v| human(*v))
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                vec![(1.0, 1.0), (max, max)],
                BLACK.mix(0.4),
            ))
            .map_err(plot_err)?;
        for o in plotted(replay) {
            let c = color(o.policy);
            let mine: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.0 == o.policy)
                .map(|p| (p.1, p.2))
                .collect();
            chart
                .draw_series(mine.into_iter().map(|xy| Circle::new(xy, 4, c.filled())))
                .map_err(plot_err)?
                .label(o.policy.name())
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg + "\n")
}
