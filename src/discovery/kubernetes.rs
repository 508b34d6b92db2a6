//! The Kubernetes lister: running pods selected by labels.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::sync::OnceCell;
use tracing::Instrument as _;

use super::http;
use super::{BACKEND_KUBERNETES, Discoverer, DiscoveryError, Instance};

/// One LIST may take this long to be read, matching the cache's refresh timeout.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

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
pub struct KubernetesPods {
    config: Option<kube::Config>,
    client: OnceCell<kube::Client>,
    namespace: String,
    selector: String,
    port: u16,
    prefer_host_ip: bool,
}

impl KubernetesPods {
    /// Lists through the pod's own service account (`KUBERNETES_SERVICE_HOST`/`_PORT` and the
    /// mounted token); fails outside a cluster.
    pub fn in_cluster(
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> Result<KubernetesPods, DiscoveryError> {
        let config = kube::Config::incluster().map_err(|e| DiscoveryError::KubernetesClient {
            reason: format!("in-cluster configuration: {}", super::error::chain(&e)),
        })?;
        Ok(Self::from_config(
            config,
            namespace,
            selector,
            port,
            prefer_host_ip,
        ))
    }

    /// Lists through the API server at `endpoint`, without credentials of its own: for an API
    /// server reached through `kubectl proxy` or an authenticating gateway. The endpoint must
    /// not carry credentials in its URL.
    pub fn with_endpoint(
        endpoint: &str,
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> Result<KubernetesPods, DiscoveryError> {
        let url = http::endpoint("K8S_API_ENDPOINT", endpoint)?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(DiscoveryError::InvalidSetting {
                name: "K8S_API_ENDPOINT",
                reason: "the URL must not carry credentials".to_owned(),
            });
        }
        let uri = url
            .as_str()
            .parse()
            .map_err(|_| DiscoveryError::InvalidSetting {
                name: "K8S_API_ENDPOINT",
                reason: "not a valid URI".to_owned(),
            })?;
        Ok(Self::from_config(
            kube::Config::new(uri),
            namespace,
            selector,
            port,
            prefer_host_ip,
        ))
    }

    /// Lists with a client built from `config` on first use (building one needs a Tokio
    /// runtime, listing always has one).
    pub fn from_config(
        mut config: kube::Config,
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> KubernetesPods {
        // A failed listing must reach the caller, which retries on its own schedule.
        config.default_retry = false;
        config.read_timeout = Some(READ_TIMEOUT);
        KubernetesPods {
            config: Some(config),
            client: OnceCell::new(),
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            port,
            prefer_host_ip,
        }
    }

    /// Lists with an existing client.
    pub fn from_client(
        client: kube::Client,
        namespace: &str,
        selector: &str,
        port: u16,
        prefer_host_ip: bool,
    ) -> KubernetesPods {
        KubernetesPods {
            config: None,
            client: OnceCell::new_with(Some(client)),
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            port,
            prefer_host_ip,
        }
    }

    async fn client(&self) -> Result<&kube::Client, DiscoveryError> {
        self.client
            .get_or_try_init(|| async {
                let config =
                    self.config
                        .clone()
                        .ok_or_else(|| DiscoveryError::KubernetesClient {
                            reason: "no configuration".to_owned(),
                        })?;
                let _ = rustls::crypto::ring::default_provider().install_default();
                kube::Client::try_from(config).map_err(|e| DiscoveryError::KubernetesClient {
                    reason: super::error::chain(&e),
                })
            })
            .await
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let pods: Api<Pod> = Api::namespaced(self.client().await?.clone(), &self.namespace);
        let list = pods
            .list(&ListParams::default().labels(&self.selector))
            .await
            .map_err(|error| DiscoveryError::Kubernetes { error })?;
        Ok(list
            .items
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
            workload_id: pod.metadata.name.unwrap_or_default(),
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
        self.list()
            .instrument(tracing::debug_span!("list-kubernetes-pods"))
            .await
    }
}

impl std::fmt::Debug for KubernetesPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesPods")
            .field("namespace", &self.namespace)
            .field("selector", &self.selector)
            .field("port", &self.port)
            .field("prefer_host_ip", &self.prefer_host_ip)
            .finish_non_exhaustive()
    }
}
