//! `commons-agent`: the daemon on each lab server, and the small commands around it.
//!
//! Errors end the process with a message (anyhow, with context), never a panic.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use commons_agent::{guard, state, AgentConfig, GpuMode};
use commons_proto::{Attempt, JobId};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "commons-agent",
    version,
    about = "Lends this server's idle GPUs to GPU Commons"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Enrol (first start) and serve the portal until stopped.
    Run {
        /// The portal's base URL, e.g. https://gpu.campus.edu
        #[arg(long, env = "COMMONS_PORTAL")]
        portal: String,
        /// One-time enrolment token from the lab admin; only needed on the first start.
        #[arg(long, env = "COMMONS_ENROL_TOKEN")]
        enrol_token: Option<String>,
        /// Where the node credential and fake-GPU overrides live.
        #[arg(long, default_value = "/var/lib/commons-agent")]
        state_dir: PathBuf,
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
    },
    /// Show this node's enrolment.
    Status {
        #[arg(long, default_value = "/var/lib/commons-agent")]
        state_dir: PathBuf,
    },
    /// Drive a fake GPU (for demos and tests): mark it in local use, set its utilisation.
    Fake {
        #[arg(long, default_value = "/var/lib/commons-agent")]
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
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

fn main() -> anyhow::Result<()> {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        // Colour only on a terminal: guards log to guard.log, the service to the journal.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().cmd {
        // One thread is plenty for polling a file; a server may run many guards.
        Cmd::Guard {
            state_dir,
            job,
            attempt,
        } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the guard's runtime")?
            .block_on(guard::run(&state_dir, job, attempt)),
        Cmd::Run {
            portal,
            enrol_token,
            state_dir,
            gpus,
            name,
            guest_network,
            allow_pull,
            require_signed_images,
            image_authority_keys,
        } => {
            let authority_keys = match &image_authority_keys {
                Some(f) => {
                    let text = std::fs::read_to_string(f)
                        .with_context(|| format!("--image-authority-keys {}", f.display()))?;
                    commons_api::image::parse_keys(&text).map_err(|e| {
                        anyhow::anyhow!("--image-authority-keys {}: {e}", f.display())
                    })?
                }
                None => Vec::new(),
            };
            let images = commons_agent::runtime::images::ImagePolicy {
                allow_pull,
                require_signed: require_signed_images,
                authority_keys,
            };
            let hostname = name.unwrap_or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "server".into())
            });
            tokio::runtime::Runtime::new()
                .context("starting the agent's runtime")?
                .block_on(commons_agent::run(AgentConfig {
                    portal,
                    enrol_token,
                    state_dir,
                    gpus,
                    hostname,
                    guest_network,
                    images,
                }))
        }
        Cmd::Status { state_dir } => {
            match state::load_credential(&state_dir)? {
                Some(c) => println!(
                    "node {} ({}) of lab {}, enrolled; state dir {}",
                    c.node_id,
                    c.node_name,
                    c.lab,
                    state_dir.display()
                ),
                None => println!("not enrolled (no credential in {})", state_dir.display()),
            }
            Ok(())
        }
        Cmd::Fake {
            state_dir,
            gpu,
            local_use,
            util,
        } => {
            let mut all = state::load_fake_overrides(&state_dir);
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
            state::save_fake_overrides(&state_dir, &all).context("writing fake GPU state")?;
            println!("{line}");
            Ok(())
        }
    }
}
