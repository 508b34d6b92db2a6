//! Provider selection from configuration, and the configuration-free sources: static lists,
//! the local instance and the fleet's rosters.
#![cfg(feature = "discovery")]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::get;
use ccfleet::discovery::provider::{self, Config, Kind};
use ccfleet::discovery::{
    BACKEND_FLEET, BACKEND_LOCAL, BACKEND_STATIC, Discoverer, DiscoveryError, FleetRosters,
    Instance, Local, Static,
};
use ccfleet::wire::{Provider, ServiceType};
use serde_json::{Value, json};
use tokio::sync::watch;

const PROMPTLY: Duration = Duration::from_secs(8);

/// What the Nomad agent saw: the token and the query of each request.
type Seen = Arc<Mutex<Vec<(Option<String>, HashMap<String, String>)>>>;

fn config(prefix: &str, vars: &[(&str, &str)]) -> Result<Config, DiscoveryError> {
    Config::from_env_map(
        prefix,
        vars.iter()
            .map(|(k, v)| (format!("{prefix}{k}"), v.to_string())),
    )
}

fn build(vars: &[(&str, &str)]) -> Result<Arc<dyn Discoverer>, DiscoveryError> {
    provider::new(&config("SD_", vars)?)
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn env_names_are_the_documented_ones() {
    assert_eq!(
        provider::ENV_NAMES,
        [
            "PROVIDER",
            "PORT",
            "DNS_QUERY",
            "DNS_RESOLVER_ADDRESS",
            "K8S_API_ENDPOINT",
            "K8S_API_INSECURE",
            "POD_NAMESPACE",
            "POD_LABELS",
            "HOST_IP",
            "STATIC",
            "NOMAD_ENDPOINT",
            "NOMAD_TOKEN",
        ]
    );
    assert_eq!(provider::NOMAD_K8S_PODS_PROVIDER, "NOMAD+K8S-PODS");
}

#[test]
fn settings_are_read_under_the_prefix_only() {
    let c = Config::from_env_map(
        "SD_ORCHESTRATOR_",
        [
            ("SD_ORCHESTRATOR_PROVIDER", "dns"),
            ("SD_ORCHESTRATOR_DNS_QUERY", " a.example , ,b.example "),
            ("SD_ORCHESTRATOR_DNS_RESOLVER_ADDRESS", "10.0.0.2:53"),
            ("SD_ORCHESTRATOR_HOST_IP", "T"),
            ("SD_ORCHESTRATOR_STATIC", ""),
            // Another consumer's settings are not ours.
            ("SD_EDGE_PORT", "6000"),
            ("PORT", "7000"),
        ],
    )
    .unwrap();
    assert_eq!(c.provider, "dns");
    assert_eq!(c.kind().unwrap(), Kind::Dns);
    assert_eq!(c.port, 5008, "PORT defaults to 5008");
    assert_eq!(c.dns_query, ["a.example", "b.example"]);
    assert_eq!(c.dns_resolver_address, "10.0.0.2:53");
    assert!(c.host_ip);
    assert!(c.static_endpoints.is_empty());
}

#[test]
fn from_env_reads_the_process_environment_under_the_prefix() {
    let err = Config::from_env("CCFLEET_TEST_SURELY_UNSET_").unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::MissingProvider { name } if name == "CCFLEET_TEST_SURELY_UNSET_PROVIDER"),
        "{err:?}"
    );
}

#[test]
fn config_also_deserializes_from_a_kebab_case_section() {
    let c: Config = serde_json::from_value(json!({
        "provider": "STATIC",
        "port": 6123,
        "static-endpoints": ["10.0.0.1"],
        "host-ip": true
    }))
    .unwrap();
    assert_eq!(c.port, 6123);
    assert_eq!(c.static_endpoints, ["10.0.0.1"]);
    assert!(c.host_ip);
    let unknown = serde_json::from_value::<Config>(json!({"provider": "STATIC", "statik": []}));
    assert!(unknown.is_err(), "unknown keys are rejected");
}

#[tokio::test]
async fn every_provider_is_selected_case_insensitively_and_cached_except_static() {
    let nomad = format!("http://127.0.0.1:{}", closed_port());
    let k8s = format!("http://127.0.0.1:{}", closed_port());
    let dns = [
        ("DNS_RESOLVER_ADDRESS", "127.0.0.1:53"),
        ("DNS_QUERY", "orch.example"),
    ];
    let k8s_settings = [
        ("K8S_API_ENDPOINT", k8s.as_str()),
        ("K8S_API_INSECURE", "true"),
        ("POD_NAMESPACE", "fleet"),
        ("POD_LABELS", "app=ccms"),
    ];
    let nomad_settings = [("NOMAD_ENDPOINT", nomad.as_str()), ("NOMAD_TOKEN", "t0k3n")];

    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("DNS", dns.to_vec()),
        ("dns", dns.to_vec()),
        ("K8S-PODS", k8s_settings.to_vec()),
        ("k8s-pods", k8s_settings.to_vec()),
        ("NOMAD", nomad_settings.to_vec()),
        ("Nomad", nomad_settings.to_vec()),
        (
            "NOMAD+K8S-PODS",
            [nomad_settings.as_slice(), k8s_settings.as_slice()].concat(),
        ),
        (
            "nomad+k8s-pods",
            [nomad_settings.as_slice(), k8s_settings.as_slice()].concat(),
        ),
    ];
    for (provider, settings) in cases {
        let mut vars = settings.clone();
        vars.push(("PROVIDER", provider));
        if provider.to_ascii_uppercase().contains("K8S") && !cfg!(feature = "kubernetes") {
            let err = build(&vars).err().expect("kubernetes is not built in");
            assert!(
                matches!(err, DiscoveryError::KubernetesUnavailable(_)),
                "{err:?}"
            );
            continue;
        }
        let d = build(&vars).unwrap_or_else(|e| panic!("{provider}: {e}"));
        let err = d.list_instances().await.unwrap_err();
        assert!(
            err.is_not_yet_synced(),
            "{provider}: cached and not started, got {err:?}"
        );
    }

    for provider in ["STATIC", "static"] {
        let d = build(&[("PROVIDER", provider), ("STATIC", "10.0.0.1,10.0.0.2")]).unwrap();
        let got: Vec<String> = d
            .list_instances()
            .await
            .unwrap()
            .iter()
            .map(Instance::address)
            .collect();
        assert_eq!(
            got,
            ["10.0.0.1:5008", "10.0.0.2:5008"],
            "{provider}: not cached"
        );
    }
}

#[tokio::test]
async fn every_missing_or_invalid_setting_is_a_named_error() {
    let nomad = [
        ("NOMAD_ENDPOINT", "http://127.0.0.1:4646"),
        ("NOMAD_TOKEN", "t"),
    ];
    let with_nomad = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        [nomad.as_slice(), extra].concat()
    };
    type Check = fn(&DiscoveryError) -> bool;
    type Case = (&'static str, Vec<(&'static str, &'static str)>, Check);
    let cases: Vec<Case> = vec![
        (
            "no provider",
            vec![],
            |e| matches!(e, DiscoveryError::MissingProvider { name } if name == "SD_PROVIDER"),
        ),
        (
            "unknown provider",
            vec![("PROVIDER", "CONSUL")],
            |e| matches!(e, DiscoveryError::UnsupportedProvider(p) if p == "CONSUL"),
        ),
        (
            "dns without resolver",
            vec![("PROVIDER", "DNS"), ("DNS_QUERY", "a")],
            |e| matches!(e, DiscoveryError::MissingDnsResolver),
        ),
        (
            "dns without query",
            vec![("PROVIDER", "DNS"), ("DNS_RESOLVER_ADDRESS", "10.0.0.2")],
            |e| matches!(e, DiscoveryError::MissingDnsQuery),
        ),
        (
            "dns with a malformed resolver",
            vec![
                ("PROVIDER", "DNS"),
                ("DNS_QUERY", "a"),
                ("DNS_RESOLVER_ADDRESS", "resolver.local:dns"),
            ],
            |e| {
                matches!(
                    e,
                    DiscoveryError::InvalidSetting {
                        name: "DNS_RESOLVER_ADDRESS",
                        ..
                    }
                )
            },
        ),
        (
            "k8s without namespace",
            vec![("PROVIDER", "K8S-PODS"), ("POD_LABELS", "app=x")],
            |e| matches!(e, DiscoveryError::MissingPodNamespace),
        ),
        (
            "k8s without labels",
            vec![("PROVIDER", "K8S-PODS"), ("POD_NAMESPACE", "fleet")],
            |e| matches!(e, DiscoveryError::MissingPodLabels),
        ),
        (
            "k8s with a bad endpoint",
            vec![
                ("PROVIDER", "K8S-PODS"),
                ("POD_NAMESPACE", "fleet"),
                ("POD_LABELS", "app=x"),
                ("K8S_API_ENDPOINT", "https://user:secret@k8s.example"),
            ],
            |e| {
                matches!(
                    e,
                    DiscoveryError::InvalidSetting {
                        name: "K8S_API_ENDPOINT",
                        ..
                    }
                ) || (!cfg!(feature = "kubernetes")
                    && matches!(e, DiscoveryError::KubernetesUnavailable(_)))
            },
        ),
        (
            "k8s with a plain http endpoint",
            vec![
                ("PROVIDER", "K8S-PODS"),
                ("POD_NAMESPACE", "fleet"),
                ("POD_LABELS", "app=x"),
                ("K8S_API_ENDPOINT", "http://k8s.example:8001"),
            ],
            |e| {
                matches!(e, DiscoveryError::InvalidSetting { name: "K8S_API_ENDPOINT", reason } if reason.contains("K8S_API_INSECURE"))
                    || (!cfg!(feature = "kubernetes")
                        && matches!(e, DiscoveryError::KubernetesUnavailable(_)))
            },
        ),
        (
            "k8s insecure not a boolean",
            vec![
                ("PROVIDER", "K8S-PODS"),
                ("POD_NAMESPACE", "fleet"),
                ("POD_LABELS", "app=x"),
                ("K8S_API_INSECURE", "maybe"),
            ],
            |e| {
                matches!(
                    e,
                    DiscoveryError::InvalidSetting {
                        name: "K8S_API_INSECURE",
                        ..
                    }
                )
            },
        ),
        (
            "local is not a provider",
            vec![("PROVIDER", "LOCAL"), ("STATIC", "10.0.0.1")],
            |e| {
                matches!(e, DiscoveryError::UnsupportedProvider(p) if p == "LOCAL")
                    && e.to_string()
                        .contains("PROVIDER=STATIC with STATIC=host:port")
            },
        ),
        (
            "static with too many colons",
            vec![("PROVIDER", "STATIC"), ("STATIC", "10.0.0.1,a:b:c")],
            |e| {
                matches!(e, DiscoveryError::InvalidAddress { backend: "static", address, .. } if address == "a:b:c")
                    && e.to_string().contains("[address]:port")
            },
        ),
        (
            "nomad without endpoint",
            vec![("PROVIDER", "NOMAD"), ("NOMAD_TOKEN", "t")],
            |e| matches!(e, DiscoveryError::MissingNomadEndpoint),
        ),
        (
            "nomad without token",
            vec![
                ("PROVIDER", "NOMAD"),
                ("NOMAD_ENDPOINT", "http://127.0.0.1:4646"),
            ],
            |e| matches!(e, DiscoveryError::MissingNomadToken),
        ),
        (
            "nomad with a bad endpoint",
            vec![
                ("PROVIDER", "NOMAD"),
                ("NOMAD_ENDPOINT", "nomad:4646"),
                ("NOMAD_TOKEN", "t"),
            ],
            |e| {
                matches!(
                    e,
                    DiscoveryError::InvalidSetting {
                        name: "NOMAD_ENDPOINT",
                        ..
                    }
                )
            },
        ),
        (
            "composed without nomad",
            vec![
                ("PROVIDER", "NOMAD+K8S-PODS"),
                ("POD_NAMESPACE", "fleet"),
                ("POD_LABELS", "app=x"),
            ],
            |e| matches!(e, DiscoveryError::MissingNomadEndpoint),
        ),
        (
            "composed without namespace",
            with_nomad(&[("PROVIDER", "NOMAD+K8S-PODS"), ("POD_LABELS", "app=x")]),
            |e| matches!(e, DiscoveryError::MissingPodNamespace),
        ),
        (
            "composed without labels",
            with_nomad(&[("PROVIDER", "NOMAD+K8S-PODS"), ("POD_NAMESPACE", "fleet")]),
            |e| matches!(e, DiscoveryError::MissingPodLabels),
        ),
        (
            "static without entries",
            vec![("PROVIDER", "STATIC")],
            |e| matches!(e, DiscoveryError::MissingStaticEndpoints),
        ),
        (
            "static with a bad entry",
            vec![("PROVIDER", "STATIC"), ("STATIC", "10.0.0.1:grpc")],
            |e| {
                matches!(
                    e,
                    DiscoveryError::InvalidAddress {
                        backend: "static",
                        ..
                    }
                )
            },
        ),
        (
            "port not a number",
            vec![("PROVIDER", "STATIC"), ("STATIC", "a"), ("PORT", "grpc")],
            |e| matches!(e, DiscoveryError::InvalidSetting { name: "PORT", .. }),
        ),
        (
            "port out of range",
            vec![("PROVIDER", "STATIC"), ("STATIC", "a"), ("PORT", "70000")],
            |e| matches!(e, DiscoveryError::InvalidSetting { name: "PORT", .. }),
        ),
        (
            "host ip not a boolean",
            vec![("PROVIDER", "STATIC"), ("STATIC", "a"), ("HOST_IP", "yes")],
            |e| {
                matches!(
                    e,
                    DiscoveryError::InvalidSetting {
                        name: "HOST_IP",
                        ..
                    }
                )
            },
        ),
    ];
    for (name, vars, check) in cases {
        match build(&vars) {
            Ok(_) => panic!("{name}: built a provider"),
            Err(e) => {
                assert!(check(&e), "{name}: unexpected {e:?}");
                let text = e.to_string();
                assert!(!text.contains("secret"), "{name}: {text}");
            }
        }
    }
}

#[test]
fn missing_setting_messages_name_the_variable() {
    assert_eq!(
        DiscoveryError::MissingNomadToken.to_string(),
        "missing Nomad token (NOMAD_TOKEN)"
    );
    assert_eq!(
        DiscoveryError::MissingDnsResolver.to_string(),
        "missing DNS resolver address (DNS_RESOLVER_ADDRESS)"
    );
}

/// A Nomad agent serving one allocation and remembering tokens and filters.
async fn nomad_agent(seen: Seen) -> SocketAddr {
    async fn allocations(
        State(seen): State<Seen>,
        headers: HeaderMap,
        Query(q): Query<HashMap<String, String>>,
    ) -> Json<Value> {
        let token = headers
            .get("x-nomad-token")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.lock().unwrap().push((token, q));
        Json(
            json!([{"ID": "alloc-1", "NodeName": "node-a", "JobID": "orchestrator",
            "AllocatedResources": {"Shared": {"Networks": [{"IP": "10.0.0.1"}]}}}]),
        )
    }
    let router = Router::new()
        .route("/v1/allocations", get(allocations))
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn eventually<T>(
    d: &dyn Discoverer,
    f: impl Fn(&Result<Vec<Instance>, DiscoveryError>) -> Option<T>,
) -> T {
    tokio::time::timeout(PROMPTLY, async {
        loop {
            if let Some(t) = f(&d.list_instances().await) {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the provider reaches the expected state")
}

#[tokio::test]
async fn the_nomad_provider_lists_allocations_with_the_token_after_start() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = nomad_agent(seen.clone()).await;
    let endpoint = format!("http://{addr}");
    let d = build(&[
        ("PROVIDER", "nomad"),
        ("NOMAD_ENDPOINT", &endpoint),
        ("NOMAD_TOKEN", "t0k3n"),
        ("PORT", "6123"),
    ])
    .unwrap();
    d.start().await;
    let got = eventually(d.as_ref(), |r| r.as_ref().ok().cloned()).await;
    d.stop().await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].address(), "10.0.0.1:6123");
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].0.as_deref(), Some("t0k3n"));
    assert_eq!(
        seen[0].1.get("filter").map(String::as_str),
        Some(ccfleet::discovery::FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS)
    );
}

#[cfg(feature = "kubernetes")]
#[tokio::test]
async fn the_composed_provider_reports_a_dead_kubernetes_side() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = nomad_agent(seen.clone()).await;
    let nomad = format!("http://{addr}");
    let k8s = format!("http://127.0.0.1:{}", closed_port());
    let d = build(&[
        ("PROVIDER", "nomad+k8s-pods"),
        ("NOMAD_ENDPOINT", &nomad),
        ("NOMAD_TOKEN", "t0k3n"),
        ("K8S_API_ENDPOINT", &k8s),
        ("K8S_API_INSECURE", "true"),
        ("POD_NAMESPACE", "fleet"),
        ("POD_LABELS", "app=ccms"),
    ])
    .unwrap();
    d.start().await;
    let text = eventually(d.as_ref(), |r| match r {
        Err(e) if !e.is_not_yet_synced() => Some(e.to_string()),
        _ => None,
    })
    .await;
    d.stop().await;
    assert!(text.starts_with("fallback discovery failed: "), "{text}");
    assert!(text.contains("listing kubernetes pods"), "{text}");
    assert!(!seen.lock().unwrap().is_empty(), "nomad was polled");
}

#[tokio::test]
async fn static_entries_keep_their_own_ports() {
    let s = Static::new(
        &[
            "10.0.0.1",
            "10.0.0.2:6123",
            "[fd00::3]:7000",
            "fd00::4",
            "orch.internal",
        ],
        5008,
    )
    .unwrap();
    let got = s.list_instances().await.unwrap();
    let ids: Vec<&str> = got.iter().map(|i| i.workload_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "10.0.0.1:5008",
            "10.0.0.2:6123",
            "[fd00::3]:7000",
            "[fd00::4]:5008",
            "orch.internal:5008"
        ]
    );
    assert!(
        got.iter()
            .all(|i| i.node_id.is_empty() && i.backend == BACKEND_STATIC)
    );
    assert_eq!(got[2].ip_address, "fd00::3");
    for bad in ["", ":5008", "10.0.0.1:70000", "[::1", "a:b:c", "node:1:2"] {
        assert!(
            matches!(
                Static::new(&[bad], 5008),
                Err(DiscoveryError::InvalidAddress { .. })
            ),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn local_is_one_instance_with_the_local_identity() {
    for (addr, want) in [
        ("10.0.0.1:6123", "10.0.0.1:6123"),
        ("10.0.0.1", "10.0.0.1:5008"),
        ("orchestrator:6123", "orchestrator:6123"),
        ("[::1]:6123", "[::1]:6123"),
    ] {
        let got = Local::new(addr, 5008)
            .unwrap()
            .list_instances()
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].address(), want);
        assert_eq!(got[0].workload_id, "local");
        assert_eq!(got[0].node_id, "local");
        assert_eq!(got[0].backend, BACKEND_LOCAL);
    }
    for bad in ["", ":6123", ":70000", ":grpc", "a:b:c"] {
        let err = Local::new(bad, 5008).unwrap_err();
        assert!(
            matches!(
                err,
                DiscoveryError::InvalidAddress {
                    backend: "local",
                    ..
                }
            ),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn local_takes_its_default_port_from_orchestrator_port() {
    if std::env::var_os("CCFLEET_TEST_CHILD").is_some() {
        let got = Local::with_orchestrator_port("10.0.0.1")
            .unwrap()
            .list_instances()
            .await
            .unwrap();
        assert_eq!(got[0].address(), "10.0.0.1:6123");
        let own = Local::with_orchestrator_port("10.0.0.1:7000")
            .unwrap()
            .list_instances()
            .await
            .unwrap();
        assert_eq!(own[0].address(), "10.0.0.1:7000", "an explicit port wins");
        return;
    }
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "local_takes_its_default_port_from_orchestrator_port",
            "--exact",
            "--test-threads=1",
        ])
        .env("CCFLEET_TEST_CHILD", "1")
        .env("ORCHESTRATOR_PORT", "6123")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn provider(service_type: ServiceType, hostname: &str, meta: &[(&str, &str)]) -> Provider {
    Provider {
        service_type: service_type.into(),
        hostname: hostname.to_owned(),
        state: "active".to_owned(),
        meta: meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    }
}

#[tokio::test]
async fn fleet_rosters_map_providers_to_instances() {
    let (tx, rx) = watch::channel(vec![
        provider(ServiceType::MetricStore, "node01", &[("port", "8082")]),
        provider(
            ServiceType::MetricStore,
            "node02",
            &[("address", "10.0.0.2")],
        ),
        provider(
            ServiceType::MetricCollector,
            "node03",
            &[("ip", "10.0.0.3"), ("port", "bad")],
        ),
        provider(
            ServiceType::Backend,
            "node04",
            &[("address", "10.0.0.4:8080")],
        ),
    ]);
    let fleet = FleetRosters::new(rx, 5008);
    let got = fleet.list_instances().await.unwrap();
    let want = |id: &str, node: &str, ip: &str, port: u16| Instance {
        workload_id: id.to_owned(),
        node_id: node.to_owned(),
        ip_address: ip.to_owned(),
        port,
        backend: BACKEND_FLEET.to_owned(),
    };
    assert_eq!(
        got,
        vec![
            want("ccms/node01", "node01", "node01", 8082),
            want("ccms/node02", "node02", "10.0.0.2", 5008),
            want("ccmc/node03", "node03", "10.0.0.3", 5008),
            want("ccb/node04", "node04", "10.0.0.4", 8080),
        ]
    );

    // The latest roster wins; nothing queues.
    tx.send(vec![provider(ServiceType::EventStore, "node05", &[])])
        .unwrap();
    tx.send(vec![provider(ServiceType::EventStore, "node06", &[])])
        .unwrap();
    let got = fleet.list_instances().await.unwrap();
    assert_eq!(got, vec![want("cces/node06", "node06", "node06", 5008)]);

    drop(tx);
    let err = fleet.list_instances().await.unwrap_err();
    assert!(matches!(err, DiscoveryError::FleetClosed), "{err:?}");
}

#[tokio::test]
async fn fleet_rosters_can_wait_for_the_first_roster_and_filter_types() {
    let (tx, rx) = watch::channel(Vec::new());
    let fleet =
        FleetRosters::awaiting_first(rx, 5008).with_service_types([ServiceType::MetricStore]);
    assert!(
        fleet
            .list_instances()
            .await
            .unwrap_err()
            .is_not_yet_synced()
    );
    tx.send(vec![
        provider(ServiceType::MetricStore, "node01", &[]),
        provider(ServiceType::MetricCollector, "node02", &[]),
    ])
    .unwrap();
    let got = fleet.list_instances().await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].workload_id, "ccms/node01");
    // An empty roster after the first one is a real, empty fleet.
    tx.send(Vec::new()).unwrap();
    assert_eq!(fleet.list_instances().await.unwrap(), vec![]);
}

#[tokio::test]
async fn fleet_rosters_merge_with_another_source() {
    let (_tx, rx) = watch::channel(vec![provider(
        ServiceType::MetricStore,
        "node01",
        &[("ip", "10.0.0.1")],
    )]);
    let fleet: Arc<dyn Discoverer> = Arc::new(FleetRosters::new(rx, 8082));
    let fixed: Arc<dyn Discoverer> = Arc::new(Static::new(&["10.0.0.9:8082"], 8082).unwrap());
    let merged = ccfleet::discovery::Merged::new(fleet, fixed);
    let got: Vec<String> = merged
        .list_instances()
        .await
        .unwrap()
        .iter()
        .map(|i| format!("{} {}", i.backend, i.address()))
        .collect();
    assert_eq!(got, ["fleet 10.0.0.1:8082", "static 10.0.0.9:8082"]);
}
