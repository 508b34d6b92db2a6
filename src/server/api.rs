//! The HTTP surface: cc-backend's `/api/fleet/*` routes, `/healthz` and `/metrics` (and
//! the status view's routes, see [`super::status`]). The handlers' shared state is
//! [`super::app::AppState`], their errors [`super::api_error::ApiError`]: both below every
//! handler, so this router may name the handlers of other files.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;

use super::api_error::{ApiError, BODY_LIMIT, error, error_with_status, internal_error};
use super::app::AppState;
use super::auth;
use super::duplicates;
use super::metrics::Metrics;
use super::names;
use super::plugins::is_sha256;
use super::registry::Registration;
use crate::untrusted::Untrusted;
use crate::wire::{
    AgentReport, HEADER_AGENT_REPORT, HEADER_CONFIG_REVISION, Scope, ServiceType, is_instance_id,
};

/// Builds the router.
pub(crate) fn router(state: AppState) -> Router {
    // Extractors clone the state once per request each: one reference count, not one
    // per field.
    let state = Arc::new(state);
    // The fleet routes are authorized by their handlers' first extractor ([`Authorized`]),
    // and the registration body is read with its limit by the handler: a layer around the
    // routes (`route_layer`, `DefaultBodyLimit`) would cost every request another boxed
    // service clone and boxed future, which a registration storm pays for in CPU time.
    Router::new()
        .route("/api/fleet/register/cluster/", post(register_cluster))
        .route("/api/fleet/register/infra/", post(register_infra))
        .route("/api/fleet/heartbeat/{id}", post(heartbeat))
        .route("/api/fleet/config/{id}", get(config))
        .route("/api/fleet/deregister/{id}", delete(deregister))
        .route("/api/fleet/plugins/{sha256}", get(plugin))
        .route("/api/fleet/rollouts", get(super::rollout::api::list))
        .route(
            "/api/fleet/rollouts/{name}/{action}",
            post(super::rollout::api::act),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(super::status::routes())
        .fallback(not_found)
        .with_state(state)
}

/// The `{id}` of a path, checked to be an instance id before any handler runs; its
/// rejection is cc-backend's `400 malformed instance id`. Never shown: it is a credential.
pub(crate) struct InstanceId(String);

impl std::fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InstanceId(..)")
    }
}

impl<S: Send + Sync> FromRequestParts<S> for InstanceId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::MalformedId)?;
        if is_instance_id(&id) {
            Ok(InstanceId(id))
        } else {
            Err(ApiError::MalformedId)
        }
    }
}

async fn not_found() -> Response {
    error_with_status(
        StatusCode::NOT_FOUND,
        "Resource not found",
        "the requested endpoint does not exist",
    )
}

/// 200 when the database takes writes and NATS (if configured) is connected, else 503;
/// the JSON body names each dependency's state.
async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    let report = state.health.check().await;
    let status = if report.healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = serde_json::to_vec(&report).expect("health report serializes");
    body.push(b'\n');
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    state
        .metrics
        .set_duplicate_members(state.duplicates.active() as u64);
    let mut text = state.metrics.render(&state.registry.counts());
    text.push_str(&state.rollouts.render_metrics());
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

/// Proof that a fleet API request passed cc-backend's `AuthAPI` checks: IP allowlist, then
/// token and role. No or a bad token (or a client outside the allowlist) is 401, a valid
/// token without the `api` role 403, as cc-backend documents it. Every fleet handler takes
/// it as its first extractor, so it runs before the path and the body are looked at.
pub(crate) struct Authorized;

impl FromRequestParts<Arc<AppState>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Response> {
        let Some(&ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            // The HTTP server puts it on every request it serves.
            tracing::error!("fleet: an API request without the peer's address");
            return Err(internal_error());
        };
        match refusal(state, &parts.method, &parts.headers, peer) {
            None => Ok(Authorized),
            Some(refused) => Err(refused),
        }
    }
}

/// The answer refusing a fleet API request, if it is refused.
fn refusal(
    state: &AppState,
    method: &Method,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Option<Response> {
    // cc-backend's CSRF guard: browsers must not drive state changes cross-site.
    if method != Method::GET
        && headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        Metrics::add(&state.metrics.refused_cross_site, 1);
        tracing::debug!("fleet: refused cross-site API request from {peer}");
        return Some(error(StatusCode::FORBIDDEN, "cross-site request rejected"));
    }
    let unauthorized = |counter: &AtomicU64, e: auth::AuthError| {
        Metrics::add(counter, 1);
        tracing::debug!("fleet: rejected API request from {peer}: {e}");
        ApiError::Unauthorized(e).into_response()
    };
    let metrics = &state.metrics;
    if !state.allowlist.allows(headers, peer) {
        return Some(unauthorized(
            &metrics.refused_allowlist,
            auth::AuthError::IpNotAllowed,
        ));
    }
    if let Some(verifier) = &state.verifier {
        let Some(token) = auth::token_from_headers(headers) else {
            return Some(unauthorized(
                &metrics.refused_token,
                auth::AuthError::MissingToken,
            ));
        };
        match verifier.verify(token) {
            Ok(claims) if auth::roles_grant_api(&claims.roles) => {}
            Ok(_) => {
                Metrics::add(&metrics.refused_role, 1);
                tracing::debug!("fleet: refused API request from {peer}: missing role: api");
                return Some(ApiError::Forbidden("missing role: api").into_response());
            }
            Err(e) => return Some(unauthorized(&metrics.refused_token, e)),
        }
    }
    None
}

/// The registration body as cc-backend decodes it: a Go struct of strings, so type and
/// emptiness are checked afterwards with cc-backend's messages.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default, rename = "serviceType")]
    service_type: Option<String>,
    #[serde(default, rename = "metaData")]
    meta_data: Option<BTreeMap<String, String>>,
}

async fn register_cluster(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    register(state, Scope::Cluster, request).await
}

async fn register_infra(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    register(state, Scope::Infra, request).await
}

/// The whole body of `request`, at most [`BODY_LIMIT`] bytes. A body of one frame (what
/// a client sends with its headers) is handed on without a copy.
///
/// An oversized body is read up to the limit before it is refused, not refused by its
/// declared length: answering and closing at once would leave a client that is still
/// sending it with a broken pipe instead of the 413.
async fn read_body(request: Request) -> Result<Bytes, ApiError> {
    use futures::StreamExt;
    let mut frames = request.into_body().into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|_| ApiError::BodyUnreadable)?;
        let len = first.as_ref().map_or(0, Bytes::len) + joined.len() + frame.len();
        if len > BODY_LIMIT {
            return Err(ApiError::PayloadTooLarge);
        }
        match &first {
            None if joined.is_empty() => first = Some(frame),
            _ => {
                if let Some(first) = first.take() {
                    joined.extend_from_slice(&first);
                }
                joined.extend_from_slice(&frame);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

fn validate(scope: Scope, body: RegisterBody) -> Result<Registration, String> {
    let cluster = body.cluster.unwrap_or_default();
    let hostname = body.hostname.unwrap_or_default();
    let service_type = body.service_type.unwrap_or_default();
    match scope {
        Scope::Cluster if cluster.is_empty() => return Err("cluster is required".into()),
        Scope::Infra if !cluster.is_empty() => {
            return Err("cluster must be empty for infra registration".into());
        }
        _ => {}
    }
    if hostname.is_empty() {
        return Err("hostname is required".into());
    }
    let Ok(service_type) = service_type.parse::<ServiceType>() else {
        return Err(names::unknown_service_type(&service_type));
    };
    // Both become parts of config-tree paths; the cluster also a roster subject token.
    names::check_hostname(&hostname)?;
    if scope == Scope::Cluster {
        names::check_cluster(&cluster)?;
    }
    let meta = body.meta_data.unwrap_or_default();
    names::check_meta(meta.iter())?;
    Ok(Registration {
        scope,
        cluster,
        hostname,
        service_type,
        meta,
    })
}

/// A registration's answer as cc-backend's `json.NewEncoder` writes it, with the trailing
/// newline.
fn register_response_body(instance_id: &str, config_revision: i64) -> Vec<u8> {
    use std::io::Write;
    debug_assert!(is_instance_id(instance_id));
    let mut body = Vec::with_capacity(64 + instance_id.len());
    writeln!(
        body,
        "{{\"instanceId\":\"{instance_id}\",\"configRevision\":{config_revision}}}"
    )
    .expect("writing to a Vec");
    body
}

async fn register(
    state: Arc<AppState>,
    scope: Scope,
    request: Request,
) -> Result<Response, ApiError> {
    // Who registers: two services taking turns with one identity show as alternating peers.
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|&ConnectInfo(tcp)| {
            duplicates::peer_of(&state.allowlist.client_ip(request.headers(), tcp), tcp)
        });
    let body = read_body(request).await?;
    // Like Go's json.Decoder, only the first JSON value of the body counts.
    let parsed = serde_json::Deserializer::from_slice(&body)
        .into_iter::<RegisterBody>()
        .next();
    let request = match parsed {
        Some(Ok(request)) => request,
        Some(Err(e)) => return Err(ApiError::BadRequest(e.to_string())),
        None => return Err(ApiError::BadRequest("empty request body".into())),
    };
    let registration = validate(scope, request).map_err(ApiError::BadRequest)?;
    // Names come from the client: escaped in the log even though validation refuses
    // control characters, so a future rule change cannot reopen log forging. Built only
    // when the line is written: a storm should not pay for lines nobody reads.
    let label = tracing::enabled!(tracing::Level::INFO).then(|| match scope {
        Scope::Cluster => format!(
            "{}/{}/{}",
            Untrusted(&registration.cluster),
            registration.service_type.code(),
            Untrusted(&registration.hostname)
        ),
        Scope::Infra => format!(
            "infra {}/{}",
            registration.service_type.code(),
            Untrusted(&registration.hostname)
        ),
    });
    let member = peer.map(|peer| {
        (
            peer,
            registration.scope,
            registration.cluster.clone(),
            registration.hostname.clone(),
            registration.service_type,
        )
    });
    let registered = state
        .registry
        .register(registration)
        .await
        .map_err(|e| ApiError::internal("registering a service", e))?;
    if let Some(label) = label {
        tracing::info!("fleet: registered {label}");
    }
    if let Some((peer, scope, cluster, hostname, service_type)) = member {
        state
            .duplicates
            .registered(scope, &cluster, &hostname, service_type, peer);
    }
    state.roster.notify();
    // What serde_json writes for a RegisterResponse (the id is 32 hex digits, nothing to
    // escape), into one buffer of the right size; tests compare the two.
    let body = register_response_body(&registered.instance_id, registered.config_revision);
    Ok((
        StatusCode::CREATED,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

async fn heartbeat(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    InstanceId(id): InstanceId,
) -> Result<Response, ApiError> {
    let activated = state
        .registry
        .heartbeat(&id)
        .await
        .map_err(|e| ApiError::registry("applying a heartbeat", e))?
        .ok_or(ApiError::UnknownInstance)?;
    Metrics::add(&state.metrics.rest_heartbeats, 1);
    if activated {
        state.roster.notify();
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// cc-backend's `etagMatches`: a comma-separated list, `*` matches anything, `W/` and
/// quotes are ignored.
fn etag_matches(if_none_match: &str, revision: &str) -> bool {
    if_none_match.split(',').map(str::trim).any(|tag| {
        if tag == "*" {
            return true;
        }
        let tag = tag.strip_prefix("W/").unwrap_or(tag);
        tag.trim_matches('"') == revision
    })
}

async fn config(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    InstanceId(id): InstanceId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let service = state
        .registry
        .lookup_fresh(&id)
        .await
        .map_err(|e| ApiError::registry("looking up an instance", e))?
        .filter(|s| s.state != super::registry::State::Deregistered)
        .ok_or(ApiError::UnknownInstance)?;
    // ccfleet's agents report what they run with each poll; cc-lib's Go client does not.
    if let Some(raw) = headers.get(HEADER_AGENT_REPORT) {
        match raw
            .to_str()
            .map_err(|_| "not ASCII".to_owned())
            .and_then(AgentReport::parse)
        {
            Ok(report) => state.rollouts.record_report(&service, report),
            Err(e) => {
                state
                    .rollouts
                    .counters
                    .bad_reports
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(
                    "fleet: a report from {} refused: {}",
                    Untrusted(&service.hostname).capped(64),
                    Untrusted(&e).capped(200)
                );
            }
        }
    }
    let overlay = state.rollouts.overlay(&service);
    let resolved = state.tree.as_ref().and_then(|tree| {
        tree.resolve_with(
            service.scope,
            &service.cluster,
            service.service_type,
            &service.hostname,
            overlay
                .as_ref()
                .map(|d| (d.overlay_key(), &d.change))
                .as_ref()
                .map(|(key, change)| (key.as_str(), *change)),
        )
    });
    let Some(resolved) = resolved else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let revision = resolved.revision.to_string();
    state.status.served(&resolved);
    // cc-backend acknowledges before the conditional check: a 304 is a successful pull too.
    if resolved.revision != service.config_revision {
        state
            .registry
            .acknowledge(&id, resolved.revision)
            .await
            .map_err(|e| ApiError::internal("acknowledging a config revision", e))?;
    }
    let etag = HeaderValue::from_str(&format!("\"{revision}\"")).expect("digits are valid");
    let rev_header = HeaderValue::from_str(&revision).expect("digits are valid");
    let not_modified = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| etag_matches(v, &revision));
    let mut response = if not_modified {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = Response::new(Body::from(resolved.blob.clone()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    response.headers_mut().insert(header::ETAG, etag);
    response
        .headers_mut()
        .insert(HEADER_CONFIG_REVISION, rev_header);
    Ok(response)
}

/// A component of `fleet.plugin-dir` by the SHA-256 of its content, streamed.
async fn plugin(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    Path(sha256): Path<String>,
) -> Response {
    if !is_sha256(&sha256) {
        return error(
            StatusCode::BAD_REQUEST,
            "a plugin is named by its SHA-256: 64 lowercase hexadecimal digits",
        );
    }
    let Some(dir) = state.plugins.clone() else {
        return error(StatusCode::NOT_FOUND, "no plugin-dir is configured");
    };
    let lookup = sha256.clone();
    let found = match tokio::task::spawn_blocking(move || dir.find(&lookup)).await {
        Ok(found) => found,
        Err(_) => return internal_error(),
    };
    let Some(found) = found else {
        return error(StatusCode::NOT_FOUND, "no plugin has this SHA-256");
    };
    let file = match tokio::fs::File::open(&found.path).await {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!("fleet: cannot open plugin {}: {e}", found.path.display());
            return error(StatusCode::NOT_FOUND, "no plugin has this SHA-256");
        }
    };
    // Streamed in chunks: a component is never held in memory whole. The length is the
    // indexed one, so a file rewritten while it is sent ends the response short and the
    // agent's hash check refuses it.
    let chunks = futures::stream::unfold((file, found.len), |(mut file, left)| async move {
        use tokio::io::AsyncReadExt;
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; (64 << 10).min(left as usize)];
        match file.read(&mut buf).await {
            Ok(0) => Some((
                Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
                (file, 0),
            )),
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), (file, left - n as u64)))
            }
            Err(e) => Some((Err(e), (file, 0))),
        }
    });
    let mut response = Response::new(Body::from_stream(chunks));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/wasm"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(found.len));
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{sha256}\"")) {
        headers.insert(header::ETAG, etag);
    }
    response
}

async fn deregister(
    _: Authorized,
    State(state): State<Arc<AppState>>,
    InstanceId(id): InstanceId,
) -> Result<Response, ApiError> {
    let changed = state
        .registry
        .deregister(&id)
        .await
        .map_err(|e| ApiError::registry("deregistering a service", e))?;
    if changed {
        tracing::info!("fleet: deregistered an instance");
        state.roster.notify();
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RegisterResponse;

    #[test]
    fn a_registration_answer_is_what_serde_json_writes_for_it() {
        for (id, revision) in [
            ("0123456789abcdef0123456789abcdef", 0),
            ("ffffffffffffffffffffffffffffffff", i64::MAX),
            ("00000000000000000000000000000000", -1),
        ] {
            let mut expected = serde_json::to_vec(&RegisterResponse {
                instance_id: id.into(),
                config_revision: revision,
            })
            .unwrap();
            expected.push(b'\n');
            assert_eq!(
                String::from_utf8(register_response_body(id, revision)).unwrap(),
                String::from_utf8(expected).unwrap()
            );
        }
    }

    #[test]
    fn etags() {
        assert!(etag_matches("\"12\"", "12"));
        assert!(etag_matches("W/\"12\"", "12"));
        assert!(etag_matches("\"1\", \"12\"", "12"));
        assert!(etag_matches("*", "12"));
        assert!(etag_matches("12", "12"));
        assert!(!etag_matches("\"123\"", "12"));
        assert!(!etag_matches("", "12"));
    }
}
