//! The command line, as clap reads it. Names and flags here are an interface that
//! scripts rely on (see docs/src/user/cli.md): add freely, rename never.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// The GPU Commons command-line client: submit container jobs to the campus's shared
/// GPUs, watch them, read their output, SSH into them.
#[derive(Debug, Parser)]
#[command(name = "commons", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sign in to a portal: through the browser (the default), or with a personal access token.
    Login(LoginArgs),
    /// Forget the stored credential.
    Logout,
    /// Who you are: your labs, roles, quotas and what you use of them now.
    Whoami(JsonFlag),
    /// Submit a job from the command line: `commons run IMAGE -- CMD ...`.
    Run(Box<RunArgs>),
    /// Submit a job file (TOML, the API's fields; unknown keys are refused).
    Submit(SubmitArgs),
    /// Your jobs (newest first), with state, server, GPUs and why a job waits.
    Ls(LsArgs),
    /// One job in full.
    Show(IdJson),
    /// A job's output; `-f` follows it until the job ends.
    Logs(LogsArgs),
    /// A job's state history.
    Events(IdJson),
    /// Cancel jobs.
    Cancel(CancelArgs),
    /// Open a shell in a running job (or run CMD there) through the portal's SSH gateway.
    Ssh(SshArgs),
    /// Print the block for ~/.ssh/config (`ssh job-42@gpu-commons`, VS Code Remote-SSH).
    SshConfig(SshConfigArgs),
    /// Forward a running job's Jupyter port to this computer and print the URL.
    Notebook(NotebookArgs),
    /// Print the address of a running job's web app (`app` in its request) and open it in
    /// a browser where there is one.
    Open(OpenArgs),
    /// Launch a web app from a preset (the portal's Launch page lists them): prints the
    /// job's id, then, once it runs, its app's address (and opens a browser where there is
    /// one).
    Launch(LaunchArgs),
    /// Copy files between this computer and the file store: `commons cp LOCAL...
    /// files:PATH` uploads, `commons cp files:PATH LOCAL` downloads (`lab:SLUG/PATH` for a
    /// lab's shared files).
    ///
    /// A file over 8 MiB goes up in parts: a lost part is sent again, and an interrupted
    /// copy, run again, resumes its upload (sending only the parts the portal lacks).
    Cp(CpArgs),
    /// Download a job's outputs (what it wrote to /outputs) into a folder.
    Get(GetArgs),
    /// Your files in the campus store (`lab:SLUG/` for a lab's): list, remove.
    #[command(subcommand)]
    Files(FilesCommand),
    /// Your SSH public keys, which the gateway accepts for your jobs.
    #[command(subcommand)]
    SshKey(SshKeyCommand),
    /// The campus's servers: their GPUs, owner lab and what they lend.
    Nodes(JsonFlag),
    /// The lab datasets you may mount (`--dataset LAB/NAME` for `commons run`).
    Datasets(JsonFlag),
    /// GPU-hours by week: yours, or a whole lab's (its admins).
    Usage(UsageArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Write man pages (one per command) into a directory.
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The portal's URL, e.g. https://gpu.campus.edu
    pub url: String,
    /// A personal access token (made on the portal's Tokens page), instead of the browser.
    /// `-` reads it from standard input.
    #[arg(long)]
    pub token: Option<String>,
    /// Do not try to open a browser; print the URL to open instead.
    #[arg(long)]
    pub no_browser: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The container image (from the portal's allow-list).
    pub image: String,
    /// GPUs, all on one server.
    #[arg(long, default_value_t = 1)]
    pub gpus: i64,
    /// Acceptable GPU model (repeat for several), e.g. --gpu-model A100-80GB.
    #[arg(long = "gpu-model", value_name = "MODEL")]
    pub gpu_models: Vec<String>,
    /// Least memory per GPU, in GB.
    #[arg(long, value_name = "GB")]
    pub gpu_memory: Option<f64>,
    /// A share of one GPU instead of the whole GPU: 0.05 to 1 in steps of 0.05 (with
    /// `--gpus 1`; the server's lab must lend shares).
    #[arg(long, value_name = "FRACTION")]
    pub gpu_fraction: Option<f64>,
    /// The GPU memory of a share of one GPU, in GB.
    #[arg(long, value_name = "GB")]
    pub gpu_share_memory: Option<f64>,
    /// The time limit: 90, 90m, 2h, 1h30m, 3d (a bare number is minutes).
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub time: String,
    /// The lab to charge (needed when you are in several).
    #[arg(long, value_name = "SLUG")]
    pub lab: Option<String>,
    /// An environment variable (repeat for several).
    #[arg(long, short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// CPUs.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory in GB.
    #[arg(long, value_name = "GB")]
    pub memory: Option<f64>,
    /// An interactive job: kept up for you to SSH into (no command needed).
    #[arg(long)]
    pub interactive: bool,
    /// Snapshot /checkpoint every this many minutes.
    #[arg(long, value_name = "MINUTES")]
    pub checkpoint_minutes: Option<i64>,
    /// The job's disk in GiB (/checkpoint holds at most this; default: the campus's).
    #[arg(long, value_name = "GIB")]
    pub disk: Option<i64>,
    /// A file or folder (ending in /) of your files to read under /inputs; lab:SLUG/PATH
    /// for a lab's, under /inputs/lab/SLUG/ (repeat for several, at most 64).
    #[arg(long = "input", value_name = "PATH")]
    pub inputs: Vec<String>,
    /// A lab dataset to mount read-only: LAB/NAME (at /datasets/NAME) or
    /// LAB/NAME:/MOUNT (repeat for several; `commons datasets` lists them).
    #[arg(long = "dataset", value_name = "LAB/NAME[:/MOUNT]")]
    pub datasets: Vec<String>,
    #[command(flatten)]
    pub flows: Box<crate::flows::RunFlows>,
    #[command(flatten)]
    pub submit: SubmitFlags,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SubmitFlags {
    /// Stream the state changes and then the output until the job ends; exit with the
    /// job's exit code.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Print the new job as the API's JSON.
    #[arg(long, conflicts_with = "follow")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The job file (TOML); `-` reads standard input.
    pub file: PathBuf,
    #[command(flatten)]
    pub submit: SubmitFlags,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Every job of your lab (lab admins); with several labs, name one with --lab.
    #[arg(long)]
    pub all: bool,
    /// The lab for --all.
    #[arg(long, value_name = "SLUG", requires = "all")]
    pub lab: Option<String>,
    /// Only jobs in these states (comma-separated): queued,running,...
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<String>,
    #[command(flatten)]
    pub filters: crate::flows::LsFilters,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct IdJson {
    /// The job's id.
    pub id: i64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub id: i64,
    /// Follow the output until the job ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The jobs to cancel.
    #[arg(required_unless_present = "array")]
    pub ids: Vec<i64>,
    /// Cancel every unfinished task of this array (its id, as `commons run --array`
    /// printed it).
    #[arg(long, value_name = "ARRAY")]
    pub array: Option<i64>,
}

#[derive(Debug, Args)]
pub struct SshArgs {
    pub id: i64,
    /// Extra options for ssh (repeat), e.g. -o ServerAliveInterval=30.
    #[arg(short = 'o', value_name = "OPTION")]
    pub options: Vec<String>,
    /// A command to run instead of a shell, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SshConfigArgs {
    /// Also a block naming this job (`ssh commons-job-ID`).
    pub id: Option<i64>,
}

#[derive(Debug, Args)]
pub struct OpenArgs {
    pub id: i64,
    /// Print the address only; start no browser.
    #[arg(long)]
    pub print: bool,
}

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// The preset: `NAME`, or `LAB/NAME` for a lab's.
    pub preset: String,
    /// GPUs (where the preset lets you choose; up to its maximum).
    #[arg(long)]
    pub gpus: Option<i64>,
    /// Hours (where the preset lets you choose; up to its maximum).
    #[arg(long)]
    pub hours: Option<i64>,
    /// The lab to charge, for a campus preset when you are in several labs.
    #[arg(long)]
    pub lab: Option<String>,
    /// Print the job's id and return; do not wait for the app.
    #[arg(long)]
    pub no_wait: bool,
    /// Print the app's address only; start no browser.
    #[arg(long)]
    pub print: bool,
}

#[derive(Debug, Args)]
pub struct NotebookArgs {
    pub id: i64,
    /// The port Jupyter listens on inside the job.
    #[arg(long, default_value_t = 8888)]
    pub port: u16,
    /// The port on this computer (default: the same, or a free one).
    #[arg(long)]
    pub local_port: Option<u16>,
    /// Extra options for ssh (repeat), e.g. -o IdentityFile=~/.ssh/campus.
    #[arg(short = 'o', value_name = "OPTION")]
    pub options: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum SshKeyCommand {
    /// List your keys.
    Ls(JsonFlag),
    /// Add a public key (a file such as ~/.ssh/id_ed25519.pub).
    Add {
        file: PathBuf,
        /// A name for it (default: the key's comment).
        #[arg(long)]
        name: Option<String>,
    },
    /// Remove a key by its id.
    Rm { id: i64 },
}

#[derive(Debug, Args)]
pub struct CpArgs {
    /// The sources, then the destination. A store path is files:PATH (yours) or
    /// lab:SLUG/PATH; a destination ending in '/' (or several sources) is a folder.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DEST")]
    pub paths: Vec<String>,
    /// Copy folders with everything in them.
    #[arg(short, long)]
    pub recursive: bool,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The job's id.
    pub id: i64,
    /// The folder to write them into (default: job-ID).
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// List files (all, or those under PREFIX: `data/`, `lab:vision/shared/`).
    Ls {
        prefix: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove files (PATH, files:PATH or lab:SLUG/PATH).
    Rm {
        #[arg(required = true)]
        paths: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// A whole lab's usage (its admins).
    #[arg(long, value_name = "SLUG")]
    pub lab: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    pub shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Where to write commons.1, commons-run.1, ...
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}
