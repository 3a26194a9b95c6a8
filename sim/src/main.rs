//! `commons-sim`: the command-line front of the simulator library.

mod cli;
mod openb_cmd;
mod suite_cmd;

use anyhow::{Context, Result};
use clap::Parser;
use cli::{Cli, Command, ReplayArgs, PHILLY_POLICIES};
use commons_sim::{read_trace, replay, Campus, CampusFile, PolicyKind, ReplaySettings, Workload};
use std::io::Write;
use std::time::Instant;

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Replay(args) => run_replay(*args),
        Command::Suite(args) => suite_cmd::run(&args),
        Command::CheckCampus { file } => {
            let campus = CampusFile::read(&file)?.build()?;
            println!(
                "{}: {} labs, {} nodes, {} GPUs",
                file.display(),
                campus.labs.len(),
                campus.nodes.len(),
                campus.total_gpus()
            );
            for (i, lab) in campus.labs.iter().enumerate() {
                let nodes: Vec<_> = campus.nodes.iter().filter(|n| n.lab == i).collect();
                let gpus: u32 = nodes.iter().map(|n| n.gpus).sum();
                println!(
                    "  {:<12} {:>3} nodes {:>4} GPUs  tenants {}",
                    lab.name,
                    nodes.len(),
                    gpus,
                    lab.tenants.join(",")
                );
            }
            Ok(())
        }
    }
}

fn run_replay(args: ReplayArgs) -> Result<()> {
    if args.trace_format == "openb" {
        return openb_cmd::run(&args);
    }
    let (campus, work, settings) = prepare(&args)?;
    let span = (work.span.1 - work.span.0).max(1) as f64;
    let quiet = args.quiet;
    if !quiet {
        eprintln!(
            "replaying {} jobs ({} capped to one node) over {:.1} days on {} GPUs",
            work.jobs.len(),
            work.capped,
            span / 86_400.0,
            campus.total_gpus()
        );
    }
    let started = Instant::now();
    // With policies on threads their progress interleaves: no per-policy times then.
    let threaded = settings.threads > 1 && settings.policies.len() > 1;
    let mut progress = Progress::new(quiet, threaded, work.span.0, span);
    let result = replay(&campus, &work, &settings, &mut |p, t| progress.report(p, t))?;
    progress.finish();
    let wall = started.elapsed().as_secs_f64();
    let simulated: i64 = result
        .outputs
        .iter()
        .map(|o| o.end_time - work.span.0)
        .sum();
    if !quiet {
        eprintln!(
            "{} policies in {wall:.1} s wall; simulated/wall = {:.0}x",
            result.outputs.len(),
            simulated as f64 / wall.max(1e-9)
        );
        print_table(&result.summary);
    }
    write_outputs(&args, &work, &result, wall)
}

/// The campus, the workload and the settings a replay's arguments ask for.
fn prepare(args: &ReplayArgs) -> Result<(Campus, Workload, ReplaySettings)> {
    let policies = PolicyKind::parse_list(args.policies.as_deref().unwrap_or(PHILLY_POLICIES))?;
    let (Some(trace), Some(campus)) = (&args.trace, &args.campus) else {
        anyhow::bail!("a philly replay needs --trace and --campus");
    };
    let campus = CampusFile::read(campus)?.build()?;
    let windowed = args.from_s.is_some() || args.until_s.is_some();
    let mut trace = read_trace(trace, args.limit.filter(|_| !windowed))?;
    if windowed {
        trace = commons_sim::trace::submitted_within(trace, args.from_s, args.until_s)?;
        trace.truncate(args.limit.unwrap_or(usize::MAX));
    }
    let work = Workload::new(&trace, &campus)?;
    let settings = ReplaySettings {
        policies,
        window_per_lab: args.window.max(1),
        seed: args.seed.unwrap_or(1),
        random_departures: args.random_departures,
        tick_s: args.tick.max(0),
        limit_seed: (args.limits == "overestimate").then_some(args.limit_seed),
        threads: args.threads.max(1),
        tuning: args.tuning.tuning(),
        checkpoints: args.checkpoints.model()?,
    };
    Ok((campus, work, settings))
}

/// Progress of a replay on stderr: each policy's virtual day every two seconds, and
/// its time when it is done (not when policies run on threads: they interleave).
struct Progress {
    quiet: bool,
    threaded: bool,
    first: i64,
    span: f64,
    last_print: Instant,
    current: Option<PolicyKind>,
    policy_start: Instant,
}

impl Progress {
    fn new(quiet: bool, threaded: bool, first: i64, span: f64) -> Progress {
        Progress {
            quiet,
            threaded,
            first,
            span,
            last_print: Instant::now(),
            current: None,
            policy_start: Instant::now(),
        }
    }

    fn report(&mut self, p: PolicyKind, t: i64) {
        if self.current != Some(p) && !self.threaded {
            if let (Some(prev), false) = (self.current, self.quiet) {
                eprintln!(
                    "  {prev}: done in {:.1} s",
                    self.policy_start.elapsed().as_secs_f64()
                );
            }
            self.current = Some(p);
            self.policy_start = Instant::now();
        }
        if !self.quiet && self.last_print.elapsed().as_secs_f64() >= 2.0 {
            self.last_print = Instant::now();
            let day = (t - self.first) as f64 / 86_400.0;
            eprintln!(
                "  {p}: day {day:.1} ({:.0}% of the span), {:.1} s",
                100.0 * (t - self.first) as f64 / self.span,
                self.policy_start.elapsed().as_secs_f64()
            );
        }
    }

    fn finish(&self) {
        if let (Some(last), false) = (self.current.filter(|_| !self.threaded), self.quiet) {
            eprintln!(
                "  {last}: done in {:.1} s",
                self.policy_start.elapsed().as_secs_f64()
            );
        }
    }
}

/// The JSON (`--json`) and the HTML report (`--report`) a replay asked for.
fn write_outputs(
    args: &ReplayArgs,
    work: &Workload,
    result: &commons_sim::Replay,
    wall: f64,
) -> Result<()> {
    let json = serde_json::to_string_pretty(&result.summary)?;
    match args.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => println!("{json}"),
        Some(p) => std::fs::write(p, json + "\n")
            .with_context(|| format!("cannot write {}", p.display()))?,
        None => {}
    }
    if let Some(dir) = &args.report {
        let path = commons_sim::report::write(dir, work, result, wall)
            .with_context(|| format!("cannot write the report into {}", dir.display()))?;
        if !args.quiet {
            eprintln!("report: {}", path.display());
        }
    }
    Ok(())
}

fn print_table(s: &commons_sim::RunSummary) {
    let mut err = std::io::stderr().lock();
    let opt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.0}"));
    let _ = writeln!(
        err,
        "{:<15} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>5} {:>8} {:>6}",
        "policy",
        "util",
        "goodput",
        "jct_mean",
        "jct_p95",
        "wait_mean",
        "own_wait",
        "int_wait",
        "int_p95",
        "preempt",
        "lost_gpuh",
        "worse",
        "est_med",
        "est_2x"
    );
    for (name, m) in &s.policies {
        let _ = writeln!(
            err,
            "{:<15} {:>6.3} {:>7.3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9.1} {:>5} {:>8} {:>6}",
            name,
            m.utilization,
            m.goodput,
            opt(m.jct_mean_s),
            opt(m.jct_p95_s),
            opt(m.wait_mean_s),
            opt(m.owner_wait_mean_s),
            opt(m.interactive_wait_mean_s),
            opt(m.interactive_wait_p95_s),
            m.preemptions,
            m.lost_gpu_hours,
            m.labs_worse_off.map_or("-".into(), |n| n.to_string()),
            opt(m.estimate_abs_error_median_s),
            m.estimate_within_2x
                .map_or("-".into(), |v| format!("{v:.3}"))
        );
    }
    for t in &s.targets {
        let _ = writeln!(
            err,
            "target {:<42} {:>10} limit {:>6}  {}",
            t.name,
            t.value.map_or("-".into(), |v| format!("{v:.3}")),
            t.limit,
            if t.met { "met" } else { "NOT met" }
        );
    }
}
