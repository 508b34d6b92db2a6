//! Service discovery: one [`Discoverer`] model of "which peers exist" over Nomad, Kubernetes,
//! DNS, static lists, a local address, a remote cluster's edge API and the fleet's own rosters.
//!
//! Every backend reports a broken source the same way: the error reaches the caller, which
//! skips the cycle and keeps its last known set. The listers ([`NomadServices`],
//! [`NomadNodePool`], [`NomadAllocations`], `KubernetesPods`, [`Dns`], [`Local`], [`Remote`],
//! [`Static`] and [`FleetRosters`]) hit their source on every call; [`provider::new`] selects
//! one from configuration. [`Cached`] wraps a lister in a background refresh and serves the last
//! good set together with the last refresh error, so a dead source is reported instead of being
//! read as an indefinitely stale one; [`DiscoveryError::NotYetSynced`] tells a cache that has
//! never completed a refresh apart from one that read an empty source. [`Merged`] propagates
//! either side's error for the same reason: acting on a partial list is worse than skipping a
//! cycle.

mod cached;
mod dns;
mod error;
mod fleet;
mod http;
mod instance;
#[cfg(feature = "kubernetes")]
mod kubernetes;
mod local;
mod merged;
mod nomad;
pub mod provider;
mod remote;
mod static_list;

use async_trait::async_trait;

pub use cached::{CACHE_REFRESH_INTERVAL, Cached, Snapshot};
pub use dns::{
    DNS_ATTEMPTS, DNS_DEFAULT_RESOLVER_PORT, DNS_EXCHANGE_TIMEOUT, DNS_NAME_DEADLINE,
    DNS_RETRY_WAIT, Dns, ResolverAddress,
};
pub use error::DiscoveryError;
pub use fleet::FleetRosters;
pub use instance::{
    BACKEND_DNS, BACKEND_FLEET, BACKEND_KUBERNETES, BACKEND_LOCAL, BACKEND_NOMAD, BACKEND_REMOTE,
    BACKEND_STATIC, DEFAULT_PORT, ENV_ORCHESTRATOR_PORT, Instance, orchestrator_port,
    orchestrator_port_from,
};
#[cfg(feature = "kubernetes")]
pub use kubernetes::{GOOGLE_SCOPES, KubernetesApi, KubernetesPods, SERVICE_ACCOUNT_DIR};
pub use local::Local;
pub use merged::Merged;
pub use nomad::{
    FILTER_TEMPLATE_BUILDERS, FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS, NomadAllocations,
    NomadClient, NomadNodePool, NomadServices,
};
pub use remote::{EDGE_API_KEY_HEADER, Remote};
pub use static_list::Static;

/// Enumerates the instances that currently run.
///
/// Implementations are safe for concurrent use: callers list on a fixed interval and also on
/// demand from a request path.
#[async_trait]
pub trait Discoverer: Send + Sync {
    /// Returns the current set of instances, or why it could not be read.
    ///
    /// An error means "skip this cycle and keep what you had", never "the set is empty".
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError>;

    /// Begins the background refresh a cached discoverer needs before its first
    /// [`list_instances`](Discoverer::list_instances) returns anything. Listers that query
    /// their source on every call have nothing to start.
    async fn start(&self) {}

    /// Ends what [`start`](Discoverer::start) began; returns once the refresh loop has ended.
    async fn stop(&self) {}
}
