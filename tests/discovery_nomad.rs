//! The Nomad listers against a local HTTP server speaking Nomad's documented JSON.
#![cfg(feature = "discovery")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ccfleet::discovery::{
    BACKEND_NOMAD, Discoverer, DiscoveryError, FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS,
    Instance, NomadAllocations, NomadClient, NomadNodePool, NomadServices,
};
use serde_json::{Value, json};

const TOKEN: &str = "nomad-secret-token";
const NODE_A: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
const NODE_B: &str = "b1b2c3d4e5f60718293a4b5c6d7e8f9012345678";

/// What the fake agent serves and what it saw.
#[derive(Default)]
struct Agent {
    services: HashMap<String, Value>,
    nodes: Value,
    allocations: Option<Value>,
    seen_queries: Vec<(String, HashMap<String, String>)>,
    seen_tokens: Vec<Option<String>>,
}

type Shared = Arc<Mutex<Agent>>;

/// Records the token and tells whether it is the right one.
fn authorized(agent: &Shared, headers: &HeaderMap) -> bool {
    let token = headers
        .get("x-nomad-token")
        .map(|v| v.to_str().unwrap().to_owned());
    let ok = token.as_deref() == Some(TOKEN);
    agent.lock().unwrap().seen_tokens.push(token);
    ok
}

fn forbidden() -> Response {
    (StatusCode::FORBIDDEN, "Permission denied").into_response()
}

async fn service(
    State(agent): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&agent, &headers) {
        return forbidden();
    }
    let agent = agent.lock().unwrap();
    // An unknown service is an empty list, as the real agent answers.
    Json(agent.services.get(&name).cloned().unwrap_or(json!([]))).into_response()
}

async fn nodes(
    State(agent): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&agent, &headers) {
        return forbidden();
    }
    let mut agent = agent.lock().unwrap();
    agent.seen_queries.push(("nodes".into(), q));
    Json(agent.nodes.clone()).into_response()
}

async fn allocations(
    State(agent): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&agent, &headers) {
        return forbidden();
    }
    let mut agent = agent.lock().unwrap();
    agent.seen_queries.push(("allocations".into(), q));
    match agent.allocations.clone() {
        Some(v) => Json(v).into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "rpc error: no leader").into_response(),
    }
}

async fn start(agent: Agent) -> (SocketAddr, Shared) {
    let shared: Shared = Arc::new(Mutex::new(agent));
    let router = Router::new()
        .route("/v1/service/{name}", get(service))
        .route("/v1/nodes", get(nodes))
        .route("/v1/allocations", get(allocations))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, shared)
}

fn client(addr: SocketAddr) -> NomadClient {
    NomadClient::new(&format!("http://{addr}"), Some(TOKEN)).unwrap()
}

fn registration(node: &str, address: &str, port: u16) -> Value {
    json!({
        "ID": format!("_nomad-task-{node}-orchestrator"),
        "ServiceName": "orchestrator",
        "Namespace": "default",
        "NodeID": node,
        "Datacenter": "dc1",
        "JobID": "orchestrator",
        "AllocID": "9f0e0000-0000-0000-0000-000000000000",
        "Tags": ["grpc"],
        "Address": address,
        "Port": port,
        "CreateIndex": 10,
        "ModifyIndex": 12
    })
}

#[tokio::test]
async fn services_map_registrations_to_node_identities() {
    let mut agent = Agent::default();
    agent.services.insert(
        "orchestrator".into(),
        json!([registration(NODE_A, "10.0.0.1", 5008)]),
    );
    let (addr, shared) = start(agent).await;
    let got = NomadServices::new(client(addr), vec!["orchestrator".into()])
        .list_instances()
        .await
        .unwrap();
    assert_eq!(
        got,
        vec![Instance {
            workload_id: NODE_A[..8].to_owned(),
            node_id: NODE_A.to_owned(),
            ip_address: "10.0.0.1".into(),
            port: 5008,
            backend: BACKEND_NOMAD.into(),
        }]
    );
    assert_eq!(got[0].address(), "10.0.0.1:5008");
    assert_eq!(
        shared.lock().unwrap().seen_tokens,
        vec![Some(TOKEN.to_owned())]
    );
}

#[tokio::test]
async fn services_union_names_dedupe_by_node_and_skip_missing_addresses() {
    let mut agent = Agent::default();
    agent.services.insert(
        "orchestrator".into(),
        json!([
            registration(NODE_A, "10.0.0.1", 5008),
            registration(NODE_A, "10.0.0.1", 5008),
            registration(NODE_B, "", 5008)
        ]),
    );
    agent.services.insert(
        "orchestrator-canary".into(),
        json!([
            registration(NODE_A, "10.0.0.1", 6008),
            registration(NODE_B, "10.0.0.2", 6008)
        ]),
    );
    let (addr, _) = start(agent).await;
    let got = NomadServices::new(
        client(addr),
        vec![
            "orchestrator".into(),
            "orchestrator-canary".into(),
            "never-registered".into(),
        ],
    )
    .list_instances()
    .await
    .unwrap();
    let addresses: Vec<String> = got.iter().map(Instance::address).collect();
    // Node A's canary registration loses to the first name; node B only has a usable
    // canary registration.
    assert_eq!(addresses, ["10.0.0.1:5008", "10.0.0.2:6008"]);
}

#[tokio::test]
async fn services_fail_when_any_listing_fails() {
    let (addr, _) = start(Agent::default()).await;
    let unauthorized = NomadClient::new(&format!("http://{addr}"), Some("wrong")).unwrap();
    let err = NomadServices::new(unauthorized, vec!["orchestrator".into()])
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::Status { status: 403, operation, .. } if operation.contains("\"orchestrator\"")),
        "{err:?}"
    );
    assert!(!err.to_string().contains("wrong"), "the token never shows");
}

#[tokio::test]
async fn node_pool_sends_the_exact_filter() {
    let agent = Agent {
        nodes: json!([
            {"ID": NODE_A, "Name": "node-a", "Address": "10.0.0.1", "NodePool": "orchestrator-pool", "Status": "ready"},
            {"ID": NODE_B, "Name": "node-b", "Address": "10.0.0.2", "NodePool": "orchestrator-pool", "Status": "ready"}
        ]),
        ..Agent::default()
    };
    let (addr, shared) = start(agent).await;
    let pool = NomadNodePool::new(client(addr), "orchestrator-pool", 5008);
    let got = pool.list_instances().await.unwrap();
    let queries = shared.lock().unwrap().seen_queries.clone();
    assert_eq!(queries.len(), 1);
    assert_eq!(
        queries[0].1.get("filter").map(String::as_str),
        Some(r#"Status == "ready" and NodePool == "orchestrator-pool""#)
    );
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].workload_id, &NODE_B[..8]);
    assert_eq!(got[1].node_id, NODE_B);
    assert_eq!(got[1].address(), "10.0.0.2:5008");
}

#[tokio::test]
async fn allocations_ask_for_resources_with_the_filter_and_map_per_run_ids() {
    let agent = Agent {
        allocations: Some(json!([
            {"ID": "alloc-1", "NodeName": "node-a", "JobID": "template-manager", "TaskGroup": "template-manager",
             "ClientStatus": "running",
             "AllocatedResources": {"Shared": {"Networks": [{"IP": "10.0.0.1", "Mode": "host"}], "Ports": []}}},
            {"ID": "alloc-2", "NodeName": "node-a", "JobID": "orchestrator", "TaskGroup": "client-orchestrator",
             "ClientStatus": "running",
             "AllocatedResources": {"Shared": {"Networks": [{"IP": "10.0.0.1"}]}}},
            {"ID": "alloc-3", "NodeName": "node-b", "JobID": "orchestrator", "AllocatedResources": null},
            {"ID": "alloc-4", "NodeName": "node-c", "JobID": "orchestrator",
             "AllocatedResources": {"Shared": {"Networks": []}}}
        ])),
        ..Agent::default()
    };
    let (addr, shared) = start(agent).await;
    let allocations = NomadAllocations::new(
        client(addr),
        FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS,
        5009,
    );
    let got = allocations.list_instances().await.unwrap();
    assert_eq!(
        got,
        vec![
            Instance {
                workload_id: "alloc-1".into(),
                node_id: "node-a".into(),
                ip_address: "10.0.0.1".into(),
                port: 5009,
                backend: BACKEND_NOMAD.into(),
            },
            Instance {
                workload_id: "alloc-2".into(),
                node_id: "node-a".into(),
                ip_address: "10.0.0.1".into(),
                port: 5009,
                backend: BACKEND_NOMAD.into(),
            },
        ]
    );
    let queries = shared.lock().unwrap().seen_queries.clone();
    let (_, q) = &queries[0];
    assert_eq!(q.get("resources").map(String::as_str), Some("true"));
    assert_eq!(
        q.get("filter").map(String::as_str),
        Some(
            r#"ClientStatus == "running" and ((TaskGroup == "template-manager" and JobID contains "template-manager") or (TaskGroup == "client-orchestrator" and JobID contains "orchestrator"))"#
        )
    );
}

#[tokio::test]
async fn a_failed_allocation_listing_is_an_error_not_an_empty_fleet() {
    let (addr, _) = start(Agent::default()).await;
    let err = NomadAllocations::new(
        client(addr),
        FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS,
        5008,
    )
    .list_instances()
    .await
    .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Status { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "listing nomad allocations: unexpected HTTP status 500: rpc error: no leader"
    );
}

#[tokio::test]
async fn an_error_answer_carries_nomads_message_escaped_and_capped() {
    async fn acl(Query(q): Query<HashMap<String, String>>) -> Response {
        match q.get("filter").map(String::as_str) {
            Some("long") => (
                StatusCode::FORBIDDEN,
                format!("forged\nERROR line\u{1b}[2J{}", "x".repeat(5000)),
            )
                .into_response(),
            _ => (StatusCode::FORBIDDEN, "ACL token not found").into_response(),
        }
    }
    let router = Router::new().route("/v1/allocations", get(acl));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let err = NomadAllocations::new(client(addr), "x", 5008)
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::Status { status: 403, message: Some(m), .. } if m == "ACL token not found"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "listing nomad allocations: unexpected HTTP status 403: ACL token not found"
    );

    let err = NomadAllocations::new(client(addr), "long", 5008)
        .list_instances()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains(r"forged\nERROR line\u{1b}[2J"), "{text}");
    assert!(text.len() < 600, "capped: {} bytes", text.len());
    assert!(text.ends_with("more bytes)"), "{text}");
}

#[tokio::test]
async fn a_path_in_the_endpoint_is_ignored() {
    let mut agent = Agent::default();
    agent.services.insert(
        "orchestrator".into(),
        json!([registration(NODE_A, "10.0.0.1", 5008)]),
    );
    let (addr, _) = start(agent).await;
    // What an operator copies from the browser.
    for endpoint in [
        format!("http://{addr}/ui/"),
        format!("http://{addr}/ui/jobs"),
    ] {
        let client = NomadClient::new(&endpoint, Some(TOKEN)).unwrap();
        let got = NomadServices::new(client, vec!["orchestrator".into()])
            .list_instances()
            .await
            .unwrap_or_else(|e| panic!("{endpoint}: {e}"));
        assert_eq!(got.len(), 1, "{endpoint}");
    }
}

#[tokio::test]
async fn a_null_body_is_an_empty_set_for_every_nomad_lister() {
    let mut agent = Agent::default();
    agent.services.insert("orchestrator".into(), Value::Null);
    agent.nodes = Value::Null;
    agent.allocations = Some(Value::Null);
    let (addr, _) = start(agent).await;
    let services = NomadServices::new(client(addr), vec!["orchestrator".into()])
        .list_instances()
        .await
        .unwrap();
    let nodes = NomadNodePool::new(client(addr), "default", 5008)
        .list_instances()
        .await
        .unwrap();
    let allocations = NomadAllocations::new(client(addr), "x", 5008)
        .list_instances()
        .await
        .unwrap();
    assert!(services.is_empty() && nodes.is_empty() && allocations.is_empty());
}

/// Runs this test binary again as a child, filtered to `test`, with `env` set; returns
/// whether the child's copy of the test passed. The child sees `CCFLEET_TEST_CHILD`, which
/// is how a test tells which side it is on. Process-wide variables are set only in the
/// child, so no other test sees them.
async fn passes_in_child(test: &str, env: &[(&str, String)]) -> bool {
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env("CCFLEET_TEST_CHILD", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("1 passed") || !output.status.success(),
        "{stdout}"
    );
    if !output.status.success() {
        eprintln!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    }
    output.status.success()
}

#[tokio::test]
async fn the_node_pool_port_defaults_to_orchestrator_port() {
    if std::env::var_os("CCFLEET_TEST_CHILD").is_some() {
        let endpoint = std::env::var("NOMAD_TEST_ENDPOINT").unwrap();
        let client = NomadClient::new(&endpoint, Some(TOKEN)).unwrap();
        let got = NomadNodePool::with_orchestrator_port(client, "default")
            .unwrap()
            .list_instances()
            .await
            .unwrap();
        assert_eq!(got[0].address(), "10.0.0.1:6123");
        return;
    }
    let agent = Agent {
        nodes: json!([{"ID": NODE_A, "Name": "node-a", "Address": "10.0.0.1", "Status": "ready"}]),
        ..Agent::default()
    };
    let (addr, _) = start(agent).await;
    let endpoint = format!("http://{addr}");
    assert!(
        passes_in_child(
            "the_node_pool_port_defaults_to_orchestrator_port",
            &[
                ("ORCHESTRATOR_PORT", "6123".to_owned()),
                ("NOMAD_TEST_ENDPOINT", endpoint),
            ],
        )
        .await
    );
    // Unset, the port is 5008; set to nonsense, it is an error naming the variable.
    assert_eq!(
        ccfleet::discovery::orchestrator_port_from(|_| None).unwrap(),
        5008
    );
    let err = ccfleet::discovery::orchestrator_port_from(|_| Some("grpc".into())).unwrap_err();
    assert!(
        matches!(
            err,
            DiscoveryError::InvalidSetting {
                name: "ORCHESTRATOR_PORT",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_malformed_body_is_an_error() {
    let router = Router::new().route("/v1/allocations", get(|| async { "<html>proxy</html>" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let err = NomadAllocations::new(client(addr), "x", 5008)
        .list_instances()
        .await
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::Decode { .. }), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_agent_is_an_error_without_the_url() {
    // Bind and drop to find a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client =
        NomadClient::new(&format!("http://user:pw@127.0.0.1:{port}"), Some(TOKEN)).unwrap();
    let err = NomadNodePool::new(client, "default", 5008)
        .list_instances()
        .await
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::Request { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("listing nomad nodes: "), "{text}");
    assert!(!text.contains("pw"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
}

#[tokio::test]
async fn a_redirect_within_the_agent_s_origin_is_followed_with_the_token() {
    // Go's client follows a 307; a proxy in front of Nomad that moves the API answers one.
    let shared: Shared = Arc::new(Mutex::new(Agent {
        nodes: json!([{"ID": NODE_A, "Name": "node-a", "Address": "10.0.0.1", "Status": "ready"}]),
        ..Agent::default()
    }));
    let router = Router::new()
        .route(
            "/v1/nodes",
            get(|RawQuery(query): RawQuery| async move {
                let location = format!("/moved/v1/nodes?{}", query.unwrap_or_default());
                (StatusCode::TEMPORARY_REDIRECT, [("location", location)])
            }),
        )
        .route("/moved/v1/nodes", get(nodes))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let got = NomadNodePool::new(client(addr), "default", 5008)
        .list_instances()
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].address(), "10.0.0.1:5008");
    let agent = shared.lock().unwrap();
    assert_eq!(agent.seen_tokens, vec![Some(TOKEN.to_owned())]);
    assert_eq!(agent.seen_queries.len(), 1);
}

#[tokio::test]
async fn a_redirect_loop_ends_with_the_redirect_as_the_error() {
    let router = Router::new().route(
        "/v1/nodes",
        get(|| async { (StatusCode::TEMPORARY_REDIRECT, [("location", "/v1/nodes")]) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let err = NomadNodePool::new(client(addr), "default", 5008)
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Status { status: 307, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn redirects_to_another_origin_are_not_followed_with_the_token() {
    let (target, shared) = start(Agent::default()).await;
    let location = format!("http://{target}/v1/nodes");
    let router = Router::new().route(
        "/v1/nodes",
        get(move || {
            let location = location.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", location)]) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let err = NomadNodePool::new(client(addr), "default", 5008)
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Status { status: 307, .. }),
        "{err:?}"
    );
    assert!(shared.lock().unwrap().seen_tokens.is_empty());
}

#[test]
fn endpoints_are_validated_without_echoing_them() {
    for bad in ["", "nomad:4646", "ftp://nomad", "http://"] {
        let err = NomadClient::new(bad, Some(TOKEN)).unwrap_err();
        assert!(
            matches!(
                err,
                DiscoveryError::InvalidSetting {
                    name: "NOMAD_ENDPOINT",
                    ..
                }
            ),
            "{bad:?}: {err:?}"
        );
    }
    let err = NomadClient::new("http://nomad:4646", Some("bad\ntoken")).unwrap_err();
    assert!(!err.to_string().contains("bad"), "{err}");
}
