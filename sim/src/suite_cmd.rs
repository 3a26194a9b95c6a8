//! `commons-sim suite`: the robustness suite from the command line (see
//! `commons_sim::suite`).

use crate::cli::SuiteArgs;
use anyhow::{Context, Result};
use commons_sim::suite::{
    run_suite, stats, CaseResult, Set, SuiteReport, SuiteSettings, SuiteSpec,
};
use commons_sim::{read_trace, PolicyKind};
use std::time::Instant;

pub fn run(args: &SuiteArgs) -> Result<()> {
    let mut spec = if args.tiny {
        SuiteSpec::tiny()
    } else if args.small {
        SuiteSpec::small()
    } else {
        SuiteSpec::full()
    };
    if let Some(n) = args.cases {
        spec.cases = n.min(spec.cases);
    }
    let settings = SuiteSettings {
        spec,
        set: match args.set.as_str() {
            "tuning" => Some(Set::Tuning),
            "test" => Some(Set::Test),
            _ => None,
        },
        policies: PolicyKind::parse_list(&args.policies)?,
        tuning: args.tuning.tuning(),
        checkpoints: args.checkpoints.model()?,
        tick_s: args.tick.max(0),
        window_per_lab: args.window.max(1),
        threads: args.threads.max(1),
        dump: args.dump.clone(),
    };
    let trace = read_trace(&args.trace, None)?;
    let reuse: Option<SuiteReport> = match &args.reuse {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Some(
                serde_json::from_str(&text)
                    .with_context(|| format!("{} is not a suite report", p.display()))?,
            )
        }
        None => None,
    };
    let started = Instant::now();
    let quiet = args.quiet;
    let names: Vec<String> = settings.policies.iter().map(|p| p.to_string()).collect();
    let done = |c: &CaseResult| {
        if !quiet {
            eprintln!("{}", case_line(c, &names));
        }
    };
    let report = run_suite(&trace, &settings, reuse.as_ref(), &done)?;
    if !quiet {
        eprintln!(
            "{} cases in {:.1} s wall",
            report.cases.len(),
            started.elapsed().as_secs_f64()
        );
    }
    let json = serde_json::to_string_pretty(&report)?;
    match args.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => println!("{json}"),
        Some(p) => std::fs::write(p, json + "\n")
            .with_context(|| format!("cannot write {}", p.display()))?,
        None => {}
    }
    if args.json.as_deref().is_none_or(|p| p.as_os_str() != "-") {
        print!("{}", stats::markdown(&report));
    }
    Ok(())
}

/// One line of progress: the case, then each evaluated policy's ratios.
fn case_line(c: &CaseResult, policies: &[String]) -> String {
    let i = &c.info;
    let mut line = format!(
        "case {:>2} ({}, {}, {} labs/{} borrow-only, {} GPUs, {} jobs, load {:.2}): {:.1} s",
        i.seed, i.set, i.window, i.labs, i.borrow_only_labs, i.gpus, i.jobs, i.load, c.wall_s
    );
    for p in policies {
        line += &format!("\n    {p}:");
        for r in &stats::RATIOS {
            line += &format!(" {} {}", r.name, stats::cell(stats::value(c, p, r.name)));
        }
    }
    line
}
