//! The union of two discoverers.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Discoverer, DiscoveryError, Instance};

/// Unions a primary and a fallback discoverer, deduplicated by workload id with the primary's
/// entry winning a conflict.
///
/// Listing fails if either side fails: the caller treats a discovery error as "skip this
/// cycle", which beats silently acting on a partial list. `start` and `stop` are forwarded to
/// the primary, then the fallback.
pub struct Merged {
    primary: Arc<dyn Discoverer>,
    fallback: Arc<dyn Discoverer>,
}

impl Merged {
    /// Unions `primary` and `fallback`.
    pub fn new(primary: Arc<dyn Discoverer>, fallback: Arc<dyn Discoverer>) -> Merged {
        Merged { primary, fallback }
    }
}

#[async_trait]
impl Discoverer for Merged {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        let primary = self
            .primary
            .list_instances()
            .await
            .map_err(|e| DiscoveryError::Primary(Box::new(e)))?;
        let fallback = self
            .fallback
            .list_instances()
            .await
            .map_err(|e| DiscoveryError::Fallback(Box::new(e)))?;
        let mut seen = HashSet::with_capacity(primary.len() + fallback.len());
        let mut out = Vec::with_capacity(primary.len() + fallback.len());
        for instance in primary.into_iter().chain(fallback) {
            if seen.insert(instance.workload_id.clone()) {
                out.push(instance);
            }
        }
        Ok(out)
    }

    async fn start(&self) {
        self.primary.start().await;
        self.fallback.start().await;
    }

    async fn stop(&self) {
        self.primary.stop().await;
        self.fallback.stop().await;
    }
}

impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged").finish_non_exhaustive()
    }
}
