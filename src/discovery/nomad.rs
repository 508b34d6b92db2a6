//! Nomad listers: service registrations, a node pool, and allocations.
//!
//! They speak Nomad's HTTP API directly (`/v1/service/<name>`, `/v1/nodes`,
//! `/v1/allocations`), authenticating with the `X-Nomad-Token` header and filtering on the
//! server with Nomad's `filter` expressions.

use std::collections::HashSet;
use std::fmt::Write as _;

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::Instrument as _;

use super::http;
use super::{BACKEND_NOMAD, Discoverer, DiscoveryError, Instance};

/// Running template-builder allocations.
pub const FILTER_TEMPLATE_BUILDERS: &str = r#"ClientStatus == "running" and TaskGroup == "template-manager" and JobID contains "template-manager""#;

/// Running template-builder and orchestrator allocations; what the `NOMAD` provider lists.
pub const FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS: &str = r#"ClientStatus == "running" and ((TaskGroup == "template-manager" and JobID contains "template-manager") or (TaskGroup == "client-orchestrator" and JobID contains "orchestrator"))"#;

/// How many characters of a Nomad node id make a workload id for the node-level listers.
const NODE_ID_LENGTH: usize = 8;

/// The header Nomad reads its ACL token from.
const TOKEN_HEADER: &str = "X-Nomad-Token";

/// A connection to a Nomad agent's HTTP API, shared by the Nomad listers.
#[derive(Clone)]
pub struct NomadClient {
    http: reqwest::Client,
    base: Url,
    token: Option<HeaderValue>,
}

impl NomadClient {
    /// A client for the agent at `endpoint` (e.g. `http://127.0.0.1:4646`), sending `token`
    /// as `X-Nomad-Token` when given. No request is made here.
    ///
    /// Only the scheme, host and port of `endpoint` are used: the API lives at `/v1/` of the
    /// agent, so a path (an operator pasting `https://nomad:4646/ui/` from the browser) is
    /// ignored, as Nomad's own clients do, instead of turning every request into a 404.
    pub fn new(endpoint: &str, token: Option<&str>) -> Result<NomadClient, DiscoveryError> {
        let mut base = http::endpoint("NOMAD_ENDPOINT", endpoint)?;
        base.set_path("");
        Ok(NomadClient {
            http: http::client()?,
            base,
            token: token
                .filter(|t| !t.is_empty())
                .map(|t| http::secret_header("NOMAD_TOKEN", t))
                .transpose()?,
        })
    }

    /// GETs a JSON list; `null` reads as an empty list.
    async fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
        operation: impl Fn() -> String,
    ) -> Result<Vec<T>, DiscoveryError> {
        let mut url = http::join(&self.base, segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut request = self.http.get(url);
        if let Some(token) = &self.token {
            request = request.header(TOKEN_HEADER, token.clone());
        }
        // Nomad answers `null` where it has nothing to list; that is an empty set.
        let body: Option<Vec<T>> = http::get_json(request, operation).await?;
        Ok(body.unwrap_or_default())
    }
}

impl std::fmt::Debug for NomadClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NomadClient")
            .field("host", &self.base.host_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

fn truncated_node_id(node_id: &str) -> String {
    node_id.chars().take(NODE_ID_LENGTH).collect()
}

/// Quotes a string the way Go's `%q` does, which is what Nomad's filter language parses.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Lists the nodes that carry a registration of any of the given Nomad services.
///
/// Each name is one `GET /v1/service/<name>`; any failing listing fails the whole call. The
/// endpoint returns registrations regardless of health checks, which is acceptable because
/// callers health-gate every instance after connecting. Registrations without an address are
/// skipped so callers never dial an empty host. At most one instance runs per node, so
/// registrations are deduplicated by node, the earlier service name winning; the workload id
/// is the node id's first 8 characters, as for [`NomadNodePool`], so the two agree when
/// unioned.
#[derive(Debug, Clone)]
pub struct NomadServices {
    client: NomadClient,
    names: Vec<String>,
}

#[derive(Deserialize)]
struct ServiceRegistration {
    #[serde(rename = "NodeID", default)]
    node_id: String,
    #[serde(rename = "Address", default)]
    address: String,
    #[serde(rename = "Port", default)]
    port: i64,
}

impl NomadServices {
    /// Lists the registrations of `names`, in order of precedence.
    pub fn new(client: NomadClient, names: Vec<String>) -> NomadServices {
        NomadServices { client, names }
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for name in &self.names {
            let regs: Vec<ServiceRegistration> = self
                .client
                .get(&["v1", "service", name], &[], || {
                    format!("listing nomad service {name:?}")
                })
                .await?;
            for reg in regs {
                if reg.address.is_empty() {
                    continue;
                }
                let Ok(port) = u16::try_from(reg.port) else {
                    tracing::warn!(service = %name, port = reg.port, "nomad registration with an invalid port");
                    continue;
                };
                if !seen.insert(reg.node_id.clone()) {
                    continue;
                }
                out.push(Instance {
                    workload_id: truncated_node_id(&reg.node_id),
                    node_id: reg.node_id,
                    ip_address: reg.address,
                    port,
                    backend: BACKEND_NOMAD.to_owned(),
                });
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Discoverer for NomadServices {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.list()
            .instrument(tracing::debug_span!("list-nomad-services"))
            .await
    }
}

/// Lists the ready nodes of a Nomad node pool, each with a well-known port.
///
/// Nodes keep `Status == "ready"` while they drain, so an instance whose service registration
/// is already gone stays discoverable here for the drain window. The workload id is the node
/// id's first 8 characters.
#[derive(Debug, Clone)]
pub struct NomadNodePool {
    client: NomadClient,
    filter: String,
    port: u16,
}

#[derive(Deserialize)]
struct Node {
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "Address", default)]
    address: String,
}

impl NomadNodePool {
    /// Lists the ready nodes of `pool`, reporting each at `port`.
    pub fn new(client: NomadClient, pool: &str, port: u16) -> NomadNodePool {
        NomadNodePool {
            client,
            filter: format!(
                "Status == {} and NodePool == {}",
                go_quote("ready"),
                go_quote(pool)
            ),
            port,
        }
    }

    /// Lists the ready nodes of `pool`, reporting each at the port of
    /// [`orchestrator_port`](super::orchestrator_port) (`ORCHESTRATOR_PORT`, default 5008).
    pub fn with_orchestrator_port(
        client: NomadClient,
        pool: &str,
    ) -> Result<NomadNodePool, DiscoveryError> {
        Ok(NomadNodePool::new(
            client,
            pool,
            super::orchestrator_port()?,
        ))
    }

    /// The filter expression sent to `/v1/nodes`.
    pub fn filter(&self) -> &str {
        &self.filter
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let nodes: Vec<Node> = self
            .client
            .get(&["v1", "nodes"], &[("filter", &self.filter)], || {
                "listing nomad nodes".to_owned()
            })
            .await?;
        Ok(nodes
            .into_iter()
            .map(|n| Instance {
                workload_id: truncated_node_id(&n.id),
                node_id: n.id,
                ip_address: n.address,
                port: self.port,
                backend: BACKEND_NOMAD.to_owned(),
            })
            .collect())
    }
}

#[async_trait]
impl Discoverer for NomadNodePool {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.list()
            .instrument(tracing::debug_span!("list-nomad-nodes"))
            .await
    }
}

/// Lists the Nomad allocations matching a filter, each at a configured port.
///
/// This is the only Nomad view that tells one run of a process from the next: the workload id
/// is the allocation id, so a consumer that must notice a restart sees a new id. The node id
/// is the node's name (cloud instance name), and the address is the allocation's first shared
/// network IP. Allocations without allocated resources or networks are skipped with a warning.
#[derive(Debug, Clone)]
pub struct NomadAllocations {
    client: NomadClient,
    filter: String,
    port: u16,
}

#[derive(Deserialize)]
struct Allocation {
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "NodeName", default)]
    node_name: String,
    #[serde(rename = "JobID", default)]
    job_id: String,
    #[serde(rename = "AllocatedResources", default)]
    allocated_resources: Option<AllocatedResources>,
}

#[derive(Deserialize)]
struct AllocatedResources {
    #[serde(rename = "Shared", default)]
    shared: Option<SharedResources>,
}

#[derive(Deserialize)]
struct SharedResources {
    #[serde(rename = "Networks", default)]
    networks: Option<Vec<Network>>,
}

#[derive(Deserialize)]
struct Network {
    #[serde(rename = "IP", default)]
    ip: String,
}

impl NomadAllocations {
    /// Lists the allocations matching `filter` (e.g.
    /// [`FILTER_TEMPLATE_BUILDERS_AND_ORCHESTRATORS`]), reporting each at `port`.
    pub fn new(client: NomadClient, filter: impl Into<String>, port: u16) -> NomadAllocations {
        NomadAllocations {
            client,
            filter: filter.into(),
            port,
        }
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let allocations: Vec<Allocation> = self
            .client
            .get(
                &["v1", "allocations"],
                // `resources=true` makes Nomad include AllocatedResources, where the IP lives.
                &[("resources", "true"), ("filter", &self.filter)],
                || "listing nomad allocations".to_owned(),
            )
            .await?;
        let mut out = Vec::with_capacity(allocations.len());
        for alloc in allocations {
            let Some(resources) = alloc.allocated_resources else {
                tracing::warn!(job = %alloc.job_id, alloc = %alloc.id, "no allocated resources found");
                continue;
            };
            let Some(network) = resources
                .shared
                .and_then(|s| s.networks)
                .and_then(|n| n.into_iter().next())
            else {
                tracing::warn!(job = %alloc.job_id, alloc = %alloc.id, "no allocation networks found");
                continue;
            };
            out.push(Instance {
                workload_id: alloc.id,
                node_id: alloc.node_name,
                ip_address: network.ip,
                port: self.port,
                backend: BACKEND_NOMAD.to_owned(),
            });
        }
        Ok(out)
    }
}

#[async_trait]
impl Discoverer for NomadAllocations {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.list()
            .instrument(tracing::debug_span!("list-nomad-allocations"))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_like_go() {
        assert_eq!(go_quote("orchestrator-pool"), r#""orchestrator-pool""#);
        assert_eq!(go_quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(go_quote("x\ny"), r#""x\ny""#);
    }

    #[test]
    fn truncates_by_characters() {
        assert_eq!(truncated_node_id("0123456789abcdef"), "01234567");
        assert_eq!(truncated_node_id("abc"), "abc");
    }
}
