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
//!
//! # Where this differs from the Go package it follows
//!
//! The listers, their identities, filters, error rules and settings follow E2B's Go
//! `servicediscovery` package. Deliberate departures, each for a reason:
//!
//! - **DNS names are resolved side by side, each within its own deadline**
//!   ([`DNS_NAME_DEADLINE`], 8 s): one after the other, a few silent names outlast the 10 s
//!   refresh timeout and take the names that answered down with them. A partial resolution
//!   is still a success, as in Go, and its failed names are logged at warn level.
//! - **A DNS resolver given by host name is looked up at start and after an exchange got no
//!   answer**, not before every exchange: the same reach (a resolver that moved is found
//!   again) without a system lookup per query.
//! - **Kubernetes is spoken to directly over HTTPS**, not through a client library, and
//!   without kubeconfig files (Go reads none either). `K8S_API_INSECURE` has no Go
//!   counterpart: it allows a plain `http://` endpoint (`kubectl proxy`) and then sends no
//!   credential at all, where Go cannot reach such an endpoint. A failed pod listing is
//!   logged once at warn level by the lister, besides being returned.
//! - **Google credentials**: `GOOGLE_APPLICATION_CREDENTIALS` must name a service-account
//!   key; gcloud's authorized-user credentials are found at gcloud's own location only, and
//!   on Google Cloud the metadata server is asked. Go also accepts an authorized-user file
//!   under that variable.
//! - **`STATIC` entries are parsed as `host[:port]`**, so an entry may carry its own port and
//!   a malformed one (`a:b:c`) is refused when the provider is built; Go takes each entry
//!   verbatim as a host.
//! - **Error answers of HTTP sources carry the source's message**, escaped and capped, so
//!   "403" comes with Nomad's "ACL token not found".
//! - **An edge API `serviceHost` of `[v6]`** loses its brackets; Go keeps the string as it is.
//! - **There is no `LOCAL` provider** (there is none in Go's provider either): [`Local`] is a
//!   lister a program builds; `PROVIDER=STATIC` with `STATIC=host:port` does its job from
//!   configuration, and the error for `PROVIDER=LOCAL` says so.

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
