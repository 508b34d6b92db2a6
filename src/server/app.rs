//! What every handler of the HTTP surface shares: the server's parts, handed to the router
//! once. In a file of its own, below the handlers (of [`super::api`], the rollouts' and the
//! status view's routes) that take it, so the router naming them does not make a circle.

use std::sync::Arc;

use super::allowlist::Allowlist;
use super::auth::Verifier;
use super::configtree::ConfigTree;
use super::duplicates::Duplicates;
use super::health::Health;
use super::metrics::Metrics;
use super::plugins::PluginDir;
use super::registry::Registry;
use super::roster::RosterNotify;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub registry: Registry,
    pub tree: Option<Arc<ConfigTree>>,
    pub verifier: Option<Verifier>,
    pub allowlist: Arc<Allowlist>,
    pub metrics: Arc<Metrics>,
    pub roster: RosterNotify,
    pub health: Health,
    pub plugins: Option<Arc<PluginDir>>,
    /// Members registered in turn from different peers (see [`Duplicates::is_duplicate`]).
    pub duplicates: Arc<Duplicates>,
    /// What the status view keeps between requests.
    pub status: Arc<super::status::store::Status>,
    /// Staged rollouts and the agents' reports.
    pub rollouts: Arc<super::rollout::Rollouts>,
}
