//! The fleet status view: who is in the fleet, in what state, served which configuration.
//!
//! - `GET /api/fleet/instances` answers JSON for tools (`ccfleet fleet status`), with the
//!   filters `cluster`, `type`, `state` and `hostname`; it takes a token like the other
//!   fleet routes, but one with cc-backend's `admin` or `support` role ([`access`]).
//! - `GET /fleet/` is a web page for people: clusters, types and instances with their
//!   heartbeat age, the roster each cluster is sent and the plugin rollouts of the
//!   configuration tree. It refreshes itself from `GET /fleet/status.json`. A browser logs
//!   in once with a token ([`session`]); login and logout are guarded against cross-site
//!   requests ([`origin`]). Its HTML, script and style sheet are compiled into the binary
//!   ([`page`]).

pub mod access;
pub mod origin;
pub(crate) mod page;
pub mod plugins;
pub mod session;
pub mod snapshot;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::allowlist::TrustedProxies;
use super::api::{ApiError, AppState};
use super::configtree::Resolved;
use access::StatusReader;
use plugins::RevisionPlugins;
use session::Sessions;
use snapshot::{Filters, InstanceView, RolloutView, RosterView};

/// What the status view keeps between requests.
pub struct Status {
    sessions: Sessions,
    revisions: RevisionPlugins,
    proxies: TrustedProxies,
    roster_prefix: String,
    stale_after: Duration,
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
        }
    }

    /// Records what a configuration pull served (called by the pull's handler).
    pub fn served(&self, resolved: &Resolved) {
        self.revisions.record(resolved);
    }
}

/// The routes of the view, for the API router.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/fleet/instances", get(instances))
        .route("/fleet", get(page::to_page))
        .route("/fleet/", get(page::page))
        .route("/fleet/login", get(page::login_page).post(page::login))
        .route("/fleet/logout", post(page::logout))
        .route("/fleet/status.json", get(page::status_json))
        .route("/fleet/fleet.js", get(page::script))
        .route("/fleet/fleet.css", get(page::style))
}

/// `GET /api/fleet/instances`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct InstancesAnswer {
    /// The server's clock, Unix seconds: ages are computed against it, not the reader's.
    now: i64,
    stale_after_seconds: u64,
    instances: Vec<InstanceView>,
}

/// `GET /fleet/status.json`: the instances, rosters and rollouts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PageAnswer {
    now: i64,
    stale_after_seconds: u64,
    /// Who is logged in; `null` when authentication is disabled.
    user: Option<String>,
    instances: Vec<InstanceView>,
    rosters: Vec<RosterView>,
    rollouts: Vec<RolloutView>,
    /// Live instances served a configuration whose plugins this server does not know.
    served_unknown: u64,
    /// Staged rollouts with their stage and counts.
    staged: Vec<super::rollout::api::RolloutView>,
    /// Staged rollout definitions refused, with why.
    staged_refused: Vec<String>,
}

/// A JSON answer that no cache keeps.
pub(crate) fn json_answer(value: &impl Serialize) -> Response {
    let mut body = serde_json::to_vec(value).expect("the status serializes");
    body.push(b'\n');
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

async fn instances(
    _: StatusReader,
    State(state): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(pairs) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let filters = Filters::parse(&pairs).map_err(ApiError::BadRequest)?;
    let stored = state.registry.stored();
    Ok(json_answer(&InstancesAnswer {
        now: super::registry::unix_seconds(),
        stale_after_seconds: state.status.stale_after.as_secs(),
        instances: snapshot::instances(&stored, &filters, |s| is_duplicate(&state, s)),
    }))
}

/// Whether duplicate-identity detection has `stored`'s member in an episode now.
fn is_duplicate(state: &AppState, stored: &super::registry::StoredService) -> bool {
    let service = &stored.service;
    state.duplicates.is_duplicate(
        service.scope,
        &service.cluster,
        &service.hostname,
        service.service_type,
    )
}

/// The whole view for the page.
pub(crate) async fn page_answer(state: &Arc<AppState>, user: Option<String>) -> PageAnswer {
    let status = &state.status;
    let stored = state.registry.stored();
    let instances = snapshot::instances(&stored, &Filters::default(), |s| is_duplicate(state, s));
    let rosters = snapshot::rosters(&stored, &status.roster_prefix);
    // Resolving every instance's configuration may merge layers: off the async workers.
    let tree = state.tree.clone();
    let view = state.clone();
    let (rollouts, served_unknown) = tokio::task::spawn_blocking(move || {
        snapshot::rollouts(&stored, tree.as_deref(), &view.status.revisions)
    })
    .await
    .unwrap_or_default();
    let view = state.clone();
    let staged = tokio::task::spawn_blocking(move || super::rollout::api::views(&view))
        .await
        .unwrap_or_default();
    PageAnswer {
        now: super::registry::unix_seconds(),
        stale_after_seconds: status.stale_after.as_secs(),
        user,
        instances,
        rosters,
        rollouts,
        served_unknown,
        staged,
        staged_refused: state.rollouts.problems(),
    }
}
