//! The plot of an openb replay: unallocated GPUs against the arrived GPU demand, one
//! line per policy (SVG through plotters, text left to the browser).

use crate::openb::OpenbSummary;
use plotters::prelude::*;
use std::io;

/// Where the x axis starts (below it every rule allocates everything that arrived).
const FROM_PERCENT: f64 = 80.0;

fn plot_err<E: std::fmt::Display>(e: E) -> io::Error {
    io::Error::other(format!("plotting failed: {e}"))
}

fn color(policy: &str) -> RGBColor {
    match policy {
        "best-fit" => RGBColor(214, 96, 0),
        "fgd" => RGBColor(120, 120, 120),
        _ => RGBColor(0, 90, 200),
    }
}

/// The SVG of the curves of `s`: x is the arrived GPU demand as a share of capacity
/// (%, from [`FROM_PERCENT`]), y the unallocated GPUs.
pub fn curve_svg(s: &OpenbSummary) -> io::Result<String> {
    let gpus = s.gpus.max(1) as f64;
    let series: Vec<(&str, Vec<(f64, f64)>)> = s
        .policies
        .iter()
        .map(|(name, o)| {
            let points = o
                .curve
                .iter()
                .map(|p| (100.0 * p.arrived_gpus / gpus, p.unallocated_gpus))
                .filter(|(x, _)| *x >= FROM_PERCENT)
                .collect();
            (name.as_str(), points)
        })
        .collect();
    let top = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(1.0f64, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(FROM_PERCENT..101f64, 0f64..top * 1.05)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("arrived GPU demand, % of capacity")
            .y_desc("unallocated GPUs")
            .draw()
            .map_err(plot_err)?;
        for (name, points) in series {
            let c = color(name);
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(plot_err)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg + "\n")
}
