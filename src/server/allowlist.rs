//! The `api-allowed-ips` check in front of `/api/`.
//!
//! cc-backend compares the client address as an exact string although its fleet README
//! shows CIDR ranges; here entries with a `/` are CIDR ranges, `*` allows everyone and
//! everything else is compared as an address (so `::1` and `0:0::1` are the same).
//!
//! The client address is the TCP peer's. `X-Real-IP` and `X-Forwarded-For` name another
//! client only when the peer is a proxy listed in `trusted-proxies` (none by default): any
//! client can send those headers, so believing them from everyone would let everyone past
//! the allowlist.

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
    proxies: TrustedProxies,
}

/// A parsed `trusted-proxies` list: the peers whose `X-Real-IP` / `X-Forwarded-For` headers
/// are believed. Entries are CIDR ranges or single addresses.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Parses the entries; an empty list trusts no peer.
    pub fn new(entries: &[String]) -> Result<TrustedProxies, ServerError> {
        let nets = entries
            .iter()
            .map(|entry| {
                let entry = entry.trim();
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| ServerError::InvalidTrustedProxy(entry.to_owned()))
            })
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client behind `peer`: the peer itself unless it is a trusted proxy; then
    /// `X-Real-IP`, else the right-most `X-Forwarded-For` entry that is not a trusted
    /// proxy (entries further left were written by whoever the untrusted hop was), else the
    /// left-most entry when every hop is trusted. A port is stripped.
    pub fn client_ip(&self, headers: &HeaderMap, peer: SocketAddr) -> String {
        if !self.contains(peer.ip()) {
            return peer.ip().to_string();
        }
        let real_ip = headers
            .get("x-real-ip")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        if let Some(raw) = real_ip {
            return strip_port(raw).to_owned();
        }
        // Several header lines are one list, in order.
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|hop| strip_port(hop.trim()))
            .filter(|hop| !hop.is_empty())
            .collect();
        let untrusted = hops
            .iter()
            .rev()
            .find(|hop| !hop.parse::<IpAddr>().is_ok_and(|ip| self.contains(ip)));
        match untrusted.or(hops.first()) {
            Some(hop) => (*hop).to_owned(),
            None => peer.ip().to_string(),
        }
    }
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

    /// The same list, believing proxy headers from `proxies` only.
    pub fn with_trusted_proxies(mut self, proxies: TrustedProxies) -> Allowlist {
        self.proxies = proxies;
        self
    }

    /// The request's client address (see [`TrustedProxies::client_ip`]).
    pub fn client_ip(&self, headers: &HeaderMap, peer: SocketAddr) -> String {
        self.proxies.client_ip(headers, peer)
    }

    /// Whether the request's client (see [`TrustedProxies::client_ip`]) may use the API.
    pub fn allows(&self, headers: &HeaderMap, peer: SocketAddr) -> bool {
        if self.any {
            return true;
        }
        let client = self.proxies.client_ip(headers, peer);
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

    fn proxies(entries: &[&str]) -> TrustedProxies {
        TrustedProxies::new(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn proxy_headers_from_an_untrusted_peer_are_ignored() {
        let mut h = HeaderMap::new();
        h.insert("x-real-ip", "10.9.9.9".parse().unwrap());
        h.insert("x-forwarded-for", "10.1.1.1".parse().unwrap());
        let none = TrustedProxies::default();
        assert_eq!(none.client_ip(&h, peer("192.0.2.7:1")), "192.0.2.7");
        assert!(!list(&["10.0.0.0/8"]).allows(&h, peer("192.0.2.7:1")));
        let other = proxies(&["172.16.0.0/12"]);
        assert_eq!(other.client_ip(&h, peer("192.0.2.7:1")), "192.0.2.7");
    }

    #[test]
    fn proxy_headers_from_a_trusted_peer_name_the_client() {
        let trusted = proxies(&["127.0.0.1", "172.16.0.0/12"]);
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.1.1.1, 172.16.0.1".parse().unwrap());
        assert_eq!(trusted.client_ip(&h, peer("127.0.0.1:1")), "10.1.1.1");
        // A client-written entry left of the untrusted hop is not believed.
        h.insert(
            "x-forwarded-for",
            "10.6.6.6, 192.0.2.9, 172.16.0.1".parse().unwrap(),
        );
        assert_eq!(trusted.client_ip(&h, peer("127.0.0.1:1")), "192.0.2.9");
        // Every hop trusted: the left-most is the client.
        h.insert("x-forwarded-for", "172.16.0.9".parse().unwrap());
        assert_eq!(trusted.client_ip(&h, peer("127.0.0.1:1")), "172.16.0.9");
        h.append("x-forwarded-for", "10.2.2.2".parse().unwrap());
        assert_eq!(trusted.client_ip(&h, peer("127.0.0.1:1")), "10.2.2.2");
        h.insert("x-real-ip", "[2001:db8::1]:443".parse().unwrap());
        assert_eq!(trusted.client_ip(&h, peer("127.0.0.1:1")), "2001:db8::1");
        h.insert("x-real-ip", "10.9.9.9:80".parse().unwrap());
        assert_eq!(trusted.client_ip(&h, peer("127.0.0.1:1")), "10.9.9.9");
        let l = list(&["10.0.0.0/8"]).with_trusted_proxies(trusted.clone());
        assert!(l.allows(&h, peer("127.0.0.1:1")));
        assert!(!l.allows(&h, peer("127.0.0.2:1")), "an untrusted peer");
        assert_eq!(
            trusted.client_ip(&HeaderMap::new(), peer("127.0.0.1:1")),
            "127.0.0.1"
        );
        assert!(TrustedProxies::new(&["10.0.0.0/33".to_string()]).is_err());
        assert!(TrustedProxies::new(&["proxy.example".to_string()]).is_err());
    }
}
