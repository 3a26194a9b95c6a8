//! Settings about who reaches the portal from where: the reverse proxies whose
//! `X-Forwarded-For` is believed, and the CLI's browser sign-in (RFC 8628).

use serde::Deserialize;

/// The `commons` CLI's sign-in through the browser (`service::cli_login`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CliLoginConfig {
    /// Sign-ins one client address may start in any 10 minutes (the time a sign-in waits
    /// for its user); past it the start is refused with 429. The endpoint needs no login,
    /// so this keeps one address from filling the table of waiting sign-ins.
    pub starts_per_address: u32,
    /// Days a token made by a browser sign-in stays valid.
    pub token_days: u32,
}

impl Default for CliLoginConfig {
    fn default() -> Self {
        Self {
            starts_per_address: 20,
            token_days: 30,
        }
    }
}

impl CliLoginConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.starts_per_address >= 1,
            "cli_login.starts_per_address must be at least 1"
        );
        anyhow::ensure!(
            (1..=3650).contains(&self.token_days),
            "cli_login.token_days must be between 1 and 3650"
        );
        Ok(())
    }
}

/// Parses `trusted_proxies` entries: an address (`10.0.0.5`, `::1`) or a range
/// (`10.0.0.0/24`).
pub fn parse_ranges(entries: &[String], what: &str) -> anyhow::Result<Vec<ipnet::IpNet>> {
    entries
        .iter()
        .map(|e| {
            let e = e.trim();
            e.parse::<ipnet::IpNet>()
                .or_else(|_| e.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{what}: {e:?} is neither an address nor a range like 10.0.0.0/8"
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_addresses_or_prefixes() {
        let r = parse_ranges(
            &["127.0.0.1".into(), "10.0.0.0/8".into(), "::1".into()],
            "x",
        )
        .unwrap();
        assert_eq!(r.len(), 3);
        assert!(r[0].contains(&"127.0.0.1".parse::<std::net::IpAddr>().unwrap()));
        assert!(r[1].contains(&"10.2.3.4".parse::<std::net::IpAddr>().unwrap()));
        let e = parse_ranges(&["nginx".into()], "trusted_proxies").unwrap_err();
        assert!(e.to_string().contains("trusted_proxies"), "{e}");
    }
}
