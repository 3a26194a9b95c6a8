//! Agent configuration from the command line, and the `--gpus` grammar.
//!
//! Invariants: a parsed `GpuMode::Fake` list is never empty and every GPU in it has
//! 1..=4096 GB; the enrolment token never appears in `Debug` output.

use std::path::PathBuf;
use thiserror::Error;

#[derive(Clone)]
pub struct AgentConfig {
    /// Base URL of the portal, e.g. `https://gpu.campus.edu`.
    pub portal: String,
    /// One-time enrolment token; needed only on the first start with a state dir.
    pub enrol_token: Option<String>,
    /// Where the node credential and fake-GPU overrides live.
    pub state_dir: PathBuf,
    /// The file with the host's id, outside the state dir (`host`); one per Docker
    /// Engine.
    pub host_id_file: PathBuf,
    /// Where the GPU inventory comes from (`--gpus`).
    pub gpus: GpuMode,
    /// Display name of the node; defaults to the host name.
    pub hostname: String,
    /// What guests' containers may reach (`runtime::guest`).
    pub guest_network: crate::runtime::guest::GuestNetwork,
    /// With the `egress` network: ranges guests never reach besides the private ones and
    /// the portal's own addresses (`--guest-block`).
    pub guest_block: Vec<ipnet::Ipv4Net>,
    /// Stop a guest whose GPUs stay under 5% this long; `None`: never.
    pub idle_guest: Option<std::time::Duration>,
    /// The group that may use the control socket (mode 0660); `None`: the agent's own.
    pub socket_group: Option<String>,
    /// The capacity to report (`--capacity`).
    pub capacity: CapacityMode,
    /// Pulls and image signatures (`runtime::images`).
    pub images: crate::runtime::images::ImagePolicy,
    /// With fake GPUs: the utilisation (percent) a GPU reports while our container holds
    /// it (`--fake-busy-util`); 0 (idle) by default.
    pub fake_busy_util: u32,
    /// How fast each job's output may reach the portal (`--log-rate`, `--log-burst`).
    pub log_limit: crate::outbox::rate::LogLimit,
    /// Jobs' disk caps and the free-space floor (`--max-job-disk-gb`, `--min-free-disk`,
    /// `--job-disk`; see `disk`).
    pub disk: crate::disk::DiskPolicy,
    /// Exported datasets and the dataset cache (`--data`, `--dataset-cache-gb`,
    /// `--dataset-ca`; see `datasets`).
    pub datasets: crate::datasets::DatasetsConfig,
    /// Shares of one GPU (`--share-mode`, `--mps-control`, `--share-watch-ms`; see
    /// `share`); the default takes none.
    pub shares: crate::share::ShareConfig,
}

/// What the agent reports as the server's CPUs and memory.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CapacityMode {
    /// Measured, on servers with real GPUs; not reported with fake GPUs (a simulated
    /// server's capacity is not the machine's), so nothing is limited there.
    #[default]
    Auto,
    /// Given: CPUs and memory in GiB (a fake server of a certain size, or to keep some of
    /// the machine for the owner's own work).
    Given { cpus: f64, memory_gb: u64 },
}

impl std::str::FromStr for CapacityMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        let bad =
            || format!("--capacity: expected auto or CPUS,MEMORY_GB (e.g. 32,256), got {s:?}");
        let (c, m) = s.split_once(',').ok_or_else(bad)?;
        let cpus: f64 = c.trim().parse().map_err(|_| bad())?;
        let memory_gb: u64 = m.trim().trim_end_matches("GB").parse().map_err(|_| bad())?;
        if !(cpus > 0.0 && cpus <= 4096.0) || memory_gb == 0 {
            return Err(bad());
        }
        Ok(Self::Given { cpus, memory_gb })
    }
}

/// Parses a duration like `60m`, `90s`, `2h` or `off` (`--idle-guest`).
pub fn parse_idle(s: &str) -> Result<Option<std::time::Duration>, String> {
    if s == "off" || s == "never" {
        return Ok(None);
    }
    let bad = || format!("{s:?} is not a duration: write e.g. 60m, 90s, 2h, or off");
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(bad()),
    };
    if secs == 0 {
        return Err(bad());
    }
    Ok(Some(std::time::Duration::from_secs(secs)))
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("portal", &self.portal)
            .field(
                "enrol_token",
                &self.enrol_token.as_ref().map(|_| "<hidden>"),
            )
            .field("state_dir", &self.state_dir)
            .field("host_id_file", &self.host_id_file)
            .field("gpus", &self.gpus)
            .field("hostname", &self.hostname)
            .field("guest_network", &self.guest_network)
            .field("guest_block", &self.guest_block)
            .field("idle_guest", &self.idle_guest)
            .field("socket_group", &self.socket_group)
            .field("images", &self.images)
            .field("fake_busy_util", &self.fake_busy_util)
            .field("log_limit", &self.log_limit)
            .field("disk", &self.disk)
            .field("shares", &self.shares)
            .finish()
    }
}

/// Where the GPU inventory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuMode {
    /// NVML, failing clearly when no NVIDIA driver is present.
    Auto,
    Nvml,
    /// A fixed list, e.g. `fake:2xA100-80GB,1xRTX4090-24GB`.
    Fake(Vec<FakeGpuModel>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGpuModel {
    pub model: String,
    pub memory_mb: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum GpuSpecError {
    #[error("--gpus: expected auto, nvml or fake:COUNTxMODEL-MEMGB[,...], got {0:?}")]
    Syntax(String),
    #[error("--gpus: {0:?} needs COUNTxMODEL-MEMGB, e.g. 2xA100-80GB")]
    Item(String),
    #[error("--gpus: {0:?} has no GPUs")]
    Empty(String),
}

impl std::str::FromStr for GpuMode {
    type Err = GpuSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => return Ok(GpuMode::Auto),
            "nvml" => return Ok(GpuMode::Nvml),
            _ => {}
        }
        let list = s
            .strip_prefix("fake:")
            .ok_or_else(|| GpuSpecError::Syntax(s.into()))?;
        let mut gpus = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || GpuSpecError::Item(item.into());
            let (count, model) = item.split_once('x').ok_or_else(bad)?;
            let count: u32 = count.parse().map_err(|_| bad())?;
            let (_, mem) = model.rsplit_once('-').ok_or_else(bad)?;
            let gb: u64 = mem
                .strip_suffix("GB")
                .and_then(|g| g.parse().ok())
                .ok_or_else(bad)?;
            if count > 64 || gb == 0 || gb > 4096 {
                return Err(bad());
            }
            for _ in 0..count {
                gpus.push(FakeGpuModel {
                    model: model.to_string(),
                    memory_mb: gb * 1024,
                });
            }
        }
        if gpus.is_empty() {
            return Err(GpuSpecError::Empty(s.into()));
        }
        Ok(GpuMode::Fake(gpus))
    }
}

impl AgentConfig {
    /// A configuration for `portal` that keeps its state (and its host id) in
    /// `state_dir`, with every other setting at its default: no enrolment token, GPUs
    /// found through NVML, the hostname `h`. For agents run inside another program (the
    /// tests), which set what they need on top (`AgentConfig { gpus, ..new(..) }`); the
    /// binary builds its configuration from its flags.
    pub fn new(portal: &str, state_dir: &std::path::Path) -> Self {
        AgentConfig {
            portal: portal.into(),
            enrol_token: None,
            state_dir: state_dir.into(),
            host_id_file: state_dir.join("host-id"),
            gpus: GpuMode::Auto,
            hostname: "h".into(),
            guest_network: Default::default(),
            guest_block: Vec::new(),
            idle_guest: None,
            socket_group: None,
            capacity: Default::default(),
            images: Default::default(),
            fake_busy_util: 0,
            log_limit: Default::default(),
            disk: Default::default(),
            datasets: Default::default(),
            shares: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fake_list() {
        let GpuMode::Fake(g) = "fake:2xA100-80GB,1xRTX4090-24GB".parse().unwrap() else {
            panic!("not fake")
        };
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].model, "A100-80GB");
        assert_eq!(g[0].memory_mb, 80 * 1024);
        assert_eq!(g[2].model, "RTX4090-24GB");
    }

    #[test]
    fn debug_hides_the_enrolment_token() {
        let c = AgentConfig {
            enrol_token: Some("secret-token".into()),
            ..AgentConfig::new("http://p", std::path::Path::new("/tmp/x"))
        };
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("secret-token") && shown.contains("<hidden>"),
            "{shown}"
        );
    }

    #[test]
    fn capacity_flags() {
        assert_eq!("auto".parse::<CapacityMode>(), Ok(CapacityMode::Auto));
        assert_eq!(
            "32,256".parse::<CapacityMode>(),
            Ok(CapacityMode::Given {
                cpus: 32.0,
                memory_gb: 256
            })
        );
        for bad in ["32", "x,1", "0,10", "4,0"] {
            assert!(bad
                .parse::<CapacityMode>()
                .unwrap_err()
                .contains("CPUS,MEMORY_GB"));
        }
    }

    #[test]
    fn idle_durations() {
        assert_eq!(
            parse_idle("60m").unwrap(),
            Some(std::time::Duration::from_secs(3600))
        );
        assert_eq!(
            parse_idle("20s").unwrap(),
            Some(std::time::Duration::from_secs(20))
        );
        assert_eq!(parse_idle("off").unwrap(), None);
        for bad in ["", "60", "m", "0m", "5d", "-1m"] {
            assert!(
                parse_idle(bad).unwrap_err().contains("not a duration"),
                "{bad}"
            );
        }
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(
            "fake:2A100".parse::<GpuMode>(),
            Err(GpuSpecError::Item(_))
        ));
        assert!(matches!(
            "gpus".parse::<GpuMode>(),
            Err(GpuSpecError::Syntax(_))
        ));
        assert!(matches!(
            "fake:".parse::<GpuMode>(),
            Err(GpuSpecError::Empty(_))
        ));
        assert!(matches!(
            "fake:1xA100-0GB".parse::<GpuMode>(),
            Err(GpuSpecError::Item(_))
        ));
    }
}
