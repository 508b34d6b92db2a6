//! The Kubernetes pod lister against a local HTTP server speaking the core/v1 pods API.
#![cfg(feature = "kubernetes")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ccfleet::discovery::{BACKEND_KUBERNETES, Discoverer, DiscoveryError, KubernetesPods};
use serde_json::{Value, json};

const NAMESPACE: &str = "fleet";
const SELECTOR: &str = "app.kubernetes.io/name=cc-metric-store,tier!=canary";

#[derive(Default)]
struct ApiServer {
    pods: Vec<Value>,
    forbidden: bool,
    seen: Vec<(String, HashMap<String, String>)>,
}

type Shared = Arc<Mutex<ApiServer>>;

async fn list_pods(
    State(api): State<Shared>,
    Path(namespace): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let mut api = api.lock().unwrap();
    api.seen.push((namespace, query));
    if api.forbidden {
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\"",
            "reason": "Forbidden", "code": 403
        });
        return (StatusCode::FORBIDDEN, Json(status)).into_response();
    }
    Json(json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "4711"},
        "items": api.pods,
    }))
    .into_response()
}

async fn start(api: ApiServer) -> (SocketAddr, Shared) {
    let shared: Shared = Arc::new(Mutex::new(api));
    let router = Router::new()
        .route("/api/v1/namespaces/{namespace}/pods", get(list_pods))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, shared)
}

/// A pod as the API server serializes it.
fn pod(name: &str, phase: &str, pod_ip: Option<&str>, host_ip: Option<&str>) -> Value {
    let mut status = json!({"phase": phase});
    if let Some(ip) = pod_ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    if let Some(ip) = host_ip {
        status["hostIP"] = json!(ip);
    }
    json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"),
                     "labels": {"app.kubernetes.io/name": "cc-metric-store"}},
        "spec": {"nodeName": format!("{name}-node"), "containers": [{"name": "server", "image": "ccms:1"}]},
        "status": status,
    })
}

fn with_ready(mut pod: Value, ready: &str) -> Value {
    pod["status"]["conditions"] = json!([{"type": "Ready", "status": ready}]);
    pod
}

fn terminating(mut pod: Value) -> Value {
    pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    pod
}

fn lister(addr: SocketAddr, port: u16, prefer_host_ip: bool) -> KubernetesPods {
    KubernetesPods::with_endpoint(
        &format!("http://{addr}"),
        NAMESPACE,
        SELECTOR,
        port,
        prefer_host_ip,
    )
    .unwrap()
}

#[tokio::test]
async fn lists_running_pods_by_label_selector_with_pod_ips() {
    let api = ApiServer {
        pods: vec![
            pod(
                "ccms-7d9f8-abcde",
                "Running",
                Some("10.1.0.5"),
                Some("10.0.0.5"),
            ),
            pod(
                "ccms-7d9f8-fghij",
                "Running",
                Some("10.1.0.6"),
                Some("10.0.0.6"),
            ),
        ],
        ..ApiServer::default()
    };
    let (addr, shared) = start(api).await;
    let got = lister(addr, 5008, false).list_instances().await.unwrap();
    assert_eq!(got.len(), 2);
    // Pods of one workload share a prefix; the full name keeps them apart.
    assert_eq!(got[0].workload_id, "ccms-7d9f8-abcde");
    assert_eq!(got[1].workload_id, "ccms-7d9f8-fghij");
    assert_eq!(got[0].node_id, "ccms-7d9f8-abcde-node");
    assert_eq!(got[0].address(), "10.1.0.5:5008");
    assert_eq!(got[0].backend, BACKEND_KUBERNETES);

    let seen = shared.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, NAMESPACE);
    assert_eq!(
        seen[0].1.get("labelSelector").map(String::as_str),
        Some(SELECTOR)
    );
}

#[tokio::test]
async fn only_running_pods_with_an_address_are_listed_whatever_their_readiness() {
    let api = ApiServer {
        pods: vec![
            pod("not-probed", "Running", Some("10.1.0.1"), Some("10.0.0.1")),
            with_ready(
                pod("unready", "Running", Some("10.1.0.2"), Some("10.0.0.2")),
                "False",
            ),
            terminating(with_ready(
                pod("draining", "Running", Some("10.1.0.3"), None),
                "True",
            )),
            terminating(with_ready(
                pod("draining-unready", "Running", Some("10.1.0.4"), None),
                "False",
            )),
            // A scheduled host-networked pod already has the node's IP during its init
            // containers; only the phase excludes it.
            pod("pending", "Pending", Some("10.0.0.9"), Some("10.0.0.9")),
            pod(
                "succeeded",
                "Succeeded",
                Some("10.1.0.10"),
                Some("10.0.0.10"),
            ),
            pod("failed", "Failed", Some("10.1.0.11"), Some("10.0.0.11")),
            pod("no-ip-yet", "Running", None, None),
        ],
        ..ApiServer::default()
    };
    let (addr, _) = start(api).await;
    let got: Vec<String> = lister(addr, 5008, false)
        .list_instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.workload_id)
        .collect();
    assert_eq!(
        got,
        ["not-probed", "unready", "draining", "draining-unready"]
    );
}

#[tokio::test]
async fn host_ip_is_reported_when_asked() {
    let api = ApiServer {
        pods: vec![
            pod("hostnet", "Running", Some("10.1.0.5"), Some("10.0.0.5")),
            pod("host-unknown", "Running", Some("10.1.0.6"), None),
            pod("pod-ip-unknown", "Running", None, Some("10.0.0.7")),
        ],
        ..ApiServer::default()
    };
    let (addr, _) = start(api).await;
    let by_host: Vec<String> = lister(addr, 6123, true)
        .list_instances()
        .await
        .unwrap()
        .iter()
        .map(|i| i.address())
        .collect();
    assert_eq!(by_host, ["10.0.0.5:6123", "10.1.0.6:6123", "10.0.0.7:6123"]);
    let by_pod: Vec<String> = lister(addr, 6123, false)
        .list_instances()
        .await
        .unwrap()
        .iter()
        .map(|i| i.address())
        .collect();
    assert_eq!(by_pod, ["10.1.0.5:6123", "10.1.0.6:6123"]);
}

#[tokio::test]
async fn an_api_error_reaches_the_caller() {
    let api = ApiServer {
        forbidden: true,
        ..ApiServer::default()
    };
    let (addr, _) = start(api).await;
    let err = lister(addr, 5008, false)
        .list_instances()
        .await
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::Kubernetes { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("listing kubernetes pods: "), "{text}");
    assert!(text.contains("forbidden"), "{text}");
}

#[tokio::test]
async fn an_unreachable_api_server_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let lister = KubernetesPods::with_endpoint(
        &format!("http://127.0.0.1:{port}"),
        NAMESPACE,
        SELECTOR,
        5008,
        false,
    )
    .unwrap();
    let err = lister.list_instances().await.unwrap_err();
    assert!(matches!(err, DiscoveryError::Kubernetes { .. }), "{err:?}");
}

#[test]
fn endpoints_with_credentials_or_nonsense_are_rejected() {
    for bad in [
        "https://admin:pw@k8s.example",
        "k8s.example",
        "ftp://k8s.example",
    ] {
        let err = KubernetesPods::with_endpoint(bad, NAMESPACE, SELECTOR, 5008, false).unwrap_err();
        assert!(
            matches!(
                err,
                DiscoveryError::InvalidSetting {
                    name: "K8S_API_ENDPOINT",
                    ..
                }
            ),
            "{bad}: {err:?}"
        );
        assert!(!err.to_string().contains("pw"), "{err}");
    }
}
