//! The DNS lister against a real DNS server (hickory-server) on loopback.
#![cfg(feature = "discovery")]

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccfleet::discovery::{BACKEND_DNS, Discoverer, DiscoveryError, Dns};
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Header, HeaderCounts, Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::{A, CNAME};
use hickory_server::proto::rr::{Name, RData, Record};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::net::UdpSocket;

#[path = "support/logs.rs"]
mod logs;
use logs::Logs;

/// How the test server answers one name.
#[derive(Clone, Debug)]
enum Answer {
    /// NOERROR with these A records (none: an empty NOERROR).
    A(Vec<Ipv4Addr>),
    /// NOERROR with a CNAME and these A records, so non-A answers are exercised.
    CnameAndA(Vec<Ipv4Addr>),
    /// An error response code and no answers.
    Code(ResponseCode),
    /// `Code` for the first `n` queries of the name, then the inner answer.
    FailFirst(usize, ResponseCode, Box<Answer>),
    /// No response at all.
    Silent,
}

#[derive(Clone)]
struct Zone {
    answers: Arc<HashMap<String, Answer>>,
    queries: Arc<Mutex<HashMap<String, usize>>>,
}

impl Zone {
    fn queries(&self, name: &str) -> usize {
        self.queries
            .lock()
            .unwrap()
            .get(&fqdn(name))
            .copied()
            .unwrap_or(0)
    }
}

fn fqdn(name: &str) -> String {
    format!("{}.", name.trim_end_matches('.'))
}

#[async_trait]
impl RequestHandler for Zone {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let info = request.request_info().expect("one query per request");
        let name = info.query.name().to_string();
        let count = {
            let mut q = self.queries.lock().unwrap();
            let c = q.entry(name.clone()).or_default();
            *c += 1;
            *c
        };
        let mut answer = self
            .answers
            .get(&name)
            .cloned()
            .unwrap_or(Answer::Code(ResponseCode::NXDomain));
        if let Answer::FailFirst(n, code, then) = answer {
            answer = if count <= n {
                Answer::Code(code)
            } else {
                *then
            };
        }
        let owner = Name::from(info.query.name().clone());
        let builder = MessageResponseBuilder::from_message_request(request);
        let records: Vec<Record> = match &answer {
            Answer::A(ips) => ips
                .iter()
                .map(|ip| Record::from_rdata(owner.clone(), 60, RData::A(A(*ip))))
                .collect(),
            Answer::CnameAndA(ips) => {
                let target = Name::from_ascii("target.example.").unwrap();
                std::iter::once(Record::from_rdata(
                    owner.clone(),
                    60,
                    RData::CNAME(CNAME(target.clone())),
                ))
                .chain(
                    ips.iter()
                        .map(|ip| Record::from_rdata(target.clone(), 60, RData::A(A(*ip)))),
                )
                .collect()
            }
            Answer::Code(code) => {
                return response
                    .send_response(builder.error_msg(&request.metadata, *code))
                    .await
                    .expect("send error response");
            }
            Answer::Silent => {
                return ResponseInfo::from(Header {
                    metadata: Metadata::response_from_request(&request.metadata),
                    counts: HeaderCounts::default(),
                });
            }
            Answer::FailFirst(..) => unreachable!("resolved above"),
        };
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = ResponseCode::NoError;
        metadata.authoritative = true;
        response
            .send_response(builder.build(metadata, records.iter(), [], [], []))
            .await
            .expect("send answer")
    }
}

/// A hickory DNS server on a free loopback UDP port answering from `answers`.
struct DnsServer {
    addr: SocketAddr,
    zone: Zone,
    _server: Server<Zone>,
}

async fn dns_server(answers: &[(&str, Answer)]) -> DnsServer {
    let zone = Zone {
        answers: Arc::new(answers.iter().map(|(n, a)| (fqdn(n), a.clone())).collect()),
        queries: Arc::default(),
    };
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let mut server = Server::new(zone.clone());
    server.register_socket(socket);
    DnsServer {
        addr,
        zone,
        _server: server,
    }
}

fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[tokio::test]
async fn one_a_record_becomes_one_instance() {
    let server = dns_server(&[("orch.service.consul", Answer::A(vec![ip("10.0.0.1")]))]).await;
    let dns = Dns::new(hosts(&["orch.service.consul"]), server.addr, 5008);
    let got = dns.list_instances().await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].address(), "10.0.0.1:5008");
    assert_eq!(got[0].workload_id, "10.0.0.1:5008");
    assert_eq!(got[0].node_id, "", "DNS knows no machine");
    assert_eq!(got[0].backend, BACKEND_DNS);
}

#[tokio::test]
async fn addresses_are_deduplicated_across_names_and_other_records_ignored() {
    let server = dns_server(&[
        ("a.example", Answer::A(vec![ip("10.0.0.1"), ip("10.0.0.2")])),
        (
            "b.example",
            Answer::CnameAndA(vec![ip("10.0.0.2"), ip("10.0.0.3")]),
        ),
    ])
    .await;
    let dns = Dns::new(hosts(&["a.example", "b.example"]), server.addr, 6123);
    let got: Vec<String> = dns
        .list_instances()
        .await
        .unwrap()
        .iter()
        .map(|i| i.address())
        .collect();
    assert_eq!(got, ["10.0.0.1:6123", "10.0.0.2:6123", "10.0.0.3:6123"]);
}

#[tokio::test]
async fn empty_noerror_is_an_empty_set_not_an_error() {
    let server = dns_server(&[("empty.example", Answer::A(vec![]))]).await;
    let dns = Dns::new(hosts(&["empty.example"]), server.addr, 5008);
    assert_eq!(dns.list_instances().await.unwrap(), vec![]);
    assert_eq!(
        server.zone.queries("empty.example"),
        1,
        "no retry on success"
    );
}

#[tokio::test]
async fn servfail_is_an_error_after_every_attempt() {
    let server = dns_server(&[("broken.example", Answer::Code(ResponseCode::ServFail))]).await;
    let dns = Dns::new(hosts(&["broken.example"]), server.addr, 5008);
    let err = dns.list_instances().await.unwrap_err();
    let DiscoveryError::DnsAllFailed(errors) = &err else {
        panic!("expected DnsAllFailed, got {err:?}");
    };
    assert!(
        matches!(&errors[..], [DiscoveryError::DnsResponseCode { host, rcode }] if host == "broken.example" && rcode == "SERVFAIL"),
        "{errors:?}"
    );
    let text = err.to_string();
    assert!(text.contains("SERVFAIL"), "{text}");
    assert!(text.contains("broken.example"), "{text}");
    assert_eq!(server.zone.queries("broken.example"), 3);
}

#[tokio::test]
async fn nxdomain_and_refused_are_errors() {
    let server = dns_server(&[("refused.example", Answer::Code(ResponseCode::Refused))]).await;
    let dns = Dns::new(
        hosts(&["refused.example", "unknown.example"]),
        server.addr,
        5008,
    )
    .with_attempts(1);
    let text = dns.list_instances().await.unwrap_err().to_string();
    assert!(text.contains("REFUSED"), "{text}");
    assert!(text.contains("NXDOMAIN"), "{text}");
}

#[tokio::test]
async fn a_transient_servfail_is_retried() {
    let server = dns_server(&[(
        "flaky.example",
        Answer::FailFirst(
            2,
            ResponseCode::ServFail,
            Box::new(Answer::A(vec![ip("10.0.0.7")])),
        ),
    )])
    .await;
    let dns = Dns::new(hosts(&["flaky.example"]), server.addr, 5008);
    let got = dns.list_instances().await.unwrap();
    assert_eq!(got[0].address(), "10.0.0.7:5008");
    assert_eq!(server.zone.queries("flaky.example"), 3);
}

#[tokio::test]
async fn partial_failure_is_a_success_with_what_resolved() {
    let server = dns_server(&[
        ("up.example", Answer::A(vec![ip("10.0.0.1")])),
        ("down.example", Answer::Code(ResponseCode::ServFail)),
        ("mute.example", Answer::Silent),
    ])
    .await;
    let dns = Dns::new(
        hosts(&["down.example", "up.example", "mute.example"]),
        server.addr,
        5008,
    )
    .with_exchange_timeout(Duration::from_millis(200));
    let got = dns.list_instances().await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].address(), "10.0.0.1:5008");
    assert_eq!(server.zone.queries("down.example"), 3);
    assert_eq!(server.zone.queries("mute.example"), 3);
}

#[tokio::test]
async fn total_failure_names_every_failed_host() {
    let server = dns_server(&[
        ("one.example", Answer::Code(ResponseCode::ServFail)),
        ("two.example", Answer::Silent),
    ])
    .await;
    let dns = Dns::new(hosts(&["one.example", "two.example"]), server.addr, 5008)
        .with_exchange_timeout(Duration::from_millis(200));
    let err = dns.list_instances().await.unwrap_err();
    let DiscoveryError::DnsAllFailed(errors) = &err else {
        panic!("expected DnsAllFailed, got {err:?}");
    };
    assert_eq!(errors.len(), 2);
    assert!(
        matches!(&errors[0], DiscoveryError::DnsResponseCode { host, .. } if host == "one.example")
    );
    assert!(matches!(&errors[1], DiscoveryError::DnsTimeout { host, .. } if host == "two.example"));
    let text = err.to_string();
    assert!(
        text.starts_with("resolving every discovery host failed"),
        "{text}"
    );
}

#[tokio::test]
async fn a_dead_resolver_is_an_error_after_the_configured_attempts() {
    // Bound, so queries are not refused by the kernel, but never answered.
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dns = Dns::new(hosts(&["orch.example"]), silent.local_addr().unwrap(), 5008)
        .with_exchange_timeout(Duration::from_millis(150));
    let err = dns.list_instances().await.unwrap_err();
    let DiscoveryError::DnsAllFailed(errors) = &err else {
        panic!("expected DnsAllFailed, got {err:?}");
    };
    assert!(
        matches!(&errors[..], [DiscoveryError::DnsTimeout { host, after }] if host == "orch.example" && *after == Duration::from_millis(150)),
        "{errors:?}"
    );
    // Every attempt reached the resolver: three queries, each a fresh exchange.
    let mut buf = [0u8; 512];
    let mut ids = std::collections::HashSet::new();
    for _ in 0..3 {
        let (n, _) = tokio::time::timeout(Duration::from_secs(1), silent.recv_from(&mut buf))
            .await
            .expect("a query was sent")
            .unwrap();
        assert!(n > 12);
        ids.insert(u16::from_be_bytes([buf[0], buf[1]]));
    }
    assert!(ids.len() >= 2, "each attempt carries its own query id");
}

#[tokio::test(start_paused = true)]
async fn a_dead_resolver_costs_three_two_second_exchanges_five_ms_apart() {
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dns = Dns::new(hosts(&["orch.example"]), silent.local_addr().unwrap(), 5008);
    let t0 = tokio::time::Instant::now();
    let err = dns.list_instances().await.unwrap_err();
    let elapsed = t0.elapsed();
    assert!(
        matches!(&err, DiscoveryError::DnsAllFailed(e) if matches!(&e[..], [DiscoveryError::DnsTimeout { after, .. }] if *after == Duration::from_secs(2))),
        "{err:?}"
    );
    // 3 x 2 s plus two 5 ms pauses, on the paused clock (timers round up to the millisecond).
    assert!(
        elapsed >= Duration::from_millis(6010) && elapsed < Duration::from_millis(6050),
        "{elapsed:?}"
    );
}

#[test]
fn defaults_match_the_reference() {
    assert_eq!(
        ccfleet::discovery::DNS_EXCHANGE_TIMEOUT,
        Duration::from_secs(2)
    );
    assert_eq!(ccfleet::discovery::DNS_ATTEMPTS, 3);
    assert_eq!(ccfleet::discovery::DNS_RETRY_WAIT, Duration::from_millis(5));
}

#[tokio::test]
async fn a_resolver_given_by_host_name_and_port_is_looked_up() {
    let server = dns_server(&[("orch.example", Answer::A(vec![ip("10.0.0.1")]))]).await;
    let resolver = format!("localhost:{}", server.addr.port());
    let config = ccfleet::discovery::provider::Config::from_env_map(
        "SD_",
        [
            ("SD_PROVIDER", "DNS"),
            ("SD_DNS_QUERY", "orch.example"),
            ("SD_DNS_RESOLVER_ADDRESS", resolver.as_str()),
        ],
    )
    .unwrap();
    let provider =
        ccfleet::discovery::provider::new(&config).expect("a named resolver is accepted");
    provider.start().await;
    let got = tokio::time::timeout(Duration::from_secs(8), async {
        loop {
            match provider.list_instances().await {
                Err(e) if e.is_not_yet_synced() => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                other => return other,
            }
        }
    })
    .await
    .expect("the first refresh completes");
    provider.stop().await;
    let got = got.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].address(), "10.0.0.1:5008");
    assert_eq!(server.zone.queries("orch.example"), 1);
}

#[test]
fn resolver_addresses_accept_ips_and_host_names_with_port_53_by_default() {
    use ccfleet::discovery::ResolverAddress;
    assert_eq!(
        Dns::parse_resolver("10.0.0.2").unwrap(),
        ResolverAddress::Ip("10.0.0.2:53".parse().unwrap())
    );
    assert_eq!(
        Dns::parse_resolver("localhost:5353").unwrap(),
        ResolverAddress::Name {
            host: "localhost".into(),
            port: 5353
        }
    );
    assert_eq!(
        Dns::parse_resolver("resolver.internal").unwrap(),
        ResolverAddress::Name {
            host: "resolver.internal".into(),
            port: 53
        }
    );
    for bad in ["resolver:dns", "a:b:c", ":53", "two words"] {
        let err = Dns::parse_resolver(bad).unwrap_err();
        assert!(
            matches!(
                err,
                DiscoveryError::InvalidSetting {
                    name: "DNS_RESOLVER_ADDRESS",
                    ..
                }
            ),
            "{bad:?}: {err:?}"
        );
        assert!(err.to_string().contains("host:port"), "{err}");
    }
}

#[tokio::test]
async fn a_resolver_name_that_does_not_resolve_is_an_error_naming_it() {
    let dns = Dns::new(
        hosts(&["orch.example"]),
        Dns::parse_resolver("no-such-resolver.invalid:53").unwrap(),
        5008,
    );
    let err = dns.list_instances().await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no-such-resolver.invalid:53"), "{text}");
}

#[tokio::test]
async fn a_silent_name_costs_only_itself_inside_the_refresh() {
    let server = dns_server(&[
        ("up.example", Answer::A(vec![ip("10.0.0.1")])),
        ("mute1.example", Answer::Silent),
        ("mute2.example", Answer::Silent),
        ("mute3.example", Answer::Silent),
        ("mute4.example", Answer::Silent),
    ])
    .await;
    // Four silent names at 3 x 250 ms each take 3 s one after the other, more than the
    // refresh may take; side by side they take 750 ms and the answered name gets through.
    let dns = Dns::new(
        hosts(&[
            "mute1.example",
            "mute2.example",
            "up.example",
            "mute3.example",
            "mute4.example",
        ]),
        server.addr,
        5008,
    )
    .with_exchange_timeout(Duration::from_millis(250));
    let cached = ccfleet::discovery::Cached::with_timing(
        Arc::new(dns),
        Duration::from_secs(3600),
        Duration::from_secs(2),
    );
    cached.refresh().await.expect("the refresh completes");
    let got = cached.list_instances().await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].address(), "10.0.0.1:5008");
}

#[tokio::test]
async fn each_name_has_its_own_deadline_and_a_late_one_is_a_partial_failure() {
    let server = dns_server(&[
        ("up.example", Answer::A(vec![ip("10.0.0.1")])),
        ("mute.example", Answer::Silent),
    ])
    .await;
    let (logs, _guard) = Logs::capture();
    let dns = Dns::new(hosts(&["mute.example", "up.example"]), server.addr, 5008)
        .with_name_deadline(Duration::from_millis(300));
    let got = dns.list_instances().await.unwrap();
    assert_eq!(got.len(), 1, "the answered name is listed");
    // The exchange timeout is 2 s; the name's deadline cut it after 300 ms.
    assert_eq!(server.zone.queries("mute.example"), 1);
    let warnings: Vec<String> = logs
        .lines()
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("mute.example"), "{warnings:?}");
    assert!(warnings[0].contains("300ms"), "{warnings:?}");

    let alone = Dns::new(hosts(&["mute.example"]), server.addr, 5008)
        .with_name_deadline(Duration::from_millis(300));
    let err = alone.list_instances().await.unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::DnsAllFailed(e) if matches!(&e[..], [DiscoveryError::DnsTimeout { host, after }] if host == "mute.example" && *after == Duration::from_millis(300))),
        "{err:?}"
    );
}

#[test]
fn the_name_deadline_stays_under_the_refresh_timeout() {
    assert!(ccfleet::discovery::DNS_NAME_DEADLINE < ccfleet::discovery::CACHE_REFRESH_INTERVAL);
    let per_name = ccfleet::discovery::DNS_EXCHANGE_TIMEOUT * ccfleet::discovery::DNS_ATTEMPTS
        + ccfleet::discovery::DNS_RETRY_WAIT * (ccfleet::discovery::DNS_ATTEMPTS - 1);
    assert!(per_name <= ccfleet::discovery::DNS_NAME_DEADLINE);
}
