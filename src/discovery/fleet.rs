//! The fleet-roster source: the providers cc-backend announces, as instances.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::sync::watch;

use super::instance::split_host_port;
use super::{BACKEND_FLEET, Discoverer, DiscoveryError, Instance};
use crate::wire::{Provider, ServiceType};

/// A discoverer fed by a fleet client's rosters, so a service can merge "what cc-backend
/// says" with "what Nomad says".
///
/// Each provider becomes one instance: workload id `<type code>/<hostname>` (e.g.
/// `ccms/node01`), stable across the provider's restarts because the roster knows no run;
/// node id the hostname; address the provider's `address` or `ip` meta entry, else the
/// hostname; port the `port` meta entry, else a port given with the address, else the
/// configured default. Listing reads the latest roster (the channel keeps only the newest);
/// once the feeding client is gone the roster can never change again, and listing reports
/// [`DiscoveryError::FleetClosed`] instead of serving it as if it were current.
pub struct FleetRosters {
    rosters: watch::Receiver<Vec<Provider>>,
    default_port: u16,
    types: Option<BTreeSet<ServiceType>>,
    // Whether a roster has arrived; starts true unless built with `awaiting_first`.
    synced: AtomicBool,
}

impl FleetRosters {
    /// Lists the roster `rosters` currently holds, its current value included.
    pub fn new(rosters: watch::Receiver<Vec<Provider>>, default_port: u16) -> FleetRosters {
        FleetRosters {
            rosters,
            default_port,
            types: None,
            synced: AtomicBool::new(true),
        }
    }

    /// Like [`new`](FleetRosters::new), but the receiver's current value is a placeholder:
    /// listing reports [`DiscoveryError::NotYetSynced`] until a roster is sent after the
    /// receiver was created, so an empty placeholder is not read as an empty fleet.
    pub fn awaiting_first(
        rosters: watch::Receiver<Vec<Provider>>,
        default_port: u16,
    ) -> FleetRosters {
        FleetRosters {
            synced: AtomicBool::new(false),
            ..FleetRosters::new(rosters, default_port)
        }
    }

    /// Lists only providers of the given service types.
    pub fn with_service_types(mut self, types: impl IntoIterator<Item = ServiceType>) -> Self {
        self.types = Some(types.into_iter().collect());
        self
    }

    fn instance(&self, provider: &Provider) -> Instance {
        let meta = |key: &str| {
            provider
                .meta
                .get(key)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        let (host, address_port) = match meta("address").or_else(|| meta("ip")) {
            Some(address) => match split_host_port(address) {
                Ok((host, port)) => (host.to_owned(), port),
                Err(_) => (address.to_owned(), None),
            },
            None => (provider.hostname.clone(), None),
        };
        let port = meta("port")
            .and_then(|p| p.parse::<u16>().ok())
            .or(address_port)
            .unwrap_or(self.default_port);
        Instance {
            workload_id: format!("{}/{}", provider.service_type.code(), provider.hostname),
            node_id: provider.hostname.clone(),
            ip_address: host,
            port,
            backend: BACKEND_FLEET.to_owned(),
        }
    }
}

#[async_trait]
impl Discoverer for FleetRosters {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        // `has_changed` compares against the version this receiver last marked seen, which
        // it never does (it only borrows), so it stays true once a roster has been sent.
        let changed = self
            .rosters
            .has_changed()
            .map_err(|_| DiscoveryError::FleetClosed)?;
        if changed {
            self.synced.store(true, Ordering::Relaxed);
        } else if !self.synced.load(Ordering::Relaxed) {
            return Err(DiscoveryError::NotYetSynced);
        }
        let roster = self.rosters.borrow();
        Ok(roster
            .iter()
            .filter(|p| {
                self.types
                    .as_ref()
                    .is_none_or(|types| types.iter().any(|t| p.service_type == *t))
            })
            .map(|p| self.instance(p))
            .collect())
    }
}

impl std::fmt::Debug for FleetRosters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetRosters")
            .field("default_port", &self.default_port)
            .field("types", &self.types)
            .finish_non_exhaustive()
    }
}
