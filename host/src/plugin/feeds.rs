//! The latest-value channels a plugin is fed from: configuration, roster and instances.
//! Publishing replaces the previous snapshot, never queues, so a plugin that is restarted
//! is replayed only the latest of each.

use std::sync::Arc;

use tokio::sync::watch;

use crate::plugin::types::{ConfigUpdate, Instance as DiscoveredInstance, Provider};

/// The receiving side of the latest-value channels a plugin is fed from.
#[derive(Debug, Clone)]
pub struct Feeds {
    /// The latest service configuration.
    pub config: watch::Receiver<Option<ConfigUpdate>>,
    /// The latest roster of peers.
    pub roster: watch::Receiver<Option<Arc<Vec<Provider>>>>,
    /// The latest set of discovered instances.
    pub instances: watch::Receiver<Option<Arc<Vec<DiscoveredInstance>>>>,
}

/// The sending side of [`Feeds`]: publishing replaces the previous value, never queues.
#[derive(Debug)]
pub struct FeedSenders {
    /// The latest service configuration.
    pub config: watch::Sender<Option<ConfigUpdate>>,
    /// The latest roster of peers.
    pub roster: watch::Sender<Option<Arc<Vec<Provider>>>>,
    /// The latest set of discovered instances.
    pub instances: watch::Sender<Option<Arc<Vec<DiscoveredInstance>>>>,
}

impl FeedSenders {
    /// Empty channels.
    pub fn new() -> FeedSenders {
        FeedSenders {
            config: watch::Sender::new(None),
            roster: watch::Sender::new(None),
            instances: watch::Sender::new(None),
        }
    }

    /// A new set of receivers, for one more plugin.
    pub fn subscribe(&self) -> Feeds {
        Feeds {
            config: self.config.subscribe(),
            roster: self.roster.subscribe(),
            instances: self.instances.subscribe(),
        }
    }

    /// Publishes a configuration snapshot.
    pub fn set_config(&self, update: ConfigUpdate) {
        self.config.send_replace(Some(update));
    }

    /// Publishes a roster.
    pub fn set_roster(&self, providers: Vec<Provider>) {
        self.roster.send_replace(Some(Arc::new(providers)));
    }

    /// Publishes an instance set.
    pub fn set_instances(&self, instances: Vec<DiscoveredInstance>) {
        self.instances.send_replace(Some(Arc::new(instances)));
    }
}

impl Default for FeedSenders {
    fn default() -> Self {
        FeedSenders::new()
    }
}
