//! What a guest may reach and write: the network a job's container gets, and the caps on
//! what it can write on the server. Applied to every container on top of
//! [`super::docker::container_body`] (no capability, uid 65534, `no-new-privileges`).
//!
//! Network (`commons-agent run --guest-network`):
//! - `none` (the default): the container has only its loopback. Nothing on the lab's
//!   network, the host or another job can be reached, nor the internet. SSH sessions and
//!   `-L` forwards still work: the agent reaches the container from inside its namespace.
//! - `egress`: the container joins the agent's bridge [`GUEST_NETWORK`] (interface
//!   [`GUEST_BRIDGE`]) with inter-container traffic off, and firewall rules drop what it
//!   sends to the host itself and to private, link-local and shared address ranges
//!   ([`BLOCKED_RANGES`]): the internet only.
//!
//! Writes: the image's filesystem is read-only; `/tmp` and `/var/tmp` are size-capped
//! scratch (tmpfs, which also counts against the job's memory), `/dev/shm` has the job's
//! size, the container log rotates (json-file, [`LOG_MAX`] x [`LOG_FILES`]), open files
//! and processes are capped. `/checkpoint` is the one host directory, the attempt's own.

use bollard::models::{HostConfig, HostConfigLogConfig, ResourcesUlimits};
use std::collections::HashMap;

/// The agent's bridge network for guests that may reach the internet.
pub const GUEST_NETWORK: &str = "commons-guests";
/// Its interface on the host, named so the firewall rules can name it.
pub const GUEST_BRIDGE: &str = "gc-guests0";
/// Destinations a guest on [`GUEST_NETWORK`] never reaches (RFC 1918, link-local, CGNAT,
/// loopback, multicast).
pub const BLOCKED_RANGES: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "224.0.0.0/4",
];
/// The size of `/tmp` (and of `/var/tmp`) in a job's container.
pub const SCRATCH: &str = "1g";
/// The container log: at most this size per file ...
pub const LOG_MAX: &str = "10m";
/// ... and this many files.
pub const LOG_FILES: &str = "3";
/// Open files per process (below what engines themselves may open: 20,000 was seen).
pub const NOFILE: i64 = 16_384;
/// `/dev/shm` when the job names no size, in MiB.
pub const DEFAULT_SHM_MB: u64 = 64;

/// How guests' containers reach the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GuestNetwork {
    #[default]
    None,
    Egress,
}

impl std::str::FromStr for GuestNetwork {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "egress" => Ok(Self::Egress),
            other => Err(format!(
                "--guest-network: expected none or egress, got {other:?}"
            )),
        }
    }
}

/// The caps every container of this agent gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Isolation {
    pub network: GuestNetwork,
}

/// Applies the network and the write caps to a container's host config. `shm_mb`: the
/// job's `/dev/shm` size (none: [`DEFAULT_SHM_MB`]).
pub fn apply(host: &mut HostConfig, iso: &Isolation, shm_mb: Option<u64>) {
    host.network_mode = Some(
        match iso.network {
            GuestNetwork::None => "none",
            GuestNetwork::Egress => GUEST_NETWORK,
        }
        .into(),
    );
    host.readonly_rootfs = Some(true);
    let scratch = format!("rw,nosuid,nodev,size={SCRATCH}");
    let mut tmpfs = host.tmpfs.take().unwrap_or_default();
    tmpfs.insert("/tmp".into(), scratch.clone());
    tmpfs.insert("/var/tmp".into(), scratch);
    host.tmpfs = Some(tmpfs);
    let shm = shm_mb.unwrap_or(DEFAULT_SHM_MB).max(1);
    host.shm_size = Some(i64::try_from(shm.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX));
    host.log_config = Some(HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), LOG_MAX.to_string()),
            ("max-file".to_string(), LOG_FILES.to_string()),
        ])),
    });
    host.ulimits = Some(vec![ResourcesUlimits {
        name: Some("nofile".into()),
        soft: Some(NOFILE),
        hard: Some(NOFILE),
    }]);
}

/// The firewall rules [`GuestNetwork::Egress`] needs, as `iptables` argument lists (each
/// inserted unless present): drop guests' traffic to the host (but replies to what the
/// host opened), and forwarded traffic to [`BLOCKED_RANGES`].
pub fn egress_rules() -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut rules = vec![
        s(&["INPUT", "-i", GUEST_BRIDGE, "-j", "DROP"]),
        s(&[
            "INPUT",
            "-i",
            GUEST_BRIDGE,
            "-m",
            "conntrack",
            "--ctstate",
            "ESTABLISHED,RELATED",
            "-j",
            "ACCEPT",
        ]),
    ];
    for r in BLOCKED_RANGES {
        rules.push(s(&[
            "DOCKER-USER",
            "-i",
            GUEST_BRIDGE,
            "-d",
            r,
            "-j",
            "DROP",
        ]));
    }
    rules
}

/// Makes what `iso` needs on this server: for [`GuestNetwork::Egress`], the bridge (made
/// once) and the firewall rules (inserted unless present). Needs root and `iptables`.
pub async fn prepare(docker: &bollard::Docker, iso: &Isolation) -> Result<(), super::RuntimeError> {
    if iso.network != GuestNetwork::Egress {
        return Ok(());
    }
    match docker.inspect_network(GUEST_NETWORK, None).await {
        Ok(_) => {}
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            docker
                .create_network(bollard::models::NetworkCreateRequest {
                    name: GUEST_NETWORK.into(),
                    driver: Some("bridge".into()),
                    options: Some(HashMap::from([
                        (
                            "com.docker.network.bridge.name".to_string(),
                            GUEST_BRIDGE.to_string(),
                        ),
                        // Guests of different jobs never talk to each other.
                        (
                            "com.docker.network.bridge.enable_icc".to_string(),
                            "false".to_string(),
                        ),
                    ])),
                    ..Default::default()
                })
                .await?;
        }
        Err(e) => return Err(e.into()),
    }
    for rule in egress_rules() {
        let (chain, spec) = rule
            .split_first()
            .ok_or_else(|| super::RuntimeError::Engine("an empty firewall rule".into()))?;
        let present = tokio::process::Command::new("iptables")
            .arg("-C")
            .arg(chain)
            .args(spec)
            .output()
            .await
            .map_err(|e| {
                super::RuntimeError::Engine(format!(
                    "cannot run iptables ({e}): --guest-network egress needs it"
                ))
            })?
            .status
            .success();
        if present {
            continue;
        }
        let out = tokio::process::Command::new("iptables")
            .arg("-I")
            .arg(chain)
            .args(spec)
            .output()
            .await
            .map_err(|e| super::RuntimeError::Engine(format!("iptables: {e}")))?;
        if !out.status.success() {
            return Err(super::RuntimeError::Engine(format!(
                "iptables -I {}: {}",
                rule.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_get_no_network_by_default_and_capped_writes() {
        let mut h = HostConfig {
            tmpfs: Some(HashMap::from([("/x".to_string(), "size=1m".to_string())])),
            ..Default::default()
        };
        apply(&mut h, &Isolation::default(), None);
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.readonly_rootfs, Some(true));
        let tmpfs = h.tmpfs.unwrap();
        assert!(tmpfs["/tmp"].contains("size=1g"));
        assert!(tmpfs["/var/tmp"].contains("size=1g"));
        assert!(tmpfs.contains_key("/x"), "earlier mounts stay");
        assert_eq!(h.shm_size, Some(64 * 1024 * 1024));
        let log = h.log_config.unwrap();
        assert_eq!(log.config.unwrap()["max-size"], "10m");
        assert_eq!(h.ulimits.unwrap()[0].hard, Some(NOFILE));
    }

    #[test]
    fn egress_joins_the_guest_bridge_and_blocks_private_ranges() {
        let mut h = HostConfig::default();
        apply(
            &mut h,
            &Isolation {
                network: GuestNetwork::Egress,
            },
            Some(512),
        );
        assert_eq!(h.network_mode.as_deref(), Some(GUEST_NETWORK));
        assert_eq!(h.shm_size, Some(512 * 1024 * 1024));
        let rules = egress_rules();
        assert!(rules
            .iter()
            .any(|r| r.join(" ") == "DOCKER-USER -i gc-guests0 -d 10.0.0.0/8 -j DROP"));
        assert!(rules
            .iter()
            .any(|r| r.join(" ") == "INPUT -i gc-guests0 -j DROP"));
        assert_eq!("egress".parse::<GuestNetwork>(), Ok(GuestNetwork::Egress));
        assert!("open".parse::<GuestNetwork>().is_err());
    }
}
