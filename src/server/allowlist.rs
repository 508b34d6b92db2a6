//! The `api-allowed-ips` check in front of `/api/`.
//!
//! cc-backend compares the client address as an exact string although its fleet README
//! shows CIDR ranges; here entries with a `/` are CIDR ranges, `*` allows everyone and
//! everything else is compared as an address (so `::1` and `0:0::1` are the same).

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

use super::error::ServerError;

/// A parsed `api-allowed-ips` list.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    any: bool,
    exact: Vec<String>,
    addrs: Vec<IpAddr>,
    nets: Vec<IpNet>,
}

impl Allowlist {
    /// Parses the entries; an empty list allows every client.
    pub fn new(entries: &[String]) -> Result<Allowlist, ServerError> {
        let mut list = Allowlist {
            any: entries.is_empty(),
            ..Allowlist::default()
        };
        for entry in entries {
            let entry = entry.trim();
            if entry == "*" {
                list.any = true;
            } else if entry.contains('/') {
                let net: IpNet = entry
                    .parse()
                    .map_err(|_| ServerError::InvalidAllowlist(entry.to_owned()))?;
                list.nets.push(net);
            } else if let Ok(addr) = entry.parse::<IpAddr>() {
                list.addrs.push(addr);
            } else {
                list.exact.push(entry.to_owned());
            }
        }
        Ok(list)
    }

    /// Whether the request's client (see [`client_ip`]) may use the API.
    pub fn allows(&self, headers: &HeaderMap, peer: SocketAddr) -> bool {
        if self.any {
            return true;
        }
        let client = client_ip(headers, peer);
        match client.parse::<IpAddr>() {
            Ok(ip) => {
                let ip = ip.to_canonical();
                self.addrs.iter().any(|a| a.to_canonical() == ip)
                    || self.nets.iter().any(|n| n.contains(&ip))
                    || self.exact.contains(&client)
            }
            Err(_) => self.exact.contains(&client),
        }
    }
}

/// The client address as cc-backend determines it: `X-Real-Ip`, else the first entry of
/// `X-Forwarded-For`, else the TCP peer; a port is stripped.
pub fn client_ip(headers: &HeaderMap, peer: SocketAddr) -> String {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let raw = header("x-real-ip")
        .or_else(|| header("x-forwarded-for").and_then(|v| v.split(',').next().map(str::trim)));
    match raw {
        Some(raw) => strip_port(raw).to_owned(),
        None => peer.ip().to_string(),
    }
}

fn strip_port(raw: &str) -> &str {
    if raw.parse::<IpAddr>().is_ok() {
        return raw;
    }
    if let Ok(sa) = raw.parse::<SocketAddr>() {
        // `[::1]:80` -> `::1`, `10.0.0.1:80` -> `10.0.0.1`.
        let host = raw.rsplit_once(':').map_or(raw, |(h, _)| h);
        return match sa {
            SocketAddr::V6(_) => host.trim_start_matches('[').trim_end_matches(']'),
            SocketAddr::V4(_) => host,
        };
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::new(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn matching() {
        let h = HeaderMap::new();
        assert!(list(&[]).allows(&h, peer("1.2.3.4:5")));
        assert!(list(&["*"]).allows(&h, peer("1.2.3.4:5")));
        let l = list(&["10.0.0.0/8", "192.168.1.7", "::1"]);
        assert!(l.allows(&h, peer("10.200.0.1:9")));
        assert!(l.allows(&h, peer("192.168.1.7:9")));
        assert!(l.allows(&h, peer("[::1]:9")));
        assert!(!l.allows(&h, peer("192.168.1.8:9")));
        assert!(!l.allows(&h, peer("11.0.0.1:9")));
        // IPv4-mapped IPv6 peers (dual-stack listeners) match IPv4 entries.
        assert!(l.allows(&h, peer("[::ffff:10.1.2.3]:9")));
        assert!(Allowlist::new(&["10.0.0.0/33".to_string()]).is_err());
    }

    #[test]
    fn proxy_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.1.1.1, 172.16.0.1".parse().unwrap());
        assert_eq!(client_ip(&h, peer("127.0.0.1:1")), "10.1.1.1");
        h.insert("x-real-ip", "[2001:db8::1]:443".parse().unwrap());
        assert_eq!(client_ip(&h, peer("127.0.0.1:1")), "2001:db8::1");
        h.insert("x-real-ip", "10.9.9.9:80".parse().unwrap());
        assert_eq!(client_ip(&h, peer("127.0.0.1:1")), "10.9.9.9");
        assert!(list(&["10.0.0.0/8"]).allows(&h, peer("127.0.0.1:1")));
        assert_eq!(
            client_ip(&HeaderMap::new(), peer("127.0.0.1:1")),
            "127.0.0.1"
        );
    }
}
