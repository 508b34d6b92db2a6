//! What the status view keeps between requests: the page's sessions, the plugins of the
//! revisions served, and the server's settings the view shows. A leaf below the handlers,
//! so the handlers' shared state can hold it without naming them.

use std::time::Duration;

use super::super::allowlist::TrustedProxies;
use super::super::configtree::Resolved;
use super::plugins::RevisionPlugins;
use super::session::Sessions;

/// What the status view keeps between requests.
pub struct Status {
    /// The page's login sessions.
    pub(super) sessions: Sessions,
    /// The plugins of each configuration revision served.
    pub(super) revisions: RevisionPlugins,
    /// Whom to believe that a request came over TLS.
    pub(super) proxies: TrustedProxies,
    /// The subject prefix rosters go out under.
    pub(super) roster_prefix: String,
    /// How long a silent member stays active.
    pub(super) stale_after: Duration,
    /// Whether rosters go out at all (they need NATS).
    pub(super) publishes_rosters: bool,
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status")
            .field("sessions", &self.sessions.len())
            .field("revisions", &self.revisions.len())
            .finish_non_exhaustive()
    }
}

impl Status {
    /// The view of a server whose rosters go out under `roster_prefix`, whose members go
    /// stale after `stale_after`, and which believes TLS only from `proxies`.
    pub fn new(roster_prefix: &str, stale_after: Duration, proxies: TrustedProxies) -> Status {
        Status {
            sessions: Sessions::default(),
            revisions: RevisionPlugins::default(),
            proxies,
            roster_prefix: roster_prefix.to_owned(),
            stale_after,
            publishes_rosters: true,
        }
    }

    /// The view of a server without NATS, which publishes no rosters: the page says so
    /// instead of listing rosters nobody is sent.
    pub fn without_rosters(mut self) -> Status {
        self.publishes_rosters = false;
        self
    }

    /// Records what a configuration pull served (called by the pull's handler).
    pub fn served(&self, resolved: &Resolved) {
        self.revisions.record(resolved);
    }
}
