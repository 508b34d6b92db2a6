//! The status web page: its assets (compiled into the binary), the login form and the
//! data it refreshes itself from.
//!
//! Every answer carries a Content-Security-Policy that allows this origin's script and
//! style sheet only (no inline script or style, no other origin, no framing), so a name
//! that slipped into the markup could not run; the script shows every name through
//! `textContent` in the first place. Pages and data are never cached.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{ConnectInfo, Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::super::app::AppState;
use super::super::metrics::Metrics;
use super::super::registry::unix_seconds;
use super::access::{self, Refused};
use super::origin::{came_over_tls, check_same_origin};
use super::session::{self, Session};
use super::view::{view_query, with_view};
use crate::untrusted::Untrusted;

const PAGE_HTML: &str = include_str!("../web/fleet.html");
const LOGIN_HTML: &str = include_str!("../web/login.html");
const SCRIPT_JS: &str = include_str!("../web/fleet.js");
const STYLE_CSS: &str = include_str!("../web/fleet.css");

/// Where the login page shows its message.
const MESSAGE_SLOT: &str = "<!--message-->";

/// The policy of every answer under `/fleet/`.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// Adds the page's security headers.
fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    secured(
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body,
        )
            .into_response(),
    )
}

fn redirect(to: &'static str) -> Response {
    secured(
        (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, HeaderValue::from_static(to))],
        )
            .into_response(),
    )
}

/// A redirect to `path` (one of this server's) keeping the view `query` names.
fn redirect_with_view(path: &'static str, query: &ViewQuery) -> Response {
    let view = match query {
        Ok(Query(pairs)) => view_query(pairs),
        Err(_) => String::new(),
    };
    // The view is percent-encoded ASCII: always a header value.
    match HeaderValue::from_str(&with_view(path, &view)) {
        Ok(to) => secured((StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()),
        Err(_) => redirect(path),
    }
}

/// A request's query pairs, for the view it carries.
type ViewQuery = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// Escapes text for HTML element content and attribute values.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The login page, with `message` (if any) shown above the form.
fn login_form(status: StatusCode, message: Option<&str>) -> Response {
    let body = match message {
        Some(text) => LOGIN_HTML.replace(
            MESSAGE_SLOT,
            &format!(
                "<p class=\"message\" role=\"alert\">{}</p>",
                escape_html(text)
            ),
        ),
        None => LOGIN_HTML.to_owned(),
    };
    secured(
        (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            )],
            body,
        )
            .into_response(),
    )
}

/// The browser's live session, if it has one.
fn session_of(state: &AppState, headers: &HeaderMap) -> Option<Session> {
    let id = session::id_from_headers(headers)?;
    state.status.sessions.get(&id, unix_seconds())
}

/// Whether the page may be shown: a live session, or no authentication at all.
fn viewer(state: &AppState, headers: &HeaderMap) -> Option<Option<String>> {
    if state.verifier.is_none() {
        return Some(None);
    }
    session_of(state, headers).map(|s| Some(s.user))
}

/// `GET /fleet`: the page lives at `/fleet/` (its assets are relative to it).
pub(crate) async fn to_page() -> Response {
    redirect("/fleet/")
}

/// `GET /fleet/`; without a session, the login form, which keeps the view the URL names.
pub(crate) async fn page(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: ViewQuery,
) -> Response {
    match viewer(&state, &headers) {
        Some(_) => asset("text/html; charset=utf-8", PAGE_HTML),
        None => redirect_with_view("/fleet/login", &query),
    }
}

/// `GET /fleet/login`. The form posts to the URL it was shown at, so the view in its query
/// goes with the token.
pub(crate) async fn login_page(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: ViewQuery,
) -> Response {
    match viewer(&state, &headers) {
        Some(_) => redirect_with_view("/fleet/", &query),
        None => login_form(StatusCode::OK, None),
    }
}

/// The login form's fields.
#[derive(Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
}

/// Refuses a state-changing request that does not come from this site.
fn refuse_cross_site(
    state: &AppState,
    headers: &HeaderMap,
    peer: SocketAddr,
    tls: bool,
) -> Option<Response> {
    let refused = check_same_origin(headers, tls).err()?;
    Metrics::add(&state.metrics.refused_cross_site, 1);
    tracing::debug!(
        "fleet: refused status page request from {peer}: {}",
        refused.message()
    );
    Some(login_form(StatusCode::FORBIDDEN, Some(refused.message())))
}

/// `POST /fleet/login`: a token with `admin` or `support` opens a session.
pub(crate) async fn login(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    query: ViewQuery,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let tls = came_over_tls(&headers, peer, &state.status.proxies);
    if let Some(refused) = refuse_cross_site(&state, &headers, peer, tls) {
        return refused;
    }
    let Some(verifier) = &state.verifier else {
        return redirect_with_view("/fleet/", &query);
    };
    let Ok(Form(form)) = form else {
        return login_form(
            StatusCode::BAD_REQUEST,
            Some("the login form was not sent as a form"),
        );
    };
    let token = form.token.trim();
    let claims = match access::check_token(verifier, (!token.is_empty()).then_some(token)) {
        Ok(claims) => claims,
        Err(Refused::Token(e)) => {
            Metrics::add(&state.metrics.refused_token, 1);
            tracing::debug!("fleet: status page login from {peer} refused: {e}");
            return login_form(
                StatusCode::UNAUTHORIZED,
                Some(&format!("The token was not accepted: {e}.")),
            );
        }
        Err(Refused::Role) => {
            Metrics::add(&state.metrics.refused_role, 1);
            tracing::debug!(
                "fleet: status page login from {peer} refused: {}",
                access::MISSING_ROLE
            );
            return login_form(
                StatusCode::FORBIDDEN,
                Some(
                    "The token lacks the admin or support role; node tokens (role api) cannot open this page.",
                ),
            );
        }
    };
    let now = unix_seconds();
    let (id, session) = state.status.sessions.open(&claims.sub, now, claims.exp);
    tracing::info!(
        "fleet: status page login by {} from {peer}",
        Untrusted(&claims.sub).capped(64)
    );
    let mut response = redirect_with_view("/fleet/", &query);
    let cookie = session::cookie(&id, session.expires - now, tls);
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// `POST /fleet/logout`: ends the session and removes the cookie.
pub(crate) async fn logout(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let tls = came_over_tls(&headers, peer, &state.status.proxies);
    if let Some(refused) = refuse_cross_site(&state, &headers, peer, tls) {
        return refused;
    }
    if let Some(id) = session::id_from_headers(&headers) {
        state.status.sessions.close(&id);
    }
    let mut response = redirect("/fleet/login");
    if let Ok(value) = HeaderValue::from_str(&session::removal_cookie(tls)) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// `GET /fleet/status.json`: the view, for a live session.
pub(crate) async fn status_json(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Response {
    match viewer(&state, &headers) {
        Some(user) => secured(super::json_answer(&super::page_answer(&state, user).await)),
        None => no_session(),
    }
}

/// The 401 of a data route asked without a live session.
fn no_session() -> Response {
    secured(
        super::super::api_error::ApiError::Unauthorized(
            super::super::auth::AuthError::MissingToken,
        )
        .into_response(),
    )
}

/// `GET /fleet/summary.json`: the summary of the members the query names.
pub(crate) async fn summary_json(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    if viewer(&state, &headers).is_none() {
        return no_session();
    }
    match super::parse_summary_query(query) {
        Ok((query, form)) => secured(super::summary_answer(&state, &headers, &query, form)),
        Err(e) => secured(e.into_response()),
    }
}

/// `GET /fleet/instances.json`: the page of members the query names.
pub(crate) async fn instances_json(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    if viewer(&state, &headers).is_none() {
        return no_session();
    }
    match super::parse_query(query) {
        Ok(query) => secured(super::instances_answer(&state, &headers, &query)),
        Err(e) => secured(e.into_response()),
    }
}

/// `GET /fleet/overview.json`: rosters and rollouts.
pub(crate) async fn overview_json(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Response {
    match viewer(&state, &headers) {
        Some(user) => secured(super::overview_answer(&state, &headers, user).await),
        None => no_session(),
    }
}

/// `GET /fleet/fleet.js`.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT_JS)
}

/// `GET /fleet/fleet.css`.
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether markup holds an attribute such as `onclick=`.
    fn has_event_attribute(markup: &str) -> bool {
        markup.match_indices(" on").any(|(at, _)| {
            let rest = &markup[at + 3..];
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with('=')
        })
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(
            escape_html(r#"<img src=x onerror="a('&')">"#),
            "&lt;img src=x onerror=&quot;a(&#39;&amp;&#39;)&quot;&gt;"
        );
    }

    #[test]
    fn the_assets_use_no_inline_script_or_style_and_no_other_origin() {
        for (name, text) in [("fleet.html", PAGE_HTML), ("login.html", LOGIN_HTML)] {
            let lower = text.to_ascii_lowercase();
            assert!(!lower.contains("<script>"), "{name}: inline script");
            assert!(!lower.contains(" style="), "{name}: inline style");
            assert!(!lower.contains("<style"), "{name}: inline style sheet");
            assert!(
                !has_event_attribute(&lower),
                "{name}: an event handler attribute"
            );
            assert!(
                !lower.contains("http://") && !lower.contains("https://"),
                "{name}: another origin"
            );
        }
        assert!(LOGIN_HTML.contains(MESSAGE_SLOT));
        assert!(
            !SCRIPT_JS.contains("innerHTML"),
            "names go through textContent"
        );
        assert!(!SCRIPT_JS.contains("http://") && !SCRIPT_JS.contains("https://"));
    }
}
