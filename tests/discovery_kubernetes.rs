//! The Kubernetes pod lister against local API servers speaking the core/v1 pods API: over
//! plain HTTP (as `kubectl proxy` does), over HTTPS with a service account's token and CA,
//! and over HTTPS on Google Application Default Credentials minted by a local token
//! endpoint. Certificates come from a CA made for each test.
#![cfg(feature = "kubernetes")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use ccfleet::discovery::{
    BACKEND_KUBERNETES, Discoverer, DiscoveryError, GOOGLE_SCOPES, KubernetesApi, KubernetesPods,
    provider,
};
use serde_json::{Value, json};

#[path = "support/logs.rs"]
mod logs;
use logs::Logs;

const NAMESPACE: &str = "fleet";
const SELECTOR: &str = "app.kubernetes.io/name=cc-metric-store,tier!=canary";
const GOOGLE_TOKEN: &str = "ya29.test-access-token";

#[derive(Default)]
struct ApiServer {
    pods: Vec<Value>,
    forbidden: bool,
    /// The bearer token every request must carry, if any.
    required_token: Option<String>,
    seen: Vec<(String, HashMap<String, String>)>,
    authorizations: Vec<Option<String>>,
}

type Shared = Arc<Mutex<ApiServer>>;

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()
    });
    (code, Json(body)).into_response()
}

async fn list_pods(
    State(api): State<Shared>,
    UrlPath(namespace): UrlPath<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let mut api = api.lock().unwrap();
    let authorization = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned());
    api.authorizations.push(authorization.clone());
    api.seen.push((namespace, query));
    if let Some(token) = &api.required_token
        && authorization != Some(format!("Bearer {token}"))
    {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    if api.forbidden {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\"",
        );
    }
    Json(json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "4711"},
        "items": api.pods,
    }))
    .into_response()
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/api/v1/namespaces/{namespace}/pods", get(list_pods))
        .with_state(shared)
}

/// An API server over plain HTTP.
async fn start(api: ApiServer) -> (SocketAddr, Shared) {
    let shared: Shared = Arc::new(Mutex::new(api));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(shared.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, shared)
}

/// A CA and a server certificate it signed for `localhost` and `127.0.0.1`.
struct Pki {
    ca_pem: String,
    server: Arc<rustls::ServerConfig>,
}

fn pki() -> Pki {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ccfleet test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server: Arc::new(server),
    }
}

/// An API server over HTTPS with `pki`'s server certificate.
async fn start_https(api: ApiServer, pki: &Pki) -> (SocketAddr, Shared) {
    let shared: Shared = Arc::new(Mutex::new(api));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(shared.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake; that is the point
                // of some tests, not a server failure.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(tls),
                        hyper_util::service::TowerToHyperService::new(app),
                    )
                    .await;
            });
        }
    });
    (addr, shared)
}

/// The forms a token endpoint was sent.
type Minted = Arc<Mutex<Vec<HashMap<String, String>>>>;

/// A Google OAuth token endpoint that grants [`GOOGLE_TOKEN`] for any JWT assertion and
/// remembers the forms it was sent.
async fn start_token_endpoint() -> (SocketAddr, Minted) {
    async fn token(
        State(seen): State<Minted>,
        Form(form): Form<HashMap<String, String>>,
    ) -> Json<Value> {
        seen.lock().unwrap().push(form);
        Json(json!({"access_token": GOOGLE_TOKEN, "expires_in": 3599, "token_type": "Bearer"}))
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/token", post(token))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// A Google service-account key file whose token endpoint is `token_endpoint`.
fn service_account_key(dir: &Path, token_endpoint: SocketAddr) -> std::path::PathBuf {
    let key = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/discovery/google-test-key.pem"),
    )
    .unwrap();
    let path = dir.join("service-account.json");
    let json = json!({
        "type": "service_account",
        "project_id": "ccfleet-test",
        "private_key_id": "0123456789abcdef",
        "private_key": key,
        "client_email": "discovery@ccfleet-test.iam.gserviceaccount.com",
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": format!("http://{token_endpoint}/token"),
    });
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// The claims of a JWT (without checking its signature: that is the token endpoint's job).
fn jwt_claims(jwt: &str) -> Value {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let payload = jwt.split('.').nth(1).expect("a JWT has three parts");
    serde_json::from_slice(&engine.decode(payload).unwrap()).unwrap()
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
    KubernetesPods::new(
        KubernetesApi::insecure(&format!("http://{addr}")).unwrap(),
        NAMESPACE,
        SELECTOR,
        port,
        prefer_host_ip,
    )
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

    let api = shared.lock().unwrap();
    assert_eq!(api.seen.len(), 1);
    assert_eq!(api.seen[0].0, NAMESPACE);
    assert_eq!(
        api.seen[0].1.get("labelSelector").map(String::as_str),
        Some(SELECTOR)
    );
    assert_eq!(api.authorizations, [None], "no credential over plain HTTP");
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
async fn an_api_error_reaches_the_caller_with_the_servers_message() {
    let api = ApiServer {
        forbidden: true,
        ..ApiServer::default()
    };
    let (addr, _) = start(api).await;
    let err = lister(addr, 5008, false)
        .list_instances()
        .await
        .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::Status { status: 403, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.starts_with("listing kubernetes pods: "), "{text}");
    assert!(
        text.contains(r#"pods is forbidden: User \"system:anonymous\" cannot list"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_failed_list_is_one_warning_and_no_error_in_the_log() {
    let api = ApiServer {
        forbidden: true,
        ..ApiServer::default()
    };
    let (addr, _) = start(api).await;
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (logs, _guard) = Logs::capture();
    // Refused by the API server, and no API server at all.
    lister(addr, 5008, false)
        .list_instances()
        .await
        .unwrap_err();
    lister(unreachable, 5008, false)
        .list_instances()
        .await
        .unwrap_err();
    let lines = logs.lines();
    let warnings: Vec<&String> = lines.iter().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 2, "one per failed listing: {lines:#?}");
    assert!(
        warnings[0].contains("listing kubernetes pods failed"),
        "{lines:#?}"
    );
    assert!(warnings[0].contains("forbidden"), "{lines:#?}");
    assert!(
        warnings[1].contains("listing kubernetes pods failed"),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(" ERROR ")),
        "no client error on top: {lines:#?}"
    );
}

#[tokio::test]
async fn an_unreachable_api_server_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = lister(([127, 0, 0, 1], port).into(), 5008, false)
        .list_instances()
        .await
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::Request { .. }), "{err:?}");
}

#[test]
fn endpoints_with_credentials_or_nonsense_are_rejected() {
    for bad in [
        "https://admin:pw@k8s.example",
        "k8s.example",
        "ftp://k8s.example",
    ] {
        for err in [
            KubernetesApi::google(bad).unwrap_err(),
            KubernetesApi::insecure(bad).unwrap_err(),
        ] {
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
}

#[test]
fn a_plain_http_endpoint_needs_the_insecure_setting() {
    let err = KubernetesApi::google("http://127.0.0.1:8001").unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::InvalidSetting { name: "K8S_API_ENDPOINT", reason } if reason.contains("K8S_API_INSECURE")),
        "{err:?}"
    );
    let err =
        KubernetesPods::with_endpoint("http://127.0.0.1:8001", NAMESPACE, SELECTOR, 5008, false)
            .unwrap_err();
    assert!(
        matches!(
            err,
            DiscoveryError::InvalidSetting {
                name: "K8S_API_ENDPOINT",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn google_credentials_sign_every_request() {
    let pki = pki();
    let (token_endpoint, minted) = start_token_endpoint().await;
    let dir = tempfile::tempdir().unwrap();
    let key = service_account_key(dir.path(), token_endpoint);
    let api = ApiServer {
        pods: vec![pod("ccms-0", "Running", Some("10.1.0.1"), None)],
        required_token: Some(GOOGLE_TOKEN.to_owned()),
        ..ApiServer::default()
    };
    let (addr, shared) = start_https(api, &pki).await;
    let lister = KubernetesPods::new(
        KubernetesApi::google_with_credentials_file(
            &format!("https://localhost:{}", addr.port()),
            &key,
        )
        .unwrap()
        .with_root_certificates_pem(pki.ca_pem.as_bytes())
        .unwrap(),
        NAMESPACE,
        SELECTOR,
        5008,
        false,
    );
    for _ in 0..2 {
        let got = lister.list_instances().await.unwrap();
        assert_eq!(got[0].workload_id, "ccms-0");
    }
    assert_eq!(
        shared.lock().unwrap().authorizations,
        [
            Some(format!("Bearer {GOOGLE_TOKEN}")),
            Some(format!("Bearer {GOOGLE_TOKEN}"))
        ]
    );
    // One token, minted once for both requests, for the documented scopes.
    let minted = minted.lock().unwrap();
    assert_eq!(minted.len(), 1, "the token is reused until it expires");
    assert_eq!(
        minted[0].get("grant_type").map(String::as_str),
        Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    );
    let claims = jwt_claims(&minted[0]["assertion"]);
    assert_eq!(
        claims["iss"],
        "discovery@ccfleet-test.iam.gserviceaccount.com"
    );
    assert_eq!(claims["scope"], GOOGLE_SCOPES.join(" "));
}

#[tokio::test]
async fn a_failing_token_endpoint_fails_the_listing_without_contacting_the_api() {
    let pki = pki();
    // A token endpoint that answers every request with an error.
    let app = Router::new().route(
        "/token",
        post(|| async {
            (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": "invalid_grant"})),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let token_endpoint = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let key = service_account_key(dir.path(), token_endpoint);
    let (addr, shared) = start_https(ApiServer::default(), &pki).await;
    let err = KubernetesPods::new(
        KubernetesApi::google_with_credentials_file(
            &format!("https://127.0.0.1:{}", addr.port()),
            &key,
        )
        .unwrap()
        .with_root_certificates_pem(pki.ca_pem.as_bytes())
        .unwrap(),
        NAMESPACE,
        SELECTOR,
        5008,
        false,
    )
    .list_instances()
    .await
    .unwrap_err();
    assert!(
        matches!(err, DiscoveryError::KubernetesAuth { .. }),
        "{err:?}"
    );
    assert!(
        shared.lock().unwrap().authorizations.is_empty(),
        "no unauthenticated request is sent instead"
    );
    let text = err.to_string();
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}

/// Writes a service account's `token` and `ca.crt` into `dir`.
fn service_account_dir(dir: &Path, token: &str, ca_pem: &str) {
    std::fs::write(dir.join("token"), format!("{token}\n")).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_pem).unwrap();
}

#[tokio::test]
async fn in_cluster_the_service_account_token_and_ca_are_used_and_the_token_reread() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    service_account_dir(dir.path(), "sa-token-1", &pki.ca_pem);
    let api = ApiServer {
        pods: vec![pod("ccms-0", "Running", Some("10.1.0.1"), None)],
        required_token: Some("sa-token-1".to_owned()),
        ..ApiServer::default()
    };
    let (addr, shared) = start_https(api, &pki).await;
    let lister = KubernetesPods::new(
        KubernetesApi::in_cluster_at("127.0.0.1", &addr.port().to_string(), dir.path()).unwrap(),
        NAMESPACE,
        SELECTOR,
        5008,
        false,
    );
    assert_eq!(lister.list_instances().await.unwrap().len(), 1);

    // The kubelet rotates the projected token; the next listing sends the new one.
    service_account_dir(dir.path(), "sa-token-2", &pki.ca_pem);
    shared.lock().unwrap().required_token = Some("sa-token-2".to_owned());
    assert_eq!(lister.list_instances().await.unwrap().len(), 1);
    assert_eq!(
        shared.lock().unwrap().authorizations,
        [
            Some("Bearer sa-token-1".to_owned()),
            Some("Bearer sa-token-2".to_owned())
        ]
    );

    // A missing token fails the listing with the file's name, not the token.
    std::fs::remove_file(dir.path().join("token")).unwrap();
    let err = lister.list_instances().await.unwrap_err();
    assert!(
        matches!(err, DiscoveryError::KubernetesAuth { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("token"), "{err}");
}

#[tokio::test]
async fn in_cluster_only_the_service_accounts_ca_is_trusted() {
    let server_pki = pki();
    let other_ca = pki();
    let dir = tempfile::tempdir().unwrap();
    service_account_dir(dir.path(), "sa-token", &other_ca.ca_pem);
    let (addr, shared) = start_https(ApiServer::default(), &server_pki).await;
    let err = KubernetesPods::new(
        KubernetesApi::in_cluster_at("127.0.0.1", &addr.port().to_string(), dir.path()).unwrap(),
        NAMESPACE,
        SELECTOR,
        5008,
        false,
    )
    .list_instances()
    .await
    .unwrap_err();
    assert!(matches!(err, DiscoveryError::Request { .. }), "{err:?}");
    assert!(
        shared.lock().unwrap().authorizations.is_empty(),
        "the token never reached an untrusted server"
    );

    let missing = tempfile::tempdir().unwrap();
    let err = KubernetesApi::in_cluster_at("127.0.0.1", "443", missing.path()).unwrap_err();
    assert!(err.to_string().contains("ca.crt"), "{err}");
}

/// Runs this test binary again as a child, filtered to `test`, with `env` set; returns the
/// child's output. The child sees `CCFLEET_TEST_CHILD`, which is how a test tells which side
/// it is on. Process-wide variables (Google's, the TLS roots) are set only in the child, so
/// no other test sees them.
async fn run_in_child(test: &str, env: &[(&str, String)]) -> std::process::Output {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env("CCFLEET_TEST_CHILD", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_provider_signs_requests_with_application_default_credentials() {
    if std::env::var_os("CCFLEET_TEST_CHILD").is_some() {
        // The child: a provider configured the way an operator would, from the environment.
        let config = provider::Config::from_env("TEST_SD_").unwrap();
        let discoverer = provider::new(&config).unwrap();
        discoverer.start().await;
        let got = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match discoverer.list_instances().await {
                    Err(e) if e.is_not_yet_synced() => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    other => return other,
                }
            }
        })
        .await
        .expect("a refresh completes");
        discoverer.stop().await;
        let got = got.unwrap();
        assert_eq!(got[0].workload_id, "ccms-0");
        return;
    }
    let pki = pki();
    let (token_endpoint, minted) = start_token_endpoint().await;
    let dir = tempfile::tempdir().unwrap();
    let key = service_account_key(dir.path(), token_endpoint);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let api = ApiServer {
        pods: vec![pod("ccms-0", "Running", Some("10.1.0.1"), None)],
        required_token: Some(GOOGLE_TOKEN.to_owned()),
        ..ApiServer::default()
    };
    let (addr, shared) = start_https(api, &pki).await;
    let output = run_in_child(
        "the_provider_signs_requests_with_application_default_credentials",
        &[
            ("TEST_SD_PROVIDER", "K8S-PODS".to_owned()),
            (
                "TEST_SD_K8S_API_ENDPOINT",
                format!("https://localhost:{}", addr.port()),
            ),
            ("TEST_SD_POD_NAMESPACE", NAMESPACE.to_owned()),
            ("TEST_SD_POD_LABELS", SELECTOR.to_owned()),
            (
                "GOOGLE_APPLICATION_CREDENTIALS",
                key.to_string_lossy().into_owned(),
            ),
            // The system roots, as the child sees them: the test CA only.
            ("SSL_CERT_FILE", ca.to_string_lossy().into_owned()),
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        shared.lock().unwrap().authorizations,
        [Some(format!("Bearer {GOOGLE_TOKEN}"))]
    );
    assert_eq!(minted.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_silent_token_endpoint_fails_the_listing_instead_of_stalling_it() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let token_endpoint = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let key = service_account_key(dir.path(), token_endpoint);
    let lister = KubernetesPods::new(
        KubernetesApi::google_with_credentials_file("https://127.0.0.1:1", &key).unwrap(),
        NAMESPACE,
        SELECTOR,
        5008,
        false,
    );
    let err = lister.list_instances().await.unwrap_err();
    assert!(
        matches!(&err, DiscoveryError::KubernetesAuth { reason } if reason.contains("took longer than 8s")),
        "{err:?}"
    );
}
