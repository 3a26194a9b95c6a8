//! Command-line interface of `commons-sim` (clap).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// The philly replay's policies when `--policies` is not given.
pub const PHILLY_POLICIES: &str =
    "isolated,share-fifo,share-backfill,share-fairshare,commons,commons-old,commons-nockpt";

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
    /// Run policies over the robustness suite (generated campuses, windows of the
    /// trace) and report the distribution of each ratio against the baselines.
    Suite(Box<SuiteArgs>),
    /// Validate a campus file and print its labs.
    CheckCampus {
        /// The campus TOML file.
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The trace's format: "philly" (a job trace replayed in time on a campus file) or
    /// "openb" (the Alibaba GPU-sharing task list replayed for packing on a node list;
    /// see `--nodes`).
    #[arg(long, default_value = "philly", value_parser = ["philly", "openb"])]
    pub trace_format: String,
    /// Job trace CSV (philly: job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,
    /// vc,src_row; openb: the pods list, by default
    /// ../shared/traces/alibaba_openb_pod_list_default.csv).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Campus TOML file (labs, tenants, nodes, grace, checkpoints, departures); philly
    /// only, required there.
    #[arg(long)]
    pub campus: Option<PathBuf>,
    /// Node list CSV (sn,cpu_milli,memory_mib,gpu,model); openb only, by default
    /// ../shared/traces/alibaba_openb_node_list_gpu_node.csv.
    #[arg(long)]
    pub nodes: Option<PathBuf>,
    /// Comma-separated policies. philly: isolated, share-fifo, share-backfill,
    /// share-fairshare, commons, commons-old, commons-nockpt (default: these seven),
    /// old+place, old+victims, old+hysteresis, old+patience, old+elsewhere,
    /// old+stopckpt, commons-boost. openb: best-fit, fgd, commons (default: all three).
    #[arg(long, alias = "policy")]
    pub policies: Option<String>,
    /// Write the figures as JSON to this file ("-" or no value: stdout).
    #[arg(long, num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Write an HTML report with SVG plots into this directory (openb: the plot
    /// `openb-unallocated.svg`, unallocated GPUs against the arrived demand).
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
    /// Seed of the random departures (philly, default 1); openb: tasks arrive in a
    /// re-ordering drawn from this seed instead of file order.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Add N random node departures (drain within the grace period, back after 1-24 h).
    #[arg(long, default_value_t = 0)]
    pub random_departures: u32,
    /// openb: GPU requests remembered in the recent mix the fragmentation rules measure
    /// against (default: `sched`'s).
    #[arg(long)]
    pub share_mix_window: Option<usize>,
    /// openb: the most frequent request shapes of the mix that count (default: `sched`'s).
    #[arg(long)]
    pub share_mix_classes: Option<usize>,
    /// openb: weight of whole-GPU shapes in `commons`' fragment (default: `sched`'s).
    #[arg(long)]
    pub share_whole_weight: Option<f64>,
    /// openb: whether `commons` counts GPUs stranded by a node's CPU and memory
    /// ("true"/"false"; default: `sched`'s).
    #[arg(long)]
    pub share_cpu_aware: Option<bool>,
    /// openb: how much `commons` weighs every request seen against the recent window,
    /// 0 to 1 (default: `sched`'s).
    #[arg(long)]
    pub share_long_weight: Option<f64>,
    /// openb: weight of `commons`' prior widest shapes (default: `sched`'s).
    #[arg(long)]
    pub share_wide_prior: Option<f64>,
    /// openb: power of the scarcity weighting of `commons`' shapes (default: `sched`'s).
    #[arg(long)]
    pub share_scarcity: Option<f64>,
    /// openb: power of the GPU-demand weighting of `commons`' shapes (default: `sched`'s).
    #[arg(long)]
    pub share_demand_power: Option<f64>,
    /// openb: margin of `commons`' reserve for multi-GPU shapes, 0 off (default: `sched`'s).
    #[arg(long)]
    pub share_wide_reserve: Option<f64>,
    /// openb: how often per GPU request `commons`' reserve counts the widest untouched
    /// server asked for whole as if it had come, 0 off (default: `sched`'s).
    #[arg(long)]
    pub share_prior_reserve: Option<f64>,
    /// openb: `commons`' reserve keeps at least this many untouched servers of the
    /// widest kind while other placements exist, however small the cluster (default:
    /// `sched`'s).
    #[arg(long)]
    pub share_prior_floor: Option<f64>,
    /// openb: replay on N servers drawn from the nodes file (a campus-sized cluster;
    /// the draw by --node-seed); tasks that no drawn server could host are left out.
    #[arg(long)]
    pub sample_nodes: Option<usize>,
    /// openb: seed of the --sample-nodes draw.
    #[arg(long, default_value_t = 1)]
    pub node_seed: u64,
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
    #[command(flatten)]
    pub tuning: TuningArgs,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
    /// Policies simulated at once, each on a thread (the figures do not depend on it).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The churn knobs' settings (`None`: `sched`'s defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct TuningArgs {
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
    /// Longest grace period, in seconds, that covers a guest's checkpoint write for
    /// the policies with checkpoint-aware victims (default: `sched`'s, 600; 0 turns the
    /// longer grace off).
    #[arg(long)]
    pub grace_covers_checkpoint_s: Option<u32>,
    /// GPU-hours of guests' work from which an owner job waits before stopping them,
    /// for the policies with checkpoint-aware victims (default: `sched`'s; 0: off).
    #[arg(long)]
    pub spare_costly_guests_gpu_hours: Option<f64>,
    /// Seconds after its submission an owner job waits at most before stopping such
    /// guests (default: `sched`'s).
    #[arg(long)]
    pub spare_costly_guests_s: Option<i64>,
    /// The most an owner job waits for such guests as a share of its time limit
    /// (default: `sched`'s).
    #[arg(long)]
    pub owner_delay_share: Option<f64>,
    /// Adaptive hysteresis on or off ("true"/"false"; default: `sched`'s): the delay
    /// scales with the node's take-back rate and the queue pressure.
    #[arg(long)]
    pub relend_adaptive: Option<bool>,
    /// Take-backs per hour from which the adaptive hysteresis holds back for the whole
    /// delay (default: `sched`'s).
    #[arg(long)]
    pub relend_full_rate: Option<f64>,
    /// Weight of the queue pressure in the adaptive hysteresis, 0-1 (default: `sched`'s).
    #[arg(long)]
    pub relend_pressure_weight: Option<f64>,
    /// Weight of the queue pressure in the take-back rule's limit, 0-1 (default:
    /// `sched`'s).
    #[arg(long)]
    pub taken_back_pressure_weight: Option<f64>,
}

impl TuningArgs {
    pub fn tuning(&self) -> commons_sim::Tuning {
        commons_sim::Tuning {
            relend_delay_s: self.relend_delay_s,
            relend_min_rate: self.relend_min_rate,
            return_risk_step: self.return_risk_step,
            taken_back_max_risk: self.taken_back_max_risk,
            taken_back_patience_s: self.taken_back_patience_s,
            grace_covers_checkpoint_s: self.grace_covers_checkpoint_s,
            spare_costly_guests_gpu_hours: self.spare_costly_guests_gpu_hours,
            spare_costly_guests_s: self.spare_costly_guests_s,
            owner_delay_share: self.owner_delay_share,
            relend_adaptive: self.relend_adaptive,
            relend_full_rate: self.relend_full_rate,
            relend_pressure_weight: self.relend_pressure_weight,
            taken_back_pressure_weight: self.taken_back_pressure_weight,
        }
    }
}

/// The checkpoint model with failures; on when either of its first two flags is given.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckpointArgs {
    /// Share of the jobs (0 to 1) that never checkpoint: no periodic snapshot, no save
    /// when told to stop (turns the checkpoint model with failures on).
    #[arg(long)]
    pub no_checkpoint_share: Option<f64>,
    /// Checkpoint write bandwidth in GB/s: a job's write takes its GPUs' memory times
    /// its fill (0.25-1, drawn per job) over this; a save that misses the grace period
    /// keeps only the last periodic snapshot (turns the checkpoint model on).
    #[arg(long)]
    pub checkpoint_gbps: Option<f64>,
    /// Seed of the checkpoint model's per-job draws.
    #[arg(long, default_value_t = 1)]
    pub checkpoint_seed: u64,
}

impl CheckpointArgs {
    pub fn model(
        &self,
    ) -> Result<Option<commons_sim::checkpoint::CheckpointModel>, commons_sim::checkpoint::ModelError>
    {
        commons_sim::checkpoint::CheckpointModel::from_flags(
            self.no_checkpoint_share,
            self.checkpoint_gbps,
            self.checkpoint_seed,
        )
    }
}

#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// Job trace CSV the windows are cut from.
    #[arg(long, default_value = "sim/traces/philly_sep_oct_2017.csv")]
    pub trace: PathBuf,
    /// Comma-separated policies to evaluate (the baselines isolated, share-fairshare and
    /// commons-old always run too).
    #[arg(long, alias = "policy", default_value = "commons")]
    pub policies: String,
    /// Which cases: the tuning set (even seeds), the test set (odd seeds) or all.
    #[arg(long, default_value = "all", value_parser = ["tuning", "test", "all"])]
    pub set: String,
    /// The small suite (8 cases, up to 320 GPUs and 2,000 jobs) instead of the full one
    /// (24 cases, up to 640 GPUs and 8,000 jobs).
    #[arg(long)]
    pub small: bool,
    /// The tests' tiny suite (4 cases of at most 150 jobs submitted within two days,
    /// 5-8 labs, up to 64 GPUs): checks that everything runs, says nothing.
    #[arg(long, conflicts_with = "small")]
    pub tiny: bool,
    /// Only the first N cases (seeds 0..N) of the suite.
    #[arg(long)]
    pub cases: Option<u64>,
    /// Cases replayed at once, each on a thread (the figures do not depend on it).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Write the report as JSON to this file ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Reuse the baselines' figures of this earlier JSON report for the cases and
    /// settings it shares with this run.
    #[arg(long)]
    pub reuse: Option<PathBuf>,
    /// Write each case's campus (case<seed>.toml) and jobs (case<seed>.csv) into this
    /// directory, to replay one with `commons-sim replay` (the TOML's first line says
    /// with which flags).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Queued jobs per lab shown to the scheduler in one call.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Seconds between runs of the scheduler loop.
    #[arg(long, default_value_t = 30)]
    pub tick: i64,
    #[command(flatten)]
    pub tuning: TuningArgs,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}
