//! Command-line interface of `commons-sim` (clap).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Trace-driven simulator of GPU Commons over the real scheduler.
#[derive(Debug, Parser)]
#[command(name = "commons-sim", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay a trace under several policies and compare them.
    Replay(Box<ReplayArgs>),
    /// Validate a campus file and print its labs.
    CheckCampus {
        /// The campus TOML file.
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Job trace CSV (job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,vc,src_row).
    #[arg(long)]
    pub trace: PathBuf,
    /// Campus TOML file (labs, tenants, nodes, grace, checkpoints, departures).
    #[arg(long)]
    pub campus: PathBuf,
    /// Comma-separated policies: isolated, share-fifo, share-backfill, share-fairshare,
    /// commons, commons-old, commons-nockpt (default), old+place, old+victims,
    /// old+hysteresis, old+patience, old+elsewhere, old+stopckpt, commons-boost.
    #[arg(
        long,
        default_value = "isolated,share-fifo,share-backfill,share-fairshare,commons,commons-old,commons-nockpt"
    )]
    pub policies: String,
    /// Write the figures as JSON to this file ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an HTML report with SVG plots into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Replay only the first N jobs of the trace (of the window, with --from-s/--until-s).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Replay only the jobs submitted at or after this many seconds (the trace's
    /// `submit_time_s`; times are not shifted, and earlier jobs are left out altogether).
    #[arg(long)]
    pub from_s: Option<i64>,
    /// Replay only the jobs submitted before this many seconds (`submit_time_s`).
    #[arg(long)]
    pub until_s: Option<i64>,
    /// Seed of the random departures.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Add N random node departures (drain within the grace period, back after 1-24 h).
    #[arg(long, default_value_t = 0)]
    pub random_departures: u32,
    /// Queued jobs per lab shown to the scheduler in one call (besides the head of the
    /// campus-wide queue).
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Seconds between runs of the scheduler loop (0: plan at the instant of every change).
    #[arg(long, default_value_t = 30)]
    pub tick: i64,
    /// Users' time limits: "exact" (each job's true run time) or "overestimate" (the
    /// run time times a random factor, see --limit-seed).
    #[arg(long, default_value = "exact", value_parser = ["exact", "overestimate"])]
    pub limits: String,
    /// Seed of the overestimated time limits.
    #[arg(long, default_value_t = 1)]
    pub limit_seed: u64,
    /// Re-lending hysteresis delay in seconds for the policies with the hysteresis on
    /// (default: `sched`'s, 3600).
    #[arg(long)]
    pub relend_delay_s: Option<i64>,
    /// Take-backs per hour from which the hysteresis holds a GPU back (default:
    /// `sched`'s, 0.02).
    #[arg(long)]
    pub relend_min_rate: Option<f64>,
    /// Width of a return-risk class in expected take-backs, for the policies with
    /// return-risk placement (default: `sched`'s, 0.1).
    #[arg(long)]
    pub return_risk_step: Option<f64>,
    /// Expected take-backs from which a guest already taken back does not borrow a
    /// node, for `commons`, `commons-nockpt` and `commons-boost` (default: `sched`'s,
    /// 0.1; 0 turns the rule off).
    #[arg(long)]
    pub taken_back_max_risk: Option<f64>,
    /// Seconds after its last take-back during which that rule holds for a job
    /// (default: `sched`'s, 43200).
    #[arg(long)]
    pub taken_back_patience_s: Option<i64>,
    /// Policies simulated at once, each on a thread (the figures do not depend on it).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}
