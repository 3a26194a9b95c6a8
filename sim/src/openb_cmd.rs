//! `commons-sim replay --trace-format openb`: the Alibaba GPU-sharing trace packed under
//! the share placement rules, with a table on stderr and the figures as JSON.

use crate::cli::ReplayArgs;
use anyhow::{bail, Context, Result};
use commons_sched::share::{SharePolicy, ShareTuning};
use commons_sim::openb::{self, NodeSample, OpenbSummary, Order};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where the default openb files live, relative to the repository root.
const DEFAULT_PODS: &str = "../shared/traces/alibaba_openb_pod_list_default.csv";
const DEFAULT_NODES: &str = "../shared/traces/alibaba_openb_node_list_gpu_node.csv";

pub fn run(args: &ReplayArgs) -> Result<()> {
    if args.campus.is_some() {
        bail!("--campus is for philly replays; an openb replay takes --nodes");
    }
    let policies = parse_policies(args.policies.as_deref().unwrap_or("best-fit,fgd,commons"))?;
    let trace = path_or_default(args.trace.as_ref(), DEFAULT_PODS, "--trace")?;
    let nodes_file = path_or_default(args.nodes.as_ref(), DEFAULT_NODES, "--nodes")?;
    let mut tasks = openb::read_pods(&trace)?;
    let mut nodes = openb::read_nodes(&nodes_file)?;
    let mut sample = None;
    if let Some(n) = args.sample_nodes {
        nodes = openb::sample_nodes(&nodes, n, args.node_seed).with_context(|| {
            format!(
                "--sample-nodes {n}: {} has {} servers; draw 1 to that many",
                nodes_file.display(),
                nodes.len()
            )
        })?;
        let listed = tasks.len();
        tasks = openb::hostable(&nodes, tasks);
        if tasks.is_empty() {
            bail!(
                "--sample-nodes {n} --node-seed {}: no task of the list fits any drawn server",
                args.node_seed
            );
        }
        sample = Some(NodeSample {
            servers: n,
            seed: args.node_seed,
            tasks_left_out: listed - tasks.len(),
        });
    }
    let order = args.seed.map_or(Order::File, Order::Seeded);
    let default = ShareTuning::default();
    let tuning = ShareTuning {
        mix_window: args.share_mix_window.unwrap_or(default.mix_window),
        mix_classes: args.share_mix_classes.unwrap_or(default.mix_classes),
        whole_weight: args.share_whole_weight.unwrap_or(default.whole_weight),
        cpu_aware: args.share_cpu_aware.unwrap_or(default.cpu_aware),
        fgd_mix_window: default.fgd_mix_window,
        long_weight: args.share_long_weight.unwrap_or(default.long_weight),
        wide_prior: args.share_wide_prior.unwrap_or(default.wide_prior),
        scarcity: args.share_scarcity.unwrap_or(default.scarcity),
        demand_power: args.share_demand_power.unwrap_or(default.demand_power),
        wide_reserve: args.share_wide_reserve.unwrap_or(default.wide_reserve),
        prior_reserve: args.share_prior_reserve.unwrap_or(default.prior_reserve),
        prior_floor: args.share_prior_floor.unwrap_or(default.prior_floor),
    };
    let gpus: u64 = nodes.iter().map(|n| n.gpus.len() as u64).sum();
    if !args.quiet {
        eprintln!(
            "packing {} tasks ({:?} order) onto {} nodes with {gpus} GPUs",
            tasks.len(),
            order,
            nodes.len()
        );
        if let Some(s) = &sample {
            eprintln!(
                "  {} servers drawn by --node-seed {}; {} tasks no drawn server could host left out",
                s.servers, s.seed, s.tasks_left_out
            );
        }
    }
    let started = Instant::now();
    let results = openb::replay_openb_all(&nodes, &tasks, order, &policies, &tuning);
    let ratio = match (results.get("commons"), results.get("best-fit")) {
        (Some(c), Some(b)) if b.unallocated_gpus_at_full > 0.0 => {
            Some(c.unallocated_gpus_at_full / b.unallocated_gpus_at_full)
        }
        _ => None,
    };
    let summary = OpenbSummary {
        trace_format: "openb",
        trace: trace.display().to_string(),
        nodes_file: nodes_file.display().to_string(),
        nodes: nodes.len(),
        sample,
        gpus,
        tasks_in_trace: tasks.len(),
        order,
        tuning,
        policies: results,
        commons_to_best_fit_unallocated: ratio,
    };
    if !args.quiet {
        eprintln!(
            "{} policies in {:.1} s",
            policies.len(),
            started.elapsed().as_secs_f64()
        );
        print_table(&summary);
    }
    let json = serde_json::to_string_pretty(&summary)?;
    match args.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => println!("{json}"),
        Some(p) => std::fs::write(p, json + "\n")
            .with_context(|| format!("cannot write {}", p.display()))?,
        None => {}
    }
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("openb-unallocated.svg");
        std::fs::write(&path, commons_sim::openb_plot::curve_svg(&summary)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if !args.quiet {
            eprintln!("plot: {}", path.display());
        }
    }
    Ok(())
}

fn parse_policies(list: &str) -> Result<Vec<SharePolicy>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            SharePolicy::from_name(name).with_context(|| {
                format!("unknown openb policy \"{name}\" (known: best-fit, fgd, commons)")
            })
        })
        .collect()
}

fn path_or_default(given: Option<&PathBuf>, default: &str, flag: &str) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p.clone()),
        None if Path::new(default).exists() => Ok(PathBuf::from(default)),
        None => bail!("{default} is not here: give {flag} (the openb files are in ../shared/traces/ next to the repository)"),
    }
}

fn print_table(s: &OpenbSummary) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{:<10} {:>10} {:>12} {:>8} {:>8} {:>10} {:>8}",
        "policy", "gpu_alloc", "unalloc_gpus", "cpu", "arrived", "failed", "fail_gpus"
    );
    for (name, o) in &s.policies {
        let _ = writeln!(
            err,
            "{:<10} {:>10.4} {:>12.1} {:>8.3} {:>8} {:>10} {:>8.1}",
            name,
            o.gpu_allocation_rate_at_full,
            o.unallocated_gpus_at_full,
            o.cpu_allocation_rate_at_full,
            o.tasks_arrived,
            o.tasks_failed,
            o.failed_gpus
        );
    }
    if let Some(r) = s.commons_to_best_fit_unallocated {
        let _ = writeln!(
            err,
            "commons / best-fit unallocated GPUs at full: {r:.3} (target <= 0.75: {})",
            if r <= 0.75 { "met" } else { "NOT met" }
        );
    }
}
