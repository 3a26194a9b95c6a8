//! `commons-agent`: the daemon on each lab server, and the small commands around it.
//!
//! Errors end the process with a message (anyhow, with context), never a panic.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use commons_agent::owner::socket::{self, Reply, Request};
use commons_agent::runtime::DockerRuntime;
use commons_agent::{guard, state, AgentConfig, GpuMode};
use commons_proto::{Attempt, JobId};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the agent keeps its credential, attempts and socket unless `--state-dir` says
/// otherwise: the directory the Debian package and the systemd unit use, so that an
/// owner's `commons-agent status` finds the agent the package started.
const DEFAULT_STATE_DIR: &str = "/var/lib/gpu-commons/agent";

#[derive(Parser)]
#[command(
    name = "commons-agent",
    version,
    about = "Lends this server's idle GPUs to GPU Commons"
)]
struct Cli {
    /// Log lines for people (`text`) or one JSON object a line with the span fields
    /// (`json`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "COMMONS_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once at start-up: the size of `Run` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Enrol (first start) and serve the portal until stopped.
    Run(RunArgs),
    /// The running agent's view: GPUs, what runs on each, what is lent and why, the
    /// portal link. Exits non-zero when the agent is not running.
    Status {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// The lending rule: never, always, or windows "mon-fri 19:00-07:00" ["sat,sun 00:00-24:00" ...].
    Lend {
        /// never | always | windows
        rule: String,
        /// With `windows`: one or more "DAYS HH:MM-HH:MM".
        windows: Vec<String>,
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// No new guests; running guests are checkpointed and move elsewhere; owner jobs finish.
    Drain {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Take jobs again after a drain.
    Undrain {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Stop every job here (requeued elsewhere), deregister the node (its credential is
    /// revoked) and stop the agent.
    Leave {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// The kill switch: `--now` stops every guest (SIGTERM, the grace, then killed) and
    /// lends nothing; `--off` lends again under the rule.
    Reclaim {
        #[arg(long, conflicts_with = "off")]
        now: bool,
        #[arg(long)]
        off: bool,
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Drive a fake GPU (for demos and tests): mark it in local use, set its utilisation.
    Fake {
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        local_use: Option<OnOff>,
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100))]
        util: Option<u32>,
    },
    /// Guards one attempt while the agent may be down (started by the agent, detached).
    #[command(hide = true)]
    Guard {
        #[arg(long)]
        state_dir: PathBuf,
        #[arg(long, allow_negative_numbers = true)]
        job: JobId,
        #[arg(long, allow_negative_numbers = true)]
        attempt: Attempt,
        /// The attempt's container (stopped, fail-safe, should its directory go).
        #[arg(long)]
        container: Option<String>,
    },
}

/// What `commons-agent run` takes: the agent's configuration, as flags and environment.
#[derive(clap::Args)]
struct RunArgs {
    /// The portal's base URL, e.g. https://gpu.campus.edu
    #[arg(long, env = "COMMONS_PORTAL")]
    portal: String,
    /// One-time enrolment token from the lab admin; only needed on the first start.
    #[arg(long, env = "COMMONS_ENROL_TOKEN")]
    enrol_token: Option<String>,
    /// Where the node credential and fake-GPU overrides live.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// The file with this host's id, outside the state dir (made once if missing). It
    /// labels every container, and at start the agent stops containers of this host
    /// made by an earlier identity (a lost state dir enrolled again). Two agents on one
    /// Docker Engine need two files.
    #[arg(long, env = "COMMONS_HOST_ID_FILE", default_value = commons_agent::host::DEFAULT_HOST_ID_FILE)]
    host_id_file: PathBuf,
    /// auto | nvml | fake:2xA100-80GB,1xRTX4090-24GB
    #[arg(long, default_value = "auto")]
    gpus: GpuMode,
    /// The node's display name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// What guests' containers may reach: `none` (their own loopback only) or
    /// `egress` (the internet, never the host, other jobs or private addresses).
    #[arg(long, env = "COMMONS_GUEST_NETWORK", default_value = "none")]
    guest_network: commons_agent::runtime::guest::GuestNetwork,
    /// With `--guest-network egress`: an IPv4 address or range guests never reach,
    /// besides the private and link-local ranges and the portal's own addresses (a
    /// campus service on a public address, say); repeat, or separate with commas.
    #[arg(long = "guest-block", env = "COMMONS_GUEST_BLOCK", value_name = "RANGE",
          value_delimiter = ',', value_parser = commons_agent::runtime::guest::parse_block)]
    guest_block: Vec<ipnet::Ipv4Net>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9108 (off when
    /// unset; the metrics carry no secrets, but keep it on loopback or a management
    /// network).
    #[arg(long, env = "COMMONS_AGENT_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Stop a guest whose GPUs stay under 5% this long (60m, 90s, 2h, or off); it is
    /// warned in its log first. Interactive guests are cancelled, batch ones requeued.
    #[arg(long, env = "COMMONS_IDLE_GUEST", default_value = "60m")]
    idle_guest: String,
    /// The group whose members may use `commons-agent status|lend|drain|...` (the
    /// socket STATE_DIR/agent.sock is mode 0660).
    #[arg(long, env = "COMMONS_SOCKET_GROUP")]
    socket_group: Option<String>,
    /// The CPUs and memory (GiB) jobs may use here, e.g. 32,256; `auto`: measured
    /// (with fake GPUs: not reported, so not limited).
    #[arg(long, env = "COMMONS_CAPACITY", default_value = "auto")]
    capacity: commons_agent::config::CapacityMode,
    /// A registry (host[:port], or docker.io) this node may pull missing allowed
    /// images from, only by their pinned digest; repeat for several. None: never pull.
    #[arg(long = "allow-pull", value_name = "REGISTRY")]
    allow_pull: Vec<String>,
    /// Run only images whose allow-list entry is signed by a key of
    /// --image-authority-keys.
    #[arg(long, requires = "image_authority_keys")]
    require_signed_images: bool,
    /// File of the campus image authorities' ed25519 public keys (OpenSSH lines).
    #[arg(long)]
    image_authority_keys: Option<PathBuf>,
    /// With fake GPUs (demos, tests): the utilisation in percent, and the same share
    /// of memory, that a GPU reports while a job's container holds it. 0: idle.
    #[arg(long, env = "COMMONS_FAKE_BUSY_UTIL", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    fake_busy_util: u32,
    /// How fast each job's output may go to the portal, in bytes a second (65536, 64K,
    /// 1M); output over it is dropped, and the job's log says how much.
    #[arg(long, env = "COMMONS_LOG_RATE",
          default_value_t = commons_agent::outbox::rate::DEFAULT_RATE,
          value_parser = commons_agent::outbox::rate::parse_bytes)]
    log_rate: u64,
    /// How much output may pass at once above the rate, after a quieter spell (a
    /// start-up banner, a traceback).
    #[arg(long, env = "COMMONS_LOG_BURST",
          default_value_t = commons_agent::outbox::rate::DEFAULT_BURST,
          value_parser = commons_agent::outbox::rate::parse_bytes)]
    log_burst: u64,
    /// The largest disk (GiB) a job may have here: every host path it can write
    /// (/checkpoint) and its checkpoint archive hold at most its `disk_gb`, and never
    /// more than this. Jobs asking for more are not placed here.
    #[arg(long, env = "COMMONS_MAX_JOB_DISK_GB", default_value_t = commons_agent::disk::DEFAULT_MAX_JOB_GB,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    max_job_disk_gb: u64,
    /// Take no new guests while the file system of --state-dir has less free than
    /// this: a share (10%) or an amount in GiB (50GB).
    #[arg(long, env = "COMMONS_MIN_FREE_DISK", default_value = "10%")]
    min_free_disk: commons_agent::disk::Floor,
    /// How jobs' disk caps are held: `image` (an ext4 image per job, loop-mounted:
    /// writes past the cap fail; needs root, loop devices and mkfs.ext4), `watch`
    /// (a plain directory measured every 2 s; a job over its cap is stopped), or
    /// `auto` (image when a test image mounts at start, else watch).
    #[arg(long, env = "COMMONS_JOB_DISK", default_value = "auto")]
    job_disk: commons_agent::disk::CapMode,
    /// Export a folder of this server as dataset NAME (`NAME=/mnt/imagenet`;
    /// repeatable): a lab admin registers it as `node:NAME`, and jobs that mount it run
    /// only on servers that export it, reading it in place (read-only). No other host
    /// path ever reaches a job.
    #[arg(long = "data", value_name = "NAME=/path",
          value_parser = commons_agent::datasets::parse_export)]
    data: Vec<(String, std::path::PathBuf)>,
    /// The most GB (10^9 bytes) of downloaded datasets kept here (under the state dir),
    /// least recently used first out; never one a running job mounts. 0: no cap.
    #[arg(long, env = "COMMONS_DATASET_CACHE_GB", default_value_t = 100)]
    dataset_cache_gb: u64,
    /// PEM certificates to trust for `https:` datasets besides the usual roots.
    #[arg(long, env = "COMMONS_DATASET_CA")]
    dataset_ca: Option<std::path::PathBuf>,
    /// Take shares of one GPU, and how they are enforced: `mps` (one NVIDIA MPS control
    /// daemon per shared GPU caps each share's compute and memory), `timeslice` (no
    /// compute cap; a share over its GPU memory is stopped), or `none` (no shares).
    #[arg(long, env = "COMMONS_SHARE_MODE", default_value = "none")]
    share_mode: String,
    /// The MPS control daemon's command, run in the foreground once per shared GPU
    /// (advanced; tests use a stand-in).
    #[arg(long, env = "COMMONS_MPS_CONTROL", hide = true,
          default_value = commons_agent::share::DEFAULT_MPS_CONTROL)]
    mps_control: String,
    /// How often shares' GPU memory is read, in milliseconds (advanced).
    #[arg(long, env = "COMMONS_SHARE_WATCH_MS", hide = true, default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    share_watch_ms: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    match cli.cmd {
        Cmd::Guard {
            state_dir,
            job,
            attempt,
            container,
        } => guard(&state_dir, job, attempt, container),
        Cmd::Run(args) => run(args),
        Cmd::Status { state_dir } => status(&state_dir),
        Cmd::Lend {
            rule,
            windows,
            state_dir,
        } => match socket::lend_request(&rule, &windows) {
            Ok(req) => command(&state_dir, req, Duration::from_secs(30)),
            Err(e) => fail(&e.to_string()),
        },
        Cmd::Drain { state_dir } => command(&state_dir, Request::Drain, Duration::from_secs(30)),
        Cmd::Undrain { state_dir } => {
            command(&state_dir, Request::Undrain, Duration::from_secs(30))
        }
        Cmd::Leave { state_dir } => {
            // Waits for every job's grace period.
            command(&state_dir, Request::Leave, Duration::from_secs(3 * 3600))
        }
        Cmd::Reclaim {
            now,
            off,
            state_dir,
        } => {
            if !now && !off {
                return fail("reclaim needs --now (take every GPU back) or --off (lend again)");
            }
            command(
                &state_dir,
                Request::Reclaim { on: now },
                Duration::from_secs(30),
            )
        }
        Cmd::Fake {
            state_dir,
            gpu,
            local_use,
            util,
        } => fake(&state_dir, gpu, local_use, util),
    }
}

fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let logs = tracing_subscriber::fmt()
        // To stderr, which a guard's spawner points at guard.log (its stdout is closed).
        .with_writer(std::io::stderr)
        // Colour only on a terminal: guards log to guard.log, the service to the journal.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        );
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

/// Guards one attempt until its container is no longer running (see `guard`).
fn guard(
    state_dir: &Path,
    job: JobId,
    attempt: Attempt,
    container: Option<String>,
) -> anyhow::Result<()> {
    // One thread is plenty for polling a file; a server may run many guards.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the guard's runtime")?
        .block_on(guard::run(
            // A guard makes no containers: it needs no agent id.
            || DockerRuntime::connect(String::new()),
            state_dir,
            job,
            attempt,
            container,
        ))
}

/// The agent: its metrics endpoint (when asked for), then the agent until it stops.
fn run(args: RunArgs) -> anyhow::Result<()> {
    let metrics_listen = args.metrics_listen;
    let config = agent_config(args)?;
    let rt = tokio::runtime::Runtime::new().context("starting the agent's runtime")?;
    if let Some(addr) = metrics_listen {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("--metrics-listen {addr}"))?;
        tracing::info!("metrics at http://{addr}/metrics");
        rt.spawn(commons_agent::metrics::serve(listener));
    }
    rt.block_on(commons_agent::run(config))
}

/// The agent's configuration from its flags, checked.
fn agent_config(args: RunArgs) -> anyhow::Result<AgentConfig> {
    let log_limit = commons_agent::outbox::rate::LogLimit::new(args.log_rate, args.log_burst)
        .map_err(anyhow::Error::msg)?;
    let idle_guest = commons_agent::config::parse_idle(&args.idle_guest)
        .map_err(|e| anyhow::anyhow!("--idle-guest: {e}"))?;
    let authority_keys = match &args.image_authority_keys {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("--image-authority-keys {}", f.display()))?;
            commons_api::image::parse_keys(&text)
                .map_err(|e| anyhow::anyhow!("--image-authority-keys {}: {e}", f.display()))?
        }
        None => Vec::new(),
    };
    let images = commons_agent::runtime::images::ImagePolicy {
        allow_pull: args.allow_pull,
        require_signed: args.require_signed_images,
        authority_keys,
        // Set from the node's credential once it is known (the session).
        own_lab: None,
    };
    let hostname = args.name.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "server".into())
    });
    Ok(AgentConfig {
        portal: args.portal,
        enrol_token: args.enrol_token,
        state_dir: args.state_dir,
        host_id_file: args.host_id_file,
        gpus: args.gpus,
        hostname,
        guest_network: args.guest_network,
        guest_block: args.guest_block,
        idle_guest,
        socket_group: args.socket_group,
        capacity: args.capacity,
        images,
        fake_busy_util: args.fake_busy_util,
        log_limit,
        disk: commons_agent::disk::DiskPolicy {
            max_job_gb: args.max_job_disk_gb,
            floor: args.min_free_disk,
            mode: args.job_disk,
        },
        datasets: commons_agent::datasets::DatasetsConfig {
            exports: args.data.into_iter().collect(),
            cache_gb: args.dataset_cache_gb,
            ca_file: args.dataset_ca,
        },
        shares: commons_agent::share::ShareConfig {
            mode: commons_agent::share::parse_mode(&args.share_mode).map_err(anyhow::Error::msg)?,
            mps_control: mps_control(&args.mps_control)?,
            watch_every: Duration::from_millis(args.share_watch_ms),
            mps_dir: None,
        },
    })
}

/// `--mps-control`: a program and its arguments, split at white space.
fn mps_control(s: &str) -> anyhow::Result<Vec<String>> {
    let words: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    if words.is_empty() {
        anyhow::bail!("--mps-control: give the MPS control daemon's command");
    }
    Ok(words)
}

/// `commons-agent status`: the running agent's view, or what the state dir says.
fn status(state_dir: &Path) -> anyhow::Result<()> {
    let enrolled = match state::load_credential(state_dir)? {
        Some(c) => format!(
            "node {} ({}) of lab {}, enrolled; state dir {}",
            c.node_id,
            c.node_name,
            c.lab,
            state_dir.display()
        ),
        None => format!("not enrolled (no credential in {})", state_dir.display()),
    };
    match socket::call(state_dir, &Request::Status, Duration::from_secs(15)) {
        Ok(r) => finish(r),
        Err(e) => {
            println!("{enrolled}");
            fail(&e.to_string())
        }
    }
}

/// `commons-agent fake`: sets a fake GPU's local use and utilisation.
fn fake(
    state_dir: &Path,
    gpu: u32,
    local_use: Option<OnOff>,
    util: Option<u32>,
) -> anyhow::Result<()> {
    let mut all = state::load_fake_overrides(state_dir);
    let o = all.entry(gpu).or_default();
    if let Some(l) = local_use {
        o.local_use = matches!(l, OnOff::On);
    }
    if let Some(u) = util {
        o.util_pct = u;
    }
    let line = format!(
        "fake GPU {gpu}: local use {}, utilisation {}%",
        o.local_use, o.util_pct
    );
    state::save_fake_overrides(state_dir, &all).context("writing fake GPU state")?;
    println!("{line}");
    Ok(())
}

/// Sends one command to the running agent; exits non-zero with its words when it refuses.
fn command(state_dir: &Path, req: Request, wait: Duration) -> anyhow::Result<()> {
    match socket::call(state_dir, &req, wait) {
        Ok(r) => finish(r),
        Err(e) => fail(&e.to_string()),
    }
}

fn finish(r: Reply) -> anyhow::Result<()> {
    if r.ok {
        println!("{}", r.message);
        Ok(())
    } else {
        fail(&r.message)
    }
}

fn fail(message: &str) -> anyhow::Result<()> {
    eprintln!("commons-agent: {message}");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_command_defaults_to_the_state_dir_the_package_uses() {
        // The unit ran the agent in /var/lib/gpu-commons/agent while `status`, `drain`
        // and the rest looked in /var/lib/commons-agent by default: "not running".
        let unit = include_str!("../../deploy/systemd/commons-agent.service");
        assert!(
            unit.contains(&format!("--state-dir {DEFAULT_STATE_DIR} ")),
            "the systemd unit's --state-dir is not {DEFAULT_STATE_DIR}"
        );
        let mut checked = 0;
        // `guard` is started by the agent with the agent's own --state-dir: it has none.
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
        {
            for arg in sub.get_arguments().filter(|a| a.get_id() == "state_dir") {
                let defaults: Vec<_> = arg.get_default_values().iter().collect();
                assert_eq!(defaults, [DEFAULT_STATE_DIR], "{}", sub.get_name());
                checked += 1;
            }
        }
        assert!(checked >= 8, "only {checked} commands take --state-dir");
    }
}
