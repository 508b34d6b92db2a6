//! The local lister: one instance at a configured address.

use async_trait::async_trait;

use super::instance::split_host_port;
use super::{BACKEND_LOCAL, Discoverer, DiscoveryError, Instance};

/// Always returns one instance, with workload and node id `local`: for development setups
/// and single-machine deployments where the peer runs next to its consumer.
#[derive(Debug, Clone)]
pub struct Local {
    instance: Instance,
}

impl Local {
    /// The instance at `addr`, with the port of [`orchestrator_port`](super::orchestrator_port)
    /// (`ORCHESTRATOR_PORT`, default 5008) when `addr` names none.
    pub fn with_orchestrator_port(addr: &str) -> Result<Local, DiscoveryError> {
        Local::new(addr, super::orchestrator_port()?)
    }

    /// The instance at `addr`, which is `host:port`, `[v6]:port` or just a host, which then
    /// gets `default_port`.
    pub fn new(addr: &str, default_port: u16) -> Result<Local, DiscoveryError> {
        let (host, port) = split_host_port(addr).map_err(|e| DiscoveryError::InvalidAddress {
            backend: BACKEND_LOCAL,
            address: addr.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Local {
            instance: Instance {
                workload_id: "local".to_owned(),
                node_id: "local".to_owned(),
                ip_address: host.to_owned(),
                port: port.unwrap_or(default_port),
                backend: BACKEND_LOCAL.to_owned(),
            },
        })
    }
}

#[async_trait]
impl Discoverer for Local {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        Ok(vec![self.instance.clone()])
    }
}
