//! The DNS lister: A records of a set of names, asked of one configured resolver.

use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hickory_resolver::proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use tokio::net::UdpSocket;
use tracing::Instrument as _;

use super::instance::split_host_port;
use super::{BACKEND_DNS, Discoverer, DiscoveryError, Instance};
use crate::untrusted::Untrusted;

/// How long one exchange with the resolver may take.
pub const DNS_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many exchanges are tried per name before it counts as failed.
pub const DNS_ATTEMPTS: u32 = 3;
/// The pause between two attempts.
pub const DNS_RETRY_WAIT: Duration = Duration::from_millis(5);
/// How long one name may take inside a listing, all attempts included. The names of a
/// listing are resolved side by side, each against its own deadline, so a name that gets no
/// answer costs only itself; the deadline stays under the cache's 10 s refresh timeout, so
/// the names that answered always make it into the refresh.
pub const DNS_NAME_DEADLINE: Duration = Duration::from_secs(8);
/// The resolver port when `DNS_RESOLVER_ADDRESS` names none.
pub const DNS_DEFAULT_RESOLVER_PORT: u16 = 53;

/// Large enough for any UDP answer; the query carries no EDNS, so servers should stay within
/// 512 bytes, but a generous buffer keeps a larger answer from being cut and misparsed.
const RECEIVE_BUFFER: usize = 65_535;

/// Resolves A records of each name through one resolver over UDP, with a fresh exchange per
/// attempt: 2 s per exchange, 3 attempts, 5 ms apart (configurable).
///
/// Names are resolved concurrently, each within its own deadline ([`DNS_NAME_DEADLINE`]),
/// so one silent name does not cost the others their answers. A response code other than
/// NOERROR is an error (a resolver that answers SERVFAIL carries no
/// answers, and reading it as "no instances" would reconcile the fleet away); NOERROR without
/// answers is an empty set. Addresses are deduplicated across names. The call fails only if
/// nothing resolved and some name failed: a partial resolution is a success (the names that
/// failed are logged at warn level, one line per listing), and a total outage is never read
/// as an empty fleet. The workload id is `ip:port`; DNS knows no machine, so the node id is
/// empty.
///
/// The resolver may be given by host name ([`ResolverAddress::Name`]): it is looked up when
/// the lister is started (or first used), and looked up again after an exchange with it
/// failed, so a resolver that moved is found again.
#[derive(Debug, Clone)]
pub struct Dns {
    hosts: Vec<String>,
    resolver: ResolverAddress,
    /// The addresses a named resolver was last looked up to; the first is used, and dropped
    /// when an exchange with it fails, so the next attempt tries the next one and an empty
    /// list triggers a new lookup.
    resolved: Arc<Mutex<Vec<SocketAddr>>>,
    port: u16,
    exchange_timeout: Duration,
    attempts: u32,
    retry_wait: Duration,
    name_deadline: Duration,
}

/// Where the DNS resolver is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolverAddress {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A host name and port (`localhost:5353`, `resolver.internal`), looked up through the
    /// system resolver.
    Name {
        /// The host name.
        host: String,
        /// The port.
        port: u16,
    },
}

impl From<SocketAddr> for ResolverAddress {
    fn from(addr: SocketAddr) -> ResolverAddress {
        ResolverAddress::Ip(addr)
    }
}

impl std::fmt::Display for ResolverAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolverAddress::Ip(addr) => write!(f, "{addr}"),
            ResolverAddress::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl Dns {
    /// Resolves `hosts` through the resolver at `resolver` (a [`SocketAddr`] or a
    /// [`ResolverAddress`]), reporting each address at `port`.
    pub fn new(hosts: Vec<String>, resolver: impl Into<ResolverAddress>, port: u16) -> Dns {
        Dns {
            hosts,
            resolver: resolver.into(),
            resolved: Arc::default(),
            port,
            exchange_timeout: DNS_EXCHANGE_TIMEOUT,
            attempts: DNS_ATTEMPTS,
            retry_wait: DNS_RETRY_WAIT,
            name_deadline: DNS_NAME_DEADLINE,
        }
    }

    /// Replaces the deadline of one name within a listing ([`DNS_NAME_DEADLINE`]).
    pub fn with_name_deadline(mut self, deadline: Duration) -> Dns {
        self.name_deadline = deadline;
        self
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

    /// Parses a resolver address: `ip:port`, `[v6]:port`, `host:port`, or a bare IP or host
    /// name meaning port 53. Nothing is looked up here.
    pub fn parse_resolver(raw: &str) -> Result<ResolverAddress, DiscoveryError> {
        let raw = raw.trim();
        if let Ok(addr) = SocketAddr::from_str(raw) {
            return Ok(ResolverAddress::Ip(addr));
        }
        let invalid = |why: &str| DiscoveryError::InvalidSetting {
            name: "DNS_RESOLVER_ADDRESS",
            reason: format!(
                "{:?} {why}; write ip:port, host:port, [ipv6]:port, or an IP or host alone for port {DNS_DEFAULT_RESOLVER_PORT}",
                Untrusted(raw)
            ),
        };
        let (host, port) = split_host_port(raw).map_err(|e| invalid(&e.to_string()))?;
        let port = port.unwrap_or(DNS_DEFAULT_RESOLVER_PORT);
        if let Ok(ip) = std::net::IpAddr::from_str(host) {
            return Ok(ResolverAddress::Ip(SocketAddr::new(ip, port)));
        }
        if host.starts_with('.')
            || host.contains("..")
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return Err(invalid("is not a host name or IP address"));
        }
        Ok(ResolverAddress::Name {
            host: host.to_owned(),
            port,
        })
    }

    /// The address to send the next query to: the IP given, or the first address the named
    /// resolver was looked up to (looking it up now if nothing is known).
    async fn resolver_addr(&self) -> Result<SocketAddr, DiscoveryError> {
        let (host, port) = match &self.resolver {
            ResolverAddress::Ip(addr) => return Ok(*addr),
            ResolverAddress::Name { host, port } => (host, *port),
        };
        if let Some(addr) = self.known_addrs().first() {
            return Ok(*addr);
        }
        let failed = |reason: String| DiscoveryError::DnsResolverLookup {
            resolver: format!("{host}:{port}"),
            reason,
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| failed(e.to_string()))?
            .collect();
        let first = *addrs
            .first()
            .ok_or_else(|| failed("the name has no addresses".to_owned()))?;
        *self.known_addrs() = addrs;
        Ok(first)
    }

    fn known_addrs(&self) -> std::sync::MutexGuard<'_, Vec<SocketAddr>> {
        self.resolved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After an exchange with `addr` got no answer, a named resolver's next attempt goes to
    /// its next address, and once none is left, to a fresh lookup of the name.
    fn forget(&self, addr: SocketAddr) {
        if matches!(self.resolver, ResolverAddress::Name { .. }) {
            self.known_addrs().retain(|a| *a != addr);
        }
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let results = futures::future::join_all(self.hosts.iter().map(|host| async move {
            tokio::time::timeout(self.name_deadline, self.resolve(host))
                .await
                .unwrap_or_else(|_| {
                    Err(DiscoveryError::DnsTimeout {
                        host: host.clone(),
                        after: self.name_deadline,
                    })
                })
        }))
        .await;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for result in results {
            match result {
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
        if errors.is_empty() {
            return Ok(out);
        }
        let all_failed = DiscoveryError::DnsAllFailed(errors);
        if out.is_empty() {
            return Err(all_failed);
        }
        // A partial resolution is a success, but the names that failed must not vanish
        // silently: one line per listing says which.
        let text = all_failed.to_string();
        let failures = text
            .strip_prefix("resolving every discovery host failed: ")
            .unwrap_or(&text);
        tracing::warn!(
            resolved = out.len(),
            failed = %Untrusted(failures),
            "some DNS names failed; listing the addresses of those that answered"
        );
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
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(name.clone(), RecordType::A));
        let id = query.metadata.id;
        let bytes = query.to_vec().map_err(|e| DiscoveryError::DnsQuery {
            host: host.to_owned(),
            reason: e.to_string(),
        })?;

        let resolver = self.resolver_addr().await?;
        let result = self.exchange_with(resolver, host, &bytes, id).await;
        if matches!(
            result,
            Err(DiscoveryError::DnsTimeout { .. } | DiscoveryError::DnsIo { .. })
        ) {
            self.forget(resolver);
        }
        result
    }

    async fn exchange_with(
        &self,
        resolver: SocketAddr,
        host: &str,
        bytes: &[u8],
        id: u16,
    ) -> Result<Vec<Ipv4Addr>, DiscoveryError> {
        let io = |error: std::io::Error| DiscoveryError::DnsIo {
            host: host.to_owned(),
            error,
        };
        let local: SocketAddr = if resolver.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).await.map_err(io)?;
        socket.connect(resolver).await.map_err(io)?;
        socket.send(bytes).await.map_err(io)?;

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

    /// Looks a named resolver up, so the first listing need not; a failure is only logged
    /// here, since every listing looks it up again while nothing is known.
    async fn start(&self) {
        if let ResolverAddress::Name { .. } = &self.resolver
            && let Err(e) = self.resolver_addr().await
        {
            tracing::warn!(error = %Untrusted(&e.to_string()), "looking up the DNS resolver failed; retrying at each listing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resolver_addresses() {
        let ip = |s: &str| ResolverAddress::Ip(s.parse().unwrap());
        let name = |h: &str, port| ResolverAddress::Name {
            host: h.to_owned(),
            port,
        };
        for (raw, want) in [
            ("10.0.0.2:5353", ip("10.0.0.2:5353")),
            ("10.0.0.2", ip("10.0.0.2:53")),
            ("[fd00::2]:53", ip("[fd00::2]:53")),
            ("fd00::2", ip("[fd00::2]:53")),
            ("[fd00::2]", ip("[fd00::2]:53")),
            ("localhost:5353", name("localhost", 5353)),
            ("resolver.internal", name("resolver.internal", 53)),
        ] {
            assert_eq!(Dns::parse_resolver(raw).unwrap(), want, "{raw}");
        }
        for bad in [
            "",
            ":53",
            "resolver:dns",
            "a:b:c",
            "re solver:53",
            "x\ny:53",
            "..:53",
        ] {
            assert!(Dns::parse_resolver(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_named_resolver_is_looked_up_again_after_an_exchange_got_no_answer() {
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let dns = Dns::new(
            vec!["orch.example".to_owned()],
            Dns::parse_resolver(&format!("localhost:{port}")).unwrap(),
            5008,
        )
        .with_exchange_timeout(Duration::from_millis(50))
        .with_attempts(1);
        dns.start().await;
        assert!(!dns.known_addrs().is_empty(), "looked up at start");
        assert!(dns.list_instances().await.is_err());
        assert!(
            dns.known_addrs().is_empty(),
            "a dead address is forgotten, so the next attempt looks the name up again"
        );
        assert!(dns.resolver_addr().await.is_ok());
        assert!(!dns.known_addrs().is_empty(), "looked up again");
    }

    #[test]
    fn names_response_codes() {
        assert_eq!(rcode_mnemonic(ResponseCode::ServFail), "SERVFAIL");
        assert_eq!(rcode_mnemonic(ResponseCode::Refused), "REFUSED");
        assert_eq!(rcode_mnemonic(ResponseCode::NXDomain), "NXDOMAIN");
    }
}
