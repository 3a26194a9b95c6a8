//! The address a request came from, as the portal shows it (the CLI sign-in's approval
//! page) and counts it (sign-ins per address).
//!
//! Invariant: `X-Forwarded-For` is believed only from a configured reverse proxy
//! (`trusted_proxies`), and only up to the first entry that is not itself a proxy: each
//! proxy appends the address it saw, so everything left of the nearest untrusted entry
//! was written by the client and may be made up.

use actix_web::HttpRequest;
use ipnet::IpNet;
use std::net::IpAddr;

/// The client's address: the TCP peer, unless the peer is a trusted proxy; then the
/// rightmost `X-Forwarded-For` entry that is not a trusted proxy (the leftmost when all
/// are). `None` only when the peer is unknown (a test request without a socket).
pub fn client_ip(req: &HttpRequest, trusted: &[IpNet]) -> Option<IpAddr> {
    let peer = req.peer_addr()?.ip();
    let forwarded: Vec<&str> = req
        .headers()
        .get_all("x-forwarded-for")
        .filter_map(|h| h.to_str().ok())
        .collect();
    Some(resolve(peer, &forwarded, trusted))
}

/// [`client_ip`] on its parts: the peer and the `X-Forwarded-For` header lines in order.
pub fn resolve(peer: IpAddr, forwarded: &[&str], trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let chain: Vec<IpAddr> = forwarded
        .iter()
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .map(|e| e.parse::<IpAddr>().ok())
        .collect::<Option<Vec<_>>>()
        // A malformed list is not the proxy's work: believe the proxy itself.
        .unwrap_or_default();
    let mut client = peer;
    for ip in chain.iter().rev() {
        client = *ip;
        if !is_trusted(ip) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_proxy() {
        let proxies: Vec<IpNet> = vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ];
        let none: Vec<IpNet> = Vec::new();
        // No proxy configured: the peer, whatever the header says.
        assert_eq!(
            resolve(ip("127.0.0.1"), &["203.0.113.9"], &none),
            ip("127.0.0.1")
        );
        // A peer that is not a proxy: the peer.
        assert_eq!(
            resolve(ip("198.51.100.7"), &["203.0.113.9"], &proxies),
            ip("198.51.100.7")
        );
        // The proxy's own entry.
        assert_eq!(
            resolve(ip("127.0.0.1"), &["203.0.113.9"], &proxies),
            ip("203.0.113.9")
        );
        // A client's made-up entries left of the one the proxy appended are ignored.
        assert_eq!(
            resolve(ip("127.0.0.1"), &["1.2.3.4, 203.0.113.9"], &proxies),
            ip("203.0.113.9")
        );
        // Two proxies in a row; several header lines.
        assert_eq!(
            resolve(
                ip("127.0.0.1"),
                &["1.2.3.4", "203.0.113.9, 10.1.1.1"],
                &proxies
            ),
            ip("203.0.113.9")
        );
        // Only proxies: the farthest.
        assert_eq!(
            resolve(ip("127.0.0.1"), &["10.1.1.1"], &proxies),
            ip("10.1.1.1")
        );
        // No header, or a malformed one: the proxy itself.
        assert_eq!(resolve(ip("127.0.0.1"), &[], &proxies), ip("127.0.0.1"));
        assert_eq!(
            resolve(ip("127.0.0.1"), &["nonsense"], &proxies),
            ip("127.0.0.1")
        );
    }
}
