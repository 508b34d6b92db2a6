//! The fleet status view: who is in the fleet, in what state, served which configuration.
//!
//! - `GET /api/fleet/instances` answers JSON for tools (`ccfleet fleet status`): the
//!   members a [`query`] names, sorted and paged; `GET /api/fleet/summary` counts them per
//!   cluster and type with the unwell hosts as host lists ([`summary`], in the compact form
//!   of [`compact`] unless asked for `v=1`). They take a token like the other fleet routes,
//!   but one with cc-backend's `admin` or `support` role ([`access`]).
//! - `GET /fleet/` is a web page for people: the summary first, then the members a view
//!   asks for (a page at a time), the roster each cluster is sent and the plugin rollouts
//!   of the configuration tree with what the agents report running. It refreshes itself
//!   from `GET /fleet/summary.json`, `/fleet/instances.json` and `/fleet/overview.json`
//!   (`/fleet/status.json` still answers everything at once). A browser logs in once with
//!   a token ([`session`]); login and logout are guarded against cross-site requests
//!   ([`origin`]). Its HTML, script and style sheet are compiled into the binary
//!   (`page`).
//!
//! Every JSON answer carries an entity tag (`answer`) and is compressed when the client
//! accepts gzip, so an unchanged view costs a 304 and a changed one a few kilobytes.

pub mod access;
pub(crate) mod answer;
pub mod compact;
pub mod origin;
pub(crate) mod page;
pub mod plugins;
pub mod query;
pub mod session;
pub mod snapshot;
pub mod store;
pub mod summary;
pub mod view;

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query as Query_, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::api_error::ApiError;
use super::app::AppState;
use access::StatusReader;
use compact::{CompactSummary, Form};
use query::{Facts, Query};
use snapshot::{InstanceView, RolloutView, RosterView};
pub use store::Status;
use summary::Summary;

/// The routes of the view, for the API router.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/fleet/instances", get(instances))
        .route("/api/fleet/summary", get(summary_route))
        .route("/fleet", get(page::to_page))
        .route("/fleet/", get(page::page))
        .route("/fleet/login", get(page::login_page).post(page::login))
        .route("/fleet/logout", post(page::logout))
        .route("/fleet/status.json", get(page::status_json))
        .route("/fleet/summary.json", get(page::summary_json))
        .route("/fleet/instances.json", get(page::instances_json))
        .route("/fleet/overview.json", get(page::overview_json))
        .route("/fleet/fleet.js", get(page::script))
        .route("/fleet/fleet.css", get(page::style))
        // Only these routes: registration and heartbeats stay as lean as they were.
        .layer(tower_http::compression::CompressionLayer::new())
}

/// `GET /api/fleet/instances` (after the server's clock, `now`, Unix seconds: ages are
/// computed against it, not the reader's).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InstancesAnswer {
    stale_after_seconds: u64,
    /// How many members pass the filters; `instances` is the page of them asked for.
    total: usize,
    offset: usize,
    instances: Vec<InstanceView>,
}

/// `GET /api/fleet/summary?v=1` (after `now`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SummaryAnswer {
    stale_after_seconds: u64,
    #[serde(flatten)]
    summary: Summary,
}

/// `GET /api/fleet/summary` (after `now`): the compact form ([`compact`]).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CompactAnswer {
    stale_after_seconds: u64,
    #[serde(flatten)]
    summary: CompactSummary,
}

/// `GET /fleet/overview.json` (after `now`): what the page shows besides the members.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OverviewAnswer {
    /// Who is logged in; `null` when authentication is disabled.
    user: Option<String>,
    /// Whether this server publishes rosters (it does with NATS).
    publishes_rosters: bool,
    /// The rosters, each with the number of providers it lists.
    rosters: Vec<RosterCount>,
    rollouts: Vec<RolloutView>,
    served_unknown: u64,
    staged: Vec<super::rollout::api::RolloutView>,
    staged_refused: Vec<String>,
}

/// The most providers a roster of the overview lists one by one; a longer one is shown as
/// its count and host list, which stays short for any fleet.
pub const ROSTER_LISTED: usize = 20;

/// A roster as the overview shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RosterCount {
    bucket: String,
    consumer: &'static str,
    subject: String,
    /// How many providers it lists.
    count: usize,
    /// Their host names as a host list.
    hosts: String,
    /// The providers themselves, when there are at most [`ROSTER_LISTED`].
    #[serde(skip_serializing_if = "Option::is_none")]
    providers: Option<Vec<crate::wire::Provider>>,
}

/// `GET /fleet/status.json`: the instances, rosters and rollouts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PageAnswer {
    now: i64,
    stale_after_seconds: u64,
    /// Who is logged in; `null` when authentication is disabled.
    user: Option<String>,
    /// Whether this server publishes rosters (it does with NATS).
    publishes_rosters: bool,
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

/// The query of a request, or the 400 naming what is wrong with it.
pub(crate) fn parse_query(
    query: Result<Query_<Vec<(String, String)>>, QueryRejection>,
) -> Result<Query, ApiError> {
    let Query_(pairs) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    Query::parse(&pairs).map_err(ApiError::BadRequest)
}

/// The query of a summary request and the form it asks for (`v`, which only the summary
/// takes), or the 400 naming what is wrong.
pub(crate) fn parse_summary_query(
    query: Result<Query_<Vec<(String, String)>>, QueryRejection>,
) -> Result<(Query, Form), ApiError> {
    let Query_(mut pairs) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let mut form = Form::default();
    let mut failed = None;
    pairs.retain(|(key, value)| {
        if key != "v" {
            return true;
        }
        match Form::parse(value) {
            Ok(f) => form = f,
            Err(e) => failed = Some(e),
        }
        false
    });
    if let Some(e) = failed {
        return Err(ApiError::BadRequest(e));
    }
    let query = Query::parse(&pairs).map_err(ApiError::BadRequest)?;
    Ok((query, form))
}

async fn instances(
    _: StatusReader,
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query_<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = parse_query(query)?;
    Ok(instances_answer(&state, &headers, &query))
}

async fn summary_route(
    _: StatusReader,
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query_<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (query, form) = parse_summary_query(query)?;
    Ok(summary_answer(&state, &headers, &query, form))
}

/// What the server knows of a member besides its registration.
fn facts(state: &AppState, stored: &super::registry::StoredService) -> Facts {
    Facts {
        duplicate: is_duplicate(state, stored),
        report: state.rollouts.report(&stored.service),
    }
}

/// The members `query` names, tagged.
pub(crate) fn instances_answer(state: &AppState, headers: &HeaderMap, query: &Query) -> Response {
    let stored = state.registry.stored();
    let listed = snapshot::instances(&stored, query, |s| facts(state, s));
    answer::tagged_json(
        headers,
        super::registry::unix_seconds(),
        &InstancesAnswer {
            stale_after_seconds: state.status.stale_after.as_secs(),
            total: listed.total,
            offset: query.offset,
            instances: listed.instances,
        },
    )
}

/// The summary of the members `query` names in `form`, tagged.
pub(crate) fn summary_answer(
    state: &AppState,
    headers: &HeaderMap,
    query: &Query,
    form: Form,
) -> Response {
    let stored = state.registry.stored();
    let summary = summary::summary(&stored, &query.filters, |s| facts(state, s));
    let stale_after_seconds = state.status.stale_after.as_secs();
    let now = super::registry::unix_seconds();
    match form {
        Form::Full => answer::tagged_json(
            headers,
            now,
            &SummaryAnswer {
                stale_after_seconds,
                summary,
            },
        ),
        Form::Compact => answer::tagged_json(
            headers,
            now,
            &CompactAnswer {
                stale_after_seconds,
                summary: CompactSummary::from(&summary),
            },
        ),
    }
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

/// The rosters and rollouts, tagged.
pub(crate) async fn overview_answer(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    user: Option<String>,
) -> Response {
    let status = &state.status;
    let stored = state.registry.stored();
    let rosters = snapshot::rosters(&stored, &status.roster_prefix)
        .into_iter()
        .map(|r| RosterCount {
            count: r.providers.len(),
            hosts: crate::hostlist::compress(r.providers.iter().map(|p| p.hostname.as_str())),
            bucket: r.bucket,
            consumer: r.consumer,
            subject: r.subject,
            providers: (r.providers.len() <= ROSTER_LISTED).then_some(r.providers),
        })
        .collect();
    let (rollouts, served_unknown, staged) = rollouts_and_staged(state, stored).await;
    answer::tagged_json(
        headers,
        super::registry::unix_seconds(),
        &OverviewAnswer {
            user,
            publishes_rosters: status.publishes_rosters,
            rosters,
            rollouts,
            served_unknown,
            staged,
            staged_refused: state.rollouts.problems(),
        },
    )
}

/// The plugin rollouts with what agents report, and the staged rollouts.
async fn rollouts_and_staged(
    state: &Arc<AppState>,
    stored: Vec<super::registry::StoredService>,
) -> (Vec<RolloutView>, u64, Vec<super::rollout::api::RolloutView>) {
    // Resolving every instance's configuration may merge layers: off the async workers.
    let tree = state.tree.clone();
    let view = state.clone();
    let (rollouts, served_unknown) = tokio::task::spawn_blocking(move || {
        snapshot::rollouts(&stored, tree.as_deref(), &view.status.revisions, |s| {
            view.rollouts.report(&s.service)
        })
    })
    .await
    .unwrap_or_default();
    let view = state.clone();
    let staged = tokio::task::spawn_blocking(move || super::rollout::api::views(&view))
        .await
        .unwrap_or_default();
    (rollouts, served_unknown, staged)
}

/// The whole view for the page.
pub(crate) async fn page_answer(state: &Arc<AppState>, user: Option<String>) -> PageAnswer {
    let status = &state.status;
    let stored = state.registry.stored();
    let instances = snapshot::instances(&stored, &Query::default(), |s| facts(state, s)).instances;
    let rosters = snapshot::rosters(&stored, &status.roster_prefix);
    let (rollouts, served_unknown, staged) = rollouts_and_staged(state, stored).await;
    PageAnswer {
        now: super::registry::unix_seconds(),
        stale_after_seconds: status.stale_after.as_secs(),
        user,
        publishes_rosters: status.publishes_rosters,
        instances,
        rosters,
        rollouts,
        served_unknown,
        staged,
        staged_refused: state.rollouts.problems(),
    }
}
