//! The DNS lister: A records of a set of names, asked of one configured resolver.

use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr as _;
use std::time::Duration;

use async_trait::async_trait;
use hickory_resolver::proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use tokio::net::UdpSocket;
use tracing::Instrument as _;

use super::{BACKEND_DNS, Discoverer, DiscoveryError, Instance};

/// How long one exchange with the resolver may take.
pub const DNS_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many exchanges are tried per name before it counts as failed.
pub const DNS_ATTEMPTS: u32 = 3;
/// The pause between two attempts.
pub const DNS_RETRY_WAIT: Duration = Duration::from_millis(5);

/// Large enough for any UDP answer; the query carries no EDNS, so servers should stay within
/// 512 bytes, but a generous buffer keeps a larger answer from being cut and misparsed.
const RECEIVE_BUFFER: usize = 65_535;

/// Resolves A records of each name through one resolver over UDP, with a fresh exchange per
/// attempt: 2 s per exchange, 3 attempts, 5 ms apart (configurable).
///
/// A response code other than NOERROR is an error (a resolver that answers SERVFAIL carries no
/// answers, and reading it as "no instances" would reconcile the fleet away); NOERROR without
/// answers is an empty set. Addresses are deduplicated across names. The call fails only if
/// nothing resolved and some name failed: a partial resolution is a success, and a total
/// outage is never read as an empty fleet. The workload id is `ip:port`; DNS knows no machine,
/// so the node id is empty.
#[derive(Debug, Clone)]
pub struct Dns {
    hosts: Vec<String>,
    resolver: SocketAddr,
    port: u16,
    exchange_timeout: Duration,
    attempts: u32,
    retry_wait: Duration,
}

impl Dns {
    /// Resolves `hosts` through the resolver at `resolver`, reporting each address at `port`.
    pub fn new(hosts: Vec<String>, resolver: SocketAddr, port: u16) -> Dns {
        Dns {
            hosts,
            resolver,
            port,
            exchange_timeout: DNS_EXCHANGE_TIMEOUT,
            attempts: DNS_ATTEMPTS,
            retry_wait: DNS_RETRY_WAIT,
        }
    }

    /// Replaces the per-exchange timeout.
    pub fn with_exchange_timeout(mut self, timeout: Duration) -> Dns {
        self.exchange_timeout = timeout;
        self
    }

    /// Replaces the number of attempts per name (at least one is always made).
    pub fn with_attempts(mut self, attempts: u32) -> Dns {
        self.attempts = attempts.max(1);
        self
    }

    /// Parses a resolver address: `ip:port`, `[v6]:port`, or a bare IP meaning port 53.
    pub fn parse_resolver(raw: &str) -> Result<SocketAddr, DiscoveryError> {
        let raw = raw.trim();
        if let Ok(addr) = SocketAddr::from_str(raw) {
            return Ok(addr);
        }
        let bare = raw.trim_start_matches('[').trim_end_matches(']');
        std::net::IpAddr::from_str(bare)
            .map(|ip| SocketAddr::new(ip, 53))
            .map_err(|_| DiscoveryError::InvalidSetting {
                name: "DNS_RESOLVER_ADDRESS",
                reason: format!("{raw:?} is not an IP address with an optional port"),
            })
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for host in &self.hosts {
            match self.resolve(host).await {
                Ok(ips) => {
                    for ip in ips {
                        if seen.insert(ip) {
                            out.push(Instance {
                                workload_id: format!("{ip}:{}", self.port),
                                node_id: String::new(),
                                ip_address: ip.to_string(),
                                port: self.port,
                                backend: BACKEND_DNS.to_owned(),
                            });
                        }
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if out.is_empty() && !errors.is_empty() {
            return Err(DiscoveryError::DnsAllFailed(errors));
        }
        Ok(out)
    }

    async fn resolve(&self, host: &str) -> Result<Vec<Ipv4Addr>, DiscoveryError> {
        let mut name = Name::from_str_relaxed(host).map_err(|e| DiscoveryError::DnsQuery {
            host: host.to_owned(),
            reason: e.to_string(),
        })?;
        name.set_fqdn(true);
        let mut last_error = None;
        for attempt in 0..self.attempts {
            if attempt > 0 {
                tokio::time::sleep(self.retry_wait).await;
            }
            match self.exchange(host, &name).await {
                Ok(ips) => return Ok(ips),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| DiscoveryError::DnsTimeout {
            host: host.to_owned(),
            after: self.exchange_timeout,
        }))
    }

    /// One query and its answer over a fresh UDP socket connected to the resolver, so only
    /// the resolver's datagrams are read; stray or mismatched answers are skipped.
    async fn exchange(&self, host: &str, name: &Name) -> Result<Vec<Ipv4Addr>, DiscoveryError> {
        let io = |error: std::io::Error| DiscoveryError::DnsIo {
            host: host.to_owned(),
            error,
        };
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(name.clone(), RecordType::A));
        let id = query.metadata.id;
        let bytes = query.to_vec().map_err(|e| DiscoveryError::DnsQuery {
            host: host.to_owned(),
            reason: e.to_string(),
        })?;

        let local: SocketAddr = if self.resolver.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).await.map_err(io)?;
        socket.connect(self.resolver).await.map_err(io)?;
        socket.send(&bytes).await.map_err(io)?;

        let mut buf = vec![0u8; RECEIVE_BUFFER];
        let response = tokio::time::timeout(self.exchange_timeout, async {
            loop {
                let n = socket.recv(&mut buf).await?;
                match Message::from_vec(&buf[..n]) {
                    Ok(m)
                        if m.metadata.id == id
                            && m.metadata.message_type == MessageType::Response =>
                    {
                        return Ok::<_, std::io::Error>(m);
                    }
                    _ => continue,
                }
            }
        })
        .await
        .map_err(|_| DiscoveryError::DnsTimeout {
            host: host.to_owned(),
            after: self.exchange_timeout,
        })?
        .map_err(io)?;

        let rcode = response.metadata.response_code;
        if rcode != ResponseCode::NoError {
            return Err(DiscoveryError::DnsResponseCode {
                host: host.to_owned(),
                rcode: rcode_mnemonic(rcode),
            });
        }
        Ok(response
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect())
    }
}

/// The RFC mnemonic of a response code (`SERVFAIL`, `REFUSED`, ...), as operators read it in
/// `dig` output.
fn rcode_mnemonic(code: ResponseCode) -> String {
    match u16::from(code) {
        0 => "NOERROR".to_owned(),
        1 => "FORMERR".to_owned(),
        2 => "SERVFAIL".to_owned(),
        3 => "NXDOMAIN".to_owned(),
        4 => "NOTIMP".to_owned(),
        5 => "REFUSED".to_owned(),
        6 => "YXDOMAIN".to_owned(),
        7 => "YXRRSET".to_owned(),
        8 => "NXRRSET".to_owned(),
        9 => "NOTAUTH".to_owned(),
        10 => "NOTZONE".to_owned(),
        n => format!("RCODE{n}"),
    }
}

#[async_trait]
impl Discoverer for Dns {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.list()
            .instrument(tracing::debug_span!("list-dns-instances"))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resolver_addresses() {
        assert_eq!(
            Dns::parse_resolver("10.0.0.2:5353").unwrap(),
            "10.0.0.2:5353".parse().unwrap()
        );
        assert_eq!(
            Dns::parse_resolver("10.0.0.2").unwrap(),
            "10.0.0.2:53".parse().unwrap()
        );
        assert_eq!(
            Dns::parse_resolver("[fd00::2]:53").unwrap(),
            "[fd00::2]:53".parse().unwrap()
        );
        assert_eq!(
            Dns::parse_resolver("fd00::2").unwrap(),
            "[fd00::2]:53".parse().unwrap()
        );
        assert!(Dns::parse_resolver("resolver.local:53").is_err());
    }

    #[test]
    fn names_response_codes() {
        assert_eq!(rcode_mnemonic(ResponseCode::ServFail), "SERVFAIL");
        assert_eq!(rcode_mnemonic(ResponseCode::Refused), "REFUSED");
        assert_eq!(rcode_mnemonic(ResponseCode::NXDomain), "NXDOMAIN");
    }
}
