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
//!   sends to the host itself, to private, link-local (cloud metadata at
//!   169.254.169.254 included) and shared address ranges ([`BLOCKED_RANGES`]), to the
//!   portal's own addresses (resolved from `--portal` at start: a portal on a public
//!   address would otherwise be one request away) and to the ranges the operator lists
//!   (`--guest-block`): the rest of the internet only. Rules are added (never removed)
//!   unless present, so agents sharing a host only ever add blocks.
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Isolation {
    pub network: GuestNetwork,
    /// With [`GuestNetwork::Egress`], destinations blocked besides [`BLOCKED_RANGES`]: the
    /// portal's addresses and the operator's ranges ([`blocked_destinations`]).
    pub blocked: Vec<ipnet::Ipv4Net>,
}

/// Parses a `--guest-block` range: an IPv4 address or range (`203.0.113.0/24`). IPv6 is
/// refused with a reason: the guests' bridge has no IPv6, so there is nothing to block.
pub fn parse_block(s: &str) -> Result<ipnet::Ipv4Net, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<ipnet::Ipv4Net>() {
        return Ok(n.trunc());
    }
    if let Ok(a) = s.parse::<std::net::Ipv4Addr>() {
        return Ok(ipnet::Ipv4Net::from(a));
    }
    if s.parse::<ipnet::IpNet>().is_ok() || s.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "--guest-block {s:?}: IPv6 needs no block (guests have no IPv6 route)"
        ));
    }
    Err(format!(
        "--guest-block {s:?}: expected an IPv4 address or range, e.g. 203.0.113.0/24"
    ))
}

/// What guests on the egress network must not reach besides [`BLOCKED_RANGES`]: the IPv4
/// addresses the portal's host name resolves to now (`portal` is the agent's `--portal`
/// URL), and `ranges`. An unresolvable portal is an error: the agent cannot say what to
/// block, so it does not start guests on a network that might reach it.
pub async fn blocked_destinations(
    portal: &str,
    ranges: &[ipnet::Ipv4Net],
) -> Result<Vec<ipnet::Ipv4Net>, super::RuntimeError> {
    let bad = |why: String| super::RuntimeError::Engine(why);
    let url = reqwest::Url::parse(portal)
        .map_err(|e| bad(format!("the portal URL {portal:?} does not parse: {e}")))?;
    let host = url
        .host_str()
        .ok_or_else(|| bad(format!("the portal URL {portal:?} names no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    let found = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| {
            bad(format!(
                "cannot resolve the portal's host {host:?} to block it from guests: {e}"
            ))
        })?;
    let mut out: Vec<ipnet::Ipv4Net> = found
        .filter_map(|a| match a.ip() {
            std::net::IpAddr::V4(v4) => Some(ipnet::Ipv4Net::from(v4)),
            std::net::IpAddr::V6(_) => None,
        })
        .chain(ranges.iter().copied())
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
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
/// host opened), and forwarded traffic to [`BLOCKED_RANGES`] and to `blocked`.
pub fn egress_rules(blocked: &[ipnet::Ipv4Net]) -> Vec<Vec<String>> {
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
    let extra: Vec<String> = blocked.iter().map(|n| n.to_string()).collect();
    for r in BLOCKED_RANGES
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
    {
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
    for rule in egress_rules(&iso.blocked) {
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
        let portal = parse_block("198.18.0.7").unwrap();
        let listed = parse_block("203.0.113.9/24").unwrap();
        apply(
            &mut h,
            &Isolation {
                network: GuestNetwork::Egress,
                blocked: vec![portal, listed],
            },
            Some(512),
        );
        assert_eq!(h.network_mode.as_deref(), Some(GUEST_NETWORK));
        assert_eq!(h.shm_size, Some(512 * 1024 * 1024));
        let rules = egress_rules(&[portal, listed]);
        for d in ["198.18.0.7/32", "203.0.113.0/24", "169.254.0.0/16"] {
            assert!(
                rules
                    .iter()
                    .any(|r| r.join(" ") == format!("DOCKER-USER -i gc-guests0 -d {d} -j DROP")),
                "{d}: {rules:?}"
            );
        }
        assert!(rules
            .iter()
            .any(|r| r.join(" ") == "DOCKER-USER -i gc-guests0 -d 10.0.0.0/8 -j DROP"));
        assert!(rules
            .iter()
            .any(|r| r.join(" ") == "INPUT -i gc-guests0 -j DROP"));
        assert_eq!("egress".parse::<GuestNetwork>(), Ok(GuestNetwork::Egress));
        assert!("open".parse::<GuestNetwork>().is_err());
        assert!(parse_block("2001:db8::/32").unwrap_err().contains("IPv6"));
        assert!(parse_block("lab-net").is_err());
    }

    #[tokio::test]
    async fn the_portal_is_blocked_by_its_addresses() {
        let listed = parse_block("203.0.113.0/24").unwrap();
        let b = blocked_destinations("http://198.18.0.7:8080", &[listed])
            .await
            .unwrap();
        assert_eq!(b, vec![parse_block("198.18.0.7").unwrap(), listed]);
        let b = blocked_destinations("https://localhost", &[])
            .await
            .unwrap();
        assert!(b.contains(&parse_block("127.0.0.1").unwrap()), "{b:?}");
        assert!(blocked_destinations("not a url", &[]).await.is_err());
    }
}
