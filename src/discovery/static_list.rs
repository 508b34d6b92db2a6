//! The static lister: a fixed list of `host[:port]` entries.

use async_trait::async_trait;

use super::instance::{join_host_port, split_host_port};
use super::{BACKEND_STATIC, Discoverer, DiscoveryError, Instance};

/// Always returns the same instances: one per configured entry, at the entry's own port or
/// the default one. The workload id is `host:port`; a static list knows no machine, so the
/// node id is empty. Listing never fails; malformed entries are rejected when it is built.
#[derive(Debug, Clone)]
pub struct Static {
    instances: Vec<Instance>,
}

impl Static {
    /// One instance per entry of `entries` (`host`, `host:port`, `[v6]:port` or a bare IPv6
    /// address); entries without a port get `default_port`.
    pub fn new<S: AsRef<str>>(entries: &[S], default_port: u16) -> Result<Static, DiscoveryError> {
        let instances = entries
            .iter()
            .map(|entry| {
                let entry = entry.as_ref().trim();
                let (host, port) =
                    split_host_port(entry).map_err(|e| DiscoveryError::InvalidAddress {
                        backend: BACKEND_STATIC,
                        address: entry.to_owned(),
                        reason: e.to_string(),
                    })?;
                let port = port.unwrap_or(default_port);
                Ok(Instance {
                    workload_id: join_host_port(host, port),
                    node_id: String::new(),
                    ip_address: host.to_owned(),
                    port,
                    backend: BACKEND_STATIC.to_owned(),
                })
            })
            .collect::<Result<_, DiscoveryError>>()?;
        Ok(Static { instances })
    }
}

#[async_trait]
impl Discoverer for Static {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        Ok(self.instances.clone())
    }
}
