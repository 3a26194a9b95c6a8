//! Where a webhook may point: http or https only, and (unless the operator allows it)
//! not at loopback, private, link-local or other non-public addresses, checked when the
//! URL is saved and again, after resolving the name, each time it is sent to (a name
//! can be pointed elsewhere after it was saved).

use std::net::{IpAddr, SocketAddr};

/// A webhook URL that passed the checks: the parsed URL and the addresses it resolved
/// to (the sender connects to these only, so a second lookup cannot differ).
#[derive(Debug, Clone)]
pub struct Target {
    pub url: url::Url,
    pub addrs: Vec<SocketAddr>,
}

/// Why a URL is refused, in words for the user.
pub type Refusal = String;

/// Is `ip` somewhere a webhook must not reach from the portal?
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                // 100.64.0.0/10, carrier-grade NAT
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                // 198.18.0.0/15, benchmarking
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7 unique local, fe80::/10 link-local
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Checks the URL's form: an absolute http or https URL with a host and no credentials.
pub fn parse(raw: &str) -> Result<url::Url, Refusal> {
    let url = url::Url::parse(raw.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme {:?} is not allowed: use https (or http)",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("put no user name or password in the URL; the secret signs each call".into());
    }
    Ok(url)
}

/// Parses and resolves `raw`, refusing non-public addresses unless `allow_private`.
pub async fn resolve(raw: &str, allow_private: bool) -> Result<Target, Refusal> {
    let url = parse(raw)?;
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(format!("{host} has no address"));
    }
    if !allow_private {
        if let Some(a) = addrs.iter().find(|a| is_private(a.ip())) {
            return Err(format!(
                "{host} is at {}, a loopback, private or link-local address; webhooks must \
                 reach a public address (an operator may allow private ones)",
                a.ip()
            ));
        }
    }
    Ok(Target { url, addrs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_ranges_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "129.132.1.1", "2001:4860::8888"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn only_http_and_https_without_credentials() {
        assert!(parse("https://hooks.example/x").is_ok());
        assert!(parse("ftp://hooks.example/x").is_err());
        assert!(parse("file:///etc/passwd").is_err());
        assert!(parse("https://u:p@hooks.example/").is_err());
        assert!(parse("not a url").is_err());
    }

    #[tokio::test]
    async fn loopback_is_refused_unless_allowed() {
        assert!(resolve("http://127.0.0.1:9/x", false).await.is_err());
        assert!(resolve("http://localhost:9/x", false).await.is_err());
        assert!(resolve("http://[::1]:9/x", false).await.is_err());
        assert!(resolve("http://127.0.0.1:9/x", true).await.is_ok());
    }
}
