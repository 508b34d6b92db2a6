//! The remote lister against a local edge API.
#![cfg(feature = "discovery")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ccfleet::discovery::{BACKEND_REMOTE, Discoverer, DiscoveryError, Instance, Remote};
use serde_json::{Value, json};

const KEY: &str = "edge-api-key-0123";

struct Edge {
    status: StatusCode,
    body: Value,
    keys: Vec<Option<String>>,
}

type Shared = Arc<Mutex<Edge>>;

async fn service_discovery(State(edge): State<Shared>, headers: HeaderMap) -> Response {
    let mut edge = edge.lock().unwrap();
    let key = headers
        .get("x-api-key")
        .map(|v| v.to_str().unwrap().to_owned());
    let authorized = key.as_deref() == Some(KEY);
    edge.keys.push(key);
    if !authorized {
        return (StatusCode::UNAUTHORIZED, "unauthorized").into_response();
    }
    (edge.status, Json(edge.body.clone())).into_response()
}

async fn start(status: StatusCode, body: Value) -> (SocketAddr, Shared) {
    let shared = Arc::new(Mutex::new(Edge {
        status,
        body,
        keys: Vec::new(),
    }));
    let router = Router::new()
        .route("/v1/service-discovery", get(service_discovery))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, shared)
}

fn orchestrator(node: &str, instance: &str, host: &str) -> Value {
    json!({
        "nodeID": node,
        "serviceInstanceID": instance,
        "serviceVersion": "1.2.3",
        "serviceVersionCommit": "abcdef0",
        "serviceHost": host,
        "serviceStartedAt": "2026-01-01T00:00:00Z",
        "serviceStatus": "Healthy",
        "roles": ["orchestrator", "template-builder"]
    })
}

#[tokio::test]
async fn maps_the_edge_payload_to_instances_without_ports() {
    let (addr, shared) = start(
        StatusCode::OK,
        json!({"orchestrators": [
            orchestrator("node-1", "run-aaa", "10.0.0.1:5008"),
            orchestrator("node-2", "run-bbb", "[fd00::2]:5008"),
            orchestrator("node-3", "run-ccc", "node-3.internal"),
        ]}),
    )
    .await;
    let remote = Remote::new(&format!("http://{addr}/"), Some(KEY)).unwrap();
    let got = remote.list_instances().await.unwrap();
    let want = |workload: &str, node: &str, ip: &str| Instance {
        workload_id: workload.into(),
        node_id: node.into(),
        ip_address: ip.into(),
        port: 0,
        backend: BACKEND_REMOTE.into(),
    };
    assert_eq!(
        got,
        vec![
            want("run-aaa", "node-1", "10.0.0.1"),
            want("run-bbb", "node-2", "fd00::2"),
            want("run-ccc", "node-3", "node-3.internal"),
        ]
    );
    assert_eq!(shared.lock().unwrap().keys, vec![Some(KEY.to_owned())]);
}

#[tokio::test]
async fn an_edge_error_status_is_an_error() {
    let (addr, _) = start(StatusCode::BAD_GATEWAY, json!({"message": "upstream"})).await;
    let err = Remote::new(&format!("http://{addr}"), Some(KEY))
        .unwrap()
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Status { status: 502, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("getting cluster instances from service discovery"),
        "{err}"
    );
}

#[tokio::test]
async fn a_wrong_key_is_rejected_and_never_echoed() {
    let (addr, _) = start(StatusCode::OK, json!({"orchestrators": []})).await;
    let err = Remote::new(&format!("http://{addr}"), Some("not-the-key"))
        .unwrap()
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Status { status: 401, .. }),
        "{err:?}"
    );
    assert!(!err.to_string().contains("not-the-key"));
}

#[tokio::test]
async fn a_missing_or_null_list_is_an_empty_cluster_as_in_go() {
    for body in [
        json!({}),
        json!({"orchestrators": null}),
        json!({"orchestrators": []}),
    ] {
        let (addr, _) = start(StatusCode::OK, body.clone()).await;
        let got = Remote::new(&format!("http://{addr}"), Some(KEY))
            .unwrap()
            .list_instances()
            .await
            .unwrap_or_else(|e| panic!("{body}: {e}"));
        assert!(got.is_empty(), "{body}");
    }
    // A body that is not the documented object at all is still an error.
    let (addr, _) = start(StatusCode::OK, json!(["not", "an", "object"])).await;
    let err = Remote::new(&format!("http://{addr}"), Some(KEY))
        .unwrap()
        .list_instances()
        .await
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::Decode { .. }), "{err:?}");
}

#[tokio::test]
async fn service_hosts_lose_their_port_part_as_in_go() {
    let (addr, _) = start(
        StatusCode::OK,
        json!({"orchestrators": [
            orchestrator("node-1", "run-a", "node-1:grpc"),
            orchestrator("node-2", "run-b", ":5008"),
            orchestrator("node-3", "run-c", "host:"),
            orchestrator("node-4", "run-d", "fd00::4"),
        ]}),
    )
    .await;
    let got: Vec<String> = Remote::new(&format!("http://{addr}"), Some(KEY))
        .unwrap()
        .list_instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.ip_address)
        .collect();
    assert_eq!(got, ["node-1", "", "host", "fd00::4"]);
}

#[tokio::test]
async fn an_edge_error_shows_the_edge_message() {
    let (addr, _) = start(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"code": 503, "message": "cluster is draining"}),
    )
    .await;
    let err = Remote::new(&format!("http://{addr}"), Some(KEY))
        .unwrap()
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .ends_with("unexpected HTTP status 503: cluster is draining"),
        "{err}"
    );
}
