//! The operators' routes of rollouts.
//!
//! - `GET /api/fleet/rollouts`: every rollout with its stage, status, last decision and the
//!   current stage's counts (roles `admin` or `support`, as the fleet status).
//! - `POST /api/fleet/rollouts/{name}/pause`, `.../resume`, `.../abort` (role `admin`):
//!   pause keeps reached members on the change and stops advancing; resume continues a
//!   paused rollout from its stage (its `min-time` counted anew); abort takes the change back
//!   from every member. A rolled-back, aborted or completed rollout is final: edit its file
//!   (which makes it a new rollout) to try again. The decision is saved before it is
//!   answered.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::super::api_error::{ApiError, error, internal_error};
use super::super::app::AppState;
use super::super::auth;
use super::super::metrics::Metrics;
use super::super::status::access::{ADMIN_ROLE, StatusReader};
use super::{Counts, RolloutState, Status, counts_and_failing, decide};
use crate::untrusted::Untrusted;

/// One rollout as the API shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    /// Its name.
    pub name: String,
    /// The service type it applies to.
    #[serde(rename = "type")]
    pub service_type: String,
    /// Its cluster, if limited to one.
    pub cluster: Option<String>,
    /// `running`, `paused`, `completed`, `rolled-back`, `aborted`, or `pending` before the
    /// leading server looked at it.
    pub status: String,
    /// The current stage (from 0).
    pub stage: usize,
    /// How many stages it has.
    pub stages: usize,
    /// Unix seconds the current stage started.
    pub stage_started_at: Option<i64>,
    /// Why the last decision was taken.
    pub reason: String,
    /// The plugins the change names by SHA-256: `[name, sha256]`.
    pub plugins: Vec<(String, String)>,
    /// The current stage's members by how they fare.
    pub counts: Counts,
    /// The failing members by how they fail (a plugin state and the agent's reason), most
    /// first.
    pub failing: Vec<super::gates::Failing>,
}

/// Every rollout, for the API and the status page.
pub(crate) fn views(state: &AppState) -> Vec<RolloutView> {
    let Some(tree) = &state.tree else {
        return Vec::new();
    };
    let rollouts = &state.rollouts;
    rollouts
        .definitions()
        .iter()
        .map(|d| {
            let progress = rollouts.state(&d.name).filter(|s| s.digest == d.digest);
            let (counts, failing) = progress
                .as_ref()
                .map(|s| counts_and_failing(rollouts, &state.registry, tree, d, s))
                .unwrap_or_default();
            RolloutView {
                name: d.name.clone(),
                service_type: d.service_type.code().to_owned(),
                cluster: d.cluster.clone(),
                status: progress
                    .as_ref()
                    .map_or("pending", |s| s.status.as_str())
                    .to_owned(),
                stage: progress.as_ref().map_or(0, |s| s.stage),
                stages: d.stages.len(),
                stage_started_at: progress.as_ref().map(|s| s.stage_started_at),
                reason: progress
                    .as_ref()
                    .map(|s| s.reason.clone())
                    .unwrap_or_default(),
                plugins: d.plugins.clone(),
                counts,
                failing,
            }
        })
        .collect()
}

/// `GET /api/fleet/rollouts`.
pub(crate) async fn list(_: StatusReader, State(state): State<Arc<AppState>>) -> Response {
    #[derive(Serialize)]
    struct Answer {
        rollouts: Vec<RolloutView>,
        /// Definitions refused at the last look, with why.
        refused: Vec<String>,
    }
    Json(Answer {
        rollouts: views(&state),
        refused: state.rollouts.problems(),
    })
    .into_response()
}

/// Proof that a request may steer rollouts: the `admin` role.
pub(crate) struct Operator(String);

impl FromRequestParts<Arc<AppState>> for Operator {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Response> {
        let Some(&ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            return Err(internal_error());
        };
        if !state.allowlist.allows(&parts.headers, peer) {
            Metrics::add(&state.metrics.refused_allowlist, 1);
            return Err(ApiError::Unauthorized(auth::AuthError::IpNotAllowed).into_response());
        }
        let Some(verifier) = &state.verifier else {
            return Ok(Operator(format!("{peer}")));
        };
        let token = auth::token_from_headers(&parts.headers)
            .ok_or(ApiError::Unauthorized(auth::AuthError::MissingToken).into_response())?;
        let claims = verifier.verify(token).map_err(|e| {
            Metrics::add(&state.metrics.refused_token, 1);
            ApiError::Unauthorized(e).into_response()
        })?;
        if !claims.roles.iter().any(|r| r == ADMIN_ROLE) {
            Metrics::add(&state.metrics.refused_role, 1);
            return Err(ApiError::Forbidden("missing role: admin").into_response());
        }
        Ok(Operator(claims.sub.clone()))
    }
}

/// `POST /api/fleet/rollouts/{name}/{action}`.
pub(crate) async fn act(
    Operator(who): Operator,
    State(state): State<Arc<AppState>>,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let rollouts = &state.rollouts;
    let Some(definition) = rollouts.definitions().into_iter().find(|d| d.name == name) else {
        return error(StatusCode::NOT_FOUND, "no rollout of this name");
    };
    let Some(current) = rollouts
        .state(&name)
        .filter(|s| s.digest == definition.digest)
    else {
        return error(
            StatusCode::CONFLICT,
            "the rollout has not started yet: the leading server starts it within a second",
        );
    };
    let who = Untrusted(&who).capped(64).to_string();
    let next = match (action.as_str(), current.status) {
        ("pause", Status::Running) => RolloutState {
            status: Status::Paused,
            ..current
        },
        ("resume", Status::Paused) => {
            let stage = current.stage;
            RolloutState {
                status: Status::Running,
                ..current
            }
            .stage_starting(stage, super::state::unix_millis())
        }
        ("abort", Status::Running | Status::Paused | Status::Completed) => RolloutState {
            status: Status::Aborted,
            ..current
        },
        ("pause" | "resume" | "abort", status) => {
            return error(
                StatusCode::CONFLICT,
                &format!("the rollout is {}: cannot {action} it", status.as_str()),
            );
        }
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "the actions are pause, resume and abort",
            );
        }
    };
    if !decide(
        rollouts,
        &state.registry,
        &definition,
        next,
        format!("{action} by {who}"),
    )
    .await
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the decision could not be saved in the registry; nothing changed",
        );
    }
    let view = views(&state).into_iter().find(|v| v.name == name);
    Json(view).into_response()
}
