//! The Kubernetes lister: running pods selected by labels.
//!
//! It speaks the core/v1 pods API directly over HTTPS (one `GET
//! /api/v1/namespaces/<ns>/pods?labelSelector=<selector>` per listing), authenticated one of
//! three ways, chosen by [`KubernetesApi`]:
//!
//! - **in the cluster**: the pod's service account, as every Kubernetes client does: the API
//!   server from `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`, trusted through the
//!   mounted `ca.crt` alone, and the mounted `token`, read again for every request because
//!   the kubelet rotates it. This is what any cluster, Google's or not, offers its pods.
//! - **from outside, on Google Application Default Credentials**: an `https://` endpoint,
//!   each request signed with an access token for the `cloud-platform` and `userinfo.email`
//!   scopes from the credentials the environment provides (`GOOGLE_APPLICATION_CREDENTIALS`,
//!   gcloud's application-default credentials, or the metadata server on Google Cloud). The
//!   endpoint is trusted through the system's roots.
//! - **insecure, without credentials**: a plain `http://` endpoint such as `kubectl proxy`,
//!   only when asked for explicitly; no credential is ever sent over it.
//!
//! Redirects are never followed and every request is built from the configured endpoint, so
//! the token only ever reaches that origin: a 200 from elsewhere would be read as a pod list,
//! and an empty one would deregister the fleet.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use tokio::sync::OnceCell;
use tracing::Instrument as _;

use super::http;
use super::{BACKEND_KUBERNETES, Discoverer, DiscoveryError, Instance};
use crate::untrusted::Untrusted;

/// Where a pod finds its service account's credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The OAuth scopes of the Google access token, as the Go client asks for them.
pub const GOOGLE_SCOPES: [&str; 2] = [
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/userinfo.email",
];

/// How long finding Google credentials or minting a token may take, so a silent token
/// endpoint fails the listing with its own error instead of stalling it: shorter than the
/// cache's 10 s refresh timeout, which would otherwise report only that time ran out.
const TOKEN_MINT_TIMEOUT: Duration = Duration::from_secs(8);

const OPERATION: &str = "listing kubernetes pods";

/// How to reach and authenticate to a Kubernetes API server; see the
/// documentation of this module (`src/discovery/kubernetes.rs`).
pub struct KubernetesApi {
    base: Url,
    http: reqwest::Client,
    auth: Auth,
    /// The only trust anchors (the service account's CA); `None` trusts the system's roots.
    only_roots: Option<Vec<reqwest::Certificate>>,
    /// Trust anchors added to those (private CAs).
    extra_roots: Vec<reqwest::Certificate>,
}

enum Auth {
    /// Plain HTTP, no credentials.
    None,
    /// A bearer token read from a file before every request.
    TokenFile(PathBuf),
    /// A Google access token.
    Google(GoogleAuth),
}

struct GoogleAuth {
    /// A service-account key file; `None` searches the Application Default Credentials.
    credentials_file: Option<PathBuf>,
    /// Found on first use, since the search may ask the metadata server; a failed search is
    /// retried by the next listing.
    provider: OnceCell<Arc<dyn gcp_auth::TokenProvider>>,
}

impl KubernetesApi {
    /// The pod's own service account: `KUBERNETES_SERVICE_HOST`/`_PORT` from the environment
    /// and the token and CA under [`SERVICE_ACCOUNT_DIR`]. Fails outside a cluster.
    pub fn in_cluster() -> Result<KubernetesApi, DiscoveryError> {
        let var = |name: &'static str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| DiscoveryError::KubernetesClient {
                    reason: format!(
                        "{name} is not set: not running in a Kubernetes pod (set K8S_API_ENDPOINT to reach a cluster from outside)"
                    ),
                })
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        KubernetesApi::in_cluster_at(&host, &port, Path::new(SERVICE_ACCOUNT_DIR))
    }

    /// A service account's credentials from `service_account_dir` (its `token` and `ca.crt`)
    /// for the API server at `host` and `port`: what [`in_cluster`](Self::in_cluster) reads
    /// from the pod's environment. Only the CA in `ca.crt` is trusted. The token is read
    /// before every request, so a rotated token is picked up; an unreadable one fails that
    /// listing.
    pub fn in_cluster_at(
        host: &str,
        port: &str,
        service_account_dir: &Path,
    ) -> Result<KubernetesApi, DiscoveryError> {
        let failed = |reason: String| DiscoveryError::KubernetesClient { reason };
        let host = host.trim();
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let base = Url::parse(&format!("https://{host}:{}", port.trim()))
            .map_err(|_| failed("KUBERNETES_SERVICE_HOST/_PORT do not form a URL".to_owned()))?;
        let ca_path = service_account_dir.join("ca.crt");
        let pem = std::fs::read(&ca_path)
            .map_err(|e| failed(format!("reading {}: {e}", ca_path.display())))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .ok()
            .filter(|certs| !certs.is_empty())
            .ok_or_else(|| failed(format!("{} holds no PEM certificate", ca_path.display())))?;
        Ok(KubernetesApi {
            base,
            http: build_client(Some(&roots), &[], true)?,
            auth: Auth::TokenFile(service_account_dir.join("token")),
            only_roots: Some(roots),
            extra_roots: Vec::new(),
        })
    }

    /// The API server at `endpoint`, which must be `https://`, on Google Application Default
    /// Credentials.
    pub fn google(endpoint: &str) -> Result<KubernetesApi, DiscoveryError> {
        KubernetesApi::with_google_auth(endpoint, None)
    }

    /// The API server at `endpoint`, which must be `https://`, on the Google service-account
    /// key in `credentials_file` instead of the default search.
    pub fn google_with_credentials_file(
        endpoint: &str,
        credentials_file: impl Into<PathBuf>,
    ) -> Result<KubernetesApi, DiscoveryError> {
        KubernetesApi::with_google_auth(endpoint, Some(credentials_file.into()))
    }

    fn with_google_auth(
        endpoint: &str,
        credentials_file: Option<PathBuf>,
    ) -> Result<KubernetesApi, DiscoveryError> {
        let base = endpoint_url(endpoint)?;
        if base.scheme() != "https" {
            return Err(DiscoveryError::InvalidSetting {
                name: "K8S_API_ENDPOINT",
                reason: "must be https:// (its requests carry Google credentials); a plain http:// endpoint such as kubectl proxy needs K8S_API_INSECURE=true and gets no credentials".to_owned(),
            });
        }
        Ok(KubernetesApi {
            base,
            http: build_client(None, &[], true)?,
            auth: Auth::Google(GoogleAuth {
                credentials_file,
                provider: OnceCell::new(),
            }),
            only_roots: None,
            extra_roots: Vec::new(),
        })
    }

    /// The API server at `endpoint` (`http://` or `https://`) without any credentials: for
    /// `kubectl proxy` or an authenticating gateway in front of the API server.
    pub fn insecure(endpoint: &str) -> Result<KubernetesApi, DiscoveryError> {
        Ok(KubernetesApi {
            base: endpoint_url(endpoint)?,
            http: build_client(None, &[], false)?,
            auth: Auth::None,
            only_roots: None,
            extra_roots: Vec::new(),
        })
    }

    /// Also trusts the CA certificates in `pem` (a PEM bundle), besides the system's roots
    /// (or, in the cluster, besides the service account's CA).
    pub fn with_root_certificates_pem(
        mut self,
        pem: &[u8],
    ) -> Result<KubernetesApi, DiscoveryError> {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| DiscoveryError::KubernetesClient {
                reason: "the extra root certificates hold no PEM certificate".to_owned(),
            })?;
        self.extra_roots.extend(certs);
        self.http = build_client(
            self.only_roots.as_deref(),
            &self.extra_roots,
            !matches!(self.auth, Auth::None),
        )?;
        Ok(self)
    }

    /// The `Authorization` header of the next request, if this API takes one.
    async fn authorization(&self) -> Result<Option<HeaderValue>, DiscoveryError> {
        let token = match &self.auth {
            Auth::None => return Ok(None),
            Auth::TokenFile(path) => {
                let token = tokio::fs::read_to_string(path).await.map_err(|e| {
                    DiscoveryError::KubernetesAuth {
                        reason: format!(
                            "reading the service-account token {}: {e}",
                            path.display()
                        ),
                    }
                })?;
                token.trim().to_owned()
            }
            Auth::Google(google) => google.token().await?,
        };
        if token.is_empty() {
            return Err(DiscoveryError::KubernetesAuth {
                reason: "the bearer token is empty".to_owned(),
            });
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            DiscoveryError::KubernetesAuth {
                reason: "the bearer token has characters not allowed in an HTTP header".to_owned(),
            }
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

impl GoogleAuth {
    async fn token(&self) -> Result<String, DiscoveryError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| DiscoveryError::KubernetesAuth {
            reason: format!("{what}: {}", Untrusted(&e.to_string())),
        };
        let provider = self
            .provider
            .get_or_try_init(|| async {
                let found = tokio::time::timeout(TOKEN_MINT_TIMEOUT, async {
                    match &self.credentials_file {
                        Some(path) => gcp_auth::CustomServiceAccount::from_file(path)
                            .map(|p| Arc::new(p) as Arc<dyn gcp_auth::TokenProvider>),
                        None => gcp_auth::provider().await,
                    }
                })
                .await
                .map_err(|_| DiscoveryError::KubernetesAuth {
                    reason: format!(
                        "finding Google Application Default Credentials took longer than {}",
                        crate::duration::GoDuration(TOKEN_MINT_TIMEOUT)
                    ),
                })?;
                found.map_err(|e| failed("finding Google Application Default Credentials", &e))
            })
            .await?;
        let token = tokio::time::timeout(TOKEN_MINT_TIMEOUT, provider.token(&GOOGLE_SCOPES))
            .await
            .map_err(|_| DiscoveryError::KubernetesAuth {
                reason: format!(
                    "getting a Google access token took longer than {}",
                    crate::duration::GoDuration(TOKEN_MINT_TIMEOUT)
                ),
            })?
            .map_err(|e| failed("getting a Google access token", &e))?;
        Ok(token.as_str().to_owned())
    }
}

/// Parses `K8S_API_ENDPOINT`: an absolute http(s) URL without credentials in it. A path is
/// kept as a prefix (API servers behind a gateway live under one).
fn endpoint_url(endpoint: &str) -> Result<Url, DiscoveryError> {
    let url = http::endpoint("K8S_API_ENDPOINT", endpoint)?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(DiscoveryError::InvalidSetting {
            name: "K8S_API_ENDPOINT",
            reason: "the URL must not carry credentials".to_owned(),
        });
    }
    Ok(url)
}

fn build_client(
    only_roots: Option<&[reqwest::Certificate]>,
    extra_roots: &[reqwest::Certificate],
    https_only: bool,
) -> Result<reqwest::Client, DiscoveryError> {
    let mut builder = http::client_builder().https_only(https_only);
    if let Some(only) = only_roots {
        builder = builder.tls_certs_only(only.iter().chain(extra_roots).cloned());
    } else if !extra_roots.is_empty() {
        builder = builder.tls_certs_merge(extra_roots.iter().cloned());
    }
    builder
        .build()
        .map_err(|error| DiscoveryError::HttpClient { error })
}

/// Lists the running pods of a namespace that match a label selector, with a plain LIST per
/// call (no watch).
///
/// Only pods in phase `Running` with an address are listed. The Ready condition is
/// deliberately not consulted: it is false for instances that must still be reachable
/// (self-reported unhealthy, not yet probed, on a NotReady node), and routing gates on in-band
/// liveness instead. Terminating pods are kept, so they are drained through rather than
/// abandoned. A pending pod may already carry its node's IP while its init containers run, so
/// only the phase can exclude it.
///
/// The workload id is the full pod name (pods of one workload share a prefix, so truncating
/// would collapse them), the node id is `spec.nodeName`, and the address is the pod IP, or
/// the host IP when asked (falling back to the pod IP if the host IP is not known yet).
///
/// A failed listing is returned to the caller and also logged, once, at warn level: unlike
/// the other listers, a Kubernetes failure (an expired token, RBAC) usually needs an operator.
pub struct KubernetesPods {
    api: KubernetesApi,
    namespace: String,
    selector: String,
    port: u16,
    prefer_host_ip: bool,
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Option<Vec<Pod>>,
}

#[derive(Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Option<PodMetadata>,
    #[serde(default)]
    spec: Option<PodSpec>,
    #[serde(default)]
    status: Option<PodStatus>,
}

#[derive(Deserialize)]
struct PodMetadata {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Deserialize)]
struct PodStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(rename = "podIP", default)]
    pod_ip: Option<String>,
    #[serde(rename = "hostIP", default)]
    host_ip: Option<String>,
}

impl KubernetesPods {
    /// Lists the pods of `namespace` matching `selector` through `api`, reporting each at
    /// `port`, by its host IP if `prefer_host_ip`.
    pub fn new(
        api: KubernetesApi,
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> KubernetesPods {
        KubernetesPods {
            api,
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            port,
            prefer_host_ip,
        }
    }

    /// Lists through the pod's own service account ([`KubernetesApi::in_cluster`]).
    pub fn in_cluster(
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> Result<KubernetesPods, DiscoveryError> {
        Ok(KubernetesPods::new(
            KubernetesApi::in_cluster()?,
            namespace,
            selector,
            port,
            prefer_host_ip,
        ))
    }

    /// Lists through the `https://` API server at `endpoint` on Google Application Default
    /// Credentials ([`KubernetesApi::google`]).
    pub fn with_endpoint(
        endpoint: &str,
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> Result<KubernetesPods, DiscoveryError> {
        Ok(KubernetesPods::new(
            KubernetesApi::google(endpoint)?,
            namespace,
            selector,
            port,
            prefer_host_ip,
        ))
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let mut url = http::join(
            &self.api.base,
            &["api", "v1", "namespaces", &self.namespace, "pods"],
        );
        url.query_pairs_mut()
            .append_pair("labelSelector", &self.selector);
        let mut request = self.api.http.get(url);
        if let Some(authorization) = self.api.authorization().await? {
            request = request.header(reqwest::header::AUTHORIZATION, authorization);
        }
        let list: PodList = http::get_json(request, || OPERATION.to_owned()).await?;
        Ok(list
            .items
            .unwrap_or_default()
            .into_iter()
            .filter_map(|pod| self.instance(pod))
            .collect())
    }

    fn instance(&self, pod: Pod) -> Option<Instance> {
        let status = pod.status?;
        if status.phase.as_deref() != Some("Running") {
            return None;
        }
        let pod_ip = status.pod_ip.filter(|ip| !ip.is_empty());
        let host_ip = status.host_ip.filter(|ip| !ip.is_empty());
        let address = if self.prefer_host_ip {
            host_ip.or(pod_ip)
        } else {
            pod_ip
        }?;
        Some(Instance {
            workload_id: pod.metadata.and_then(|m| m.name).unwrap_or_default(),
            node_id: pod.spec.and_then(|s| s.node_name).unwrap_or_default(),
            ip_address: address,
            port: self.port,
            backend: BACKEND_KUBERNETES.to_owned(),
        })
    }
}

#[async_trait]
impl Discoverer for KubernetesPods {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let result = self
            .list()
            .instrument(tracing::debug_span!("list-kubernetes-pods"))
            .await;
        if let Err(e) = &result {
            tracing::warn!(
                namespace = %Untrusted(&self.namespace),
                error = %Untrusted(&e.to_string()),
                "listing kubernetes pods failed"
            );
        }
        result
    }
}

impl std::fmt::Debug for KubernetesPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesPods")
            .field("api", &self.api)
            .field("namespace", &self.namespace)
            .field("selector", &self.selector)
            .field("port", &self.port)
            .field("prefer_host_ip", &self.prefer_host_ip)
            .finish()
    }
}

impl std::fmt::Debug for KubernetesApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match &self.auth {
            Auth::None => "none",
            Auth::TokenFile(_) => "service-account",
            Auth::Google(_) => "google",
        };
        f.debug_struct("KubernetesApi")
            .field("host", &self.base.host_str())
            .field("auth", &auth)
            .finish_non_exhaustive()
    }
}
