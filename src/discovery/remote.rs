//! The remote lister: the instances another cluster's edge API reports.

use async_trait::async_trait;
use reqwest::Url;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use tracing::Instrument as _;

use super::{BACKEND_REMOTE, Discoverer, DiscoveryError, Instance, http};

/// The header the edge API reads its key from.
pub const EDGE_API_KEY_HEADER: &str = "X-API-Key";

const OPERATION: &str = "getting cluster instances from service discovery";

/// Lists the instances of a remote cluster through its edge API
/// (`GET /v1/service-discovery`, authenticated with `X-API-Key`).
///
/// The workload id is the service instance id (already per run), the node id the node's,
/// and the address the service host without its port. The port is left 0: a remote cluster
/// is reached for routing through its edge, never dialled directly from here.
#[derive(Clone)]
pub struct Remote {
    http: reqwest::Client,
    url: Url,
    api_key: Option<HeaderValue>,
}

#[derive(Deserialize)]
struct ServiceDiscoveryResponse {
    #[serde(default)]
    orchestrators: Option<Vec<ServiceInstance>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceInstance {
    #[serde(rename = "nodeID", default)]
    node_id: String,
    #[serde(rename = "serviceInstanceID", default)]
    service_instance_id: String,
    #[serde(default)]
    service_host: String,
}

impl Remote {
    /// Lists through the edge API at `endpoint`, sending `api_key` as `X-API-Key` when given.
    pub fn new(endpoint: &str, api_key: Option<&str>) -> Result<Remote, DiscoveryError> {
        let base = http::endpoint("edge API endpoint", endpoint)?;
        Ok(Remote {
            http: http::client()?,
            url: http::join(&base, &["v1", "service-discovery"]),
            api_key: api_key
                .filter(|k| !k.is_empty())
                .map(|k| http::secret_header("edge API key", k))
                .transpose()?,
        })
    }

    async fn list(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let mut request = self.http.get(self.url.clone());
        if let Some(key) = &self.api_key {
            request = request.header(EDGE_API_KEY_HEADER, key.clone());
        }
        let body: ServiceDiscoveryResponse =
            http::get_json(request, || OPERATION.to_owned()).await?;
        // A missing or `null` list is how the edge API says "no instances": an empty set.
        // A body that is not an object at all still fails to decode.
        Ok(body
            .orchestrators
            .unwrap_or_default()
            .into_iter()
            .map(|o| Instance {
                workload_id: o.service_instance_id,
                node_id: o.node_id,
                ip_address: host_without_port(&o.service_host),
                port: 0,
                backend: BACKEND_REMOTE.to_owned(),
            })
            .collect())
    }
}

/// The host part of the edge API's `serviceHost`, trimmed, split the way Go's
/// `net.SplitHostPort` splits: at the last colon, whatever follows it (`node-1:grpc` and
/// `host:` lose their port part too, and `:5008` leaves an empty host), `[v6]:port` without
/// the brackets. A value that does not split (no colon, or a bare IPv6 address) is kept as
/// it is, except that brackets around a bare IPv6 address are dropped.
fn host_without_port(s: &str) -> String {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, "")) => host.to_owned(),
            Some((host, after)) if after.starts_with(':') && !after[1..].contains(':') => {
                host.to_owned()
            }
            _ => s.to_owned(),
        };
    }
    match s.rsplit_once(':') {
        // Go refuses a `[` or `]` anywhere in an unbracketed host; the value is then kept.
        Some((host, _)) if !host.contains([':', '[', ']']) => host.to_owned(),
        _ => s.to_owned(),
    }
}

#[async_trait]
impl Discoverer for Remote {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.list()
            .instrument(tracing::debug_span!("list-remote-cluster-instances"))
            .await
    }
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("host", &self.url.host_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::host_without_port;

    #[test]
    fn strips_ports() {
        for (input, want) in [
            ("10.0.0.1:5008", "10.0.0.1"),
            ("10.0.0.1", "10.0.0.1"),
            (" 10.0.0.1:5008 ", "10.0.0.1"),
            ("[fd00::1]:5008", "fd00::1"),
            ("fd00::1", "fd00::1"),
            ("node-1.internal:5008", "node-1.internal"),
            ("node-1:grpc", "node-1"),
            (":5008", ""),
            ("host:", "host"),
            ("[fd00::1]", "fd00::1"),
            ("", ""),
            ("a]:80", "a]:80"),
            ("a[b:80", "a[b:80"),
        ] {
            assert_eq!(host_without_port(input), want, "{input:?}");
        }
    }
}
