//! Errors of the fleet client.
//!
//! A caller can match an unknown instance (404), a rejected credential (401/403), a client
//! that is not registered, an unreachable cc-backend and any other unexpected status. A
//! server error (5xx) or 429 Too Many Requests counts as unreachable: cc-backend (or a proxy
//! in front of it) is there but cannot serve now, so the caller starts from its cache and
//! retries, as it does when the network fails. With several fleet servers configured, these
//! failures first send the request to the next server; the error is the last server's. No
//! message carries the token or the instance id: the id is a bearer credential for
//! heartbeats, so it is also scrubbed from response bodies quoted in errors.

use std::fmt;
use std::time::Duration;

use super::Update;
use super::config::ConfigError;
use crate::duration::GoDuration;

/// The operation a request belonged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `POST /api/fleet/register/{cluster|infra}/`.
    Register,
    /// `GET /api/fleet/config/{id}`.
    Config,
    /// A heartbeat, over REST (`POST /api/fleet/heartbeat/{id}`) or NATS.
    Heartbeat,
    /// `DELETE /api/fleet/deregister/{id}`.
    Deregister,
    /// [`Client::bootstrap`](super::Client::bootstrap) as a whole.
    Bootstrap,
    /// [`Client::close`](super::Client::close) as a whole.
    Close,
    /// `GET /healthz`: probing a fleet server that failed, to return to it.
    Health,
}

impl Op {
    /// The lowercase name used in messages (`register`, `config`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Register => "register",
            Op::Config => "config",
            Op::Heartbeat => "heartbeat",
            Op::Deregister => "deregister",
            Op::Bootstrap => "bootstrap",
            Op::Close => "close",
            Op::Health => "health",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest response-body excerpt kept in a [`StatusError`].
pub const MAX_DETAIL: usize = 256;

/// An HTTP status cc-backend was not expected to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusError {
    /// The operation.
    pub op: Op,
    /// The HTTP status code.
    pub code: u16,
    /// The status line, e.g. `404 Not Found`.
    pub status: String,
    /// At most [`MAX_DETAIL`] bytes of the response body, trimmed, with instance ids removed.
    pub detail: String,
}

impl StatusError {
    /// Builds the error from a status and the raw response body.
    pub fn new(op: Op, status: reqwest::StatusCode, body: &[u8]) -> StatusError {
        StatusError {
            op,
            code: status.as_u16(),
            status: status.to_string(),
            detail: detail(body),
        }
    }
}

impl StatusError {
    /// Whether the status says "not now" rather than "never": a server error (5xx) or 429 Too
    /// Many Requests, both of which a proxy or a restarting cc-backend answers for a while.
    pub fn is_transient(&self) -> bool {
        self.code >= 500 || self.code == 429
    }
}

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fleet {}: unexpected status {}", self.op, self.status)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for StatusError {}

/// An error of a fleet client operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// cc-backend answered 404: the instance id was rotated by another registration or the
    /// instance was deregistered. The run loop registers again.
    #[error("fleet: unknown or deregistered instance ({0})")]
    UnknownInstance(StatusError),
    /// cc-backend answered 401 or 403: the token is invalid, lacks the `api` role, or the
    /// address is not in cc-backend's allowlist.
    #[error("fleet: request not authorized ({0})")]
    Unauthorized(StatusError),
    /// Any other unexpected status.
    #[error(transparent)]
    Status(StatusError),
    /// The operation needs an instance id and the client has none.
    #[error("fleet: not registered")]
    NotRegistered,
    /// The request did not get a response (connection, TLS or timeout failure).
    #[error("fleet {op}: cc-backend unreachable: {}", chain(source))]
    Unreachable {
        /// The operation.
        op: Op,
        /// The transport error, stripped of the URL (which holds the instance id).
        #[source]
        source: reqwest::Error,
    },
    /// The response had the expected status but an unusable body.
    #[error("fleet {op}: {reason}")]
    InvalidResponse {
        /// The operation.
        op: Op,
        /// What is wrong with the body.
        reason: String,
    },
    /// The operation did not finish in time.
    #[error("fleet {op}: timed out after {}", GoDuration(*after))]
    Timeout {
        /// The operation.
        op: Op,
        /// The time allowed.
        after: Duration,
    },
    /// [`Client::run`](super::Client::run) is already running.
    #[error("fleet: run already running")]
    AlreadyRunning,
    /// The client was closed.
    #[error("fleet: client closed")]
    Closed,
    /// The options are unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The default HTTP client could not be built.
    #[error("fleet: building the HTTP client: {}", chain(.0))]
    HttpClient(#[source] reqwest::Error),
}

impl Error {
    /// Classifies an unexpected status: 404 is an unknown instance, 401/403 unauthorized.
    pub fn from_status(err: StatusError) -> Error {
        match err.code {
            404 => Error::UnknownInstance(err),
            401 | 403 => Error::Unauthorized(err),
            _ => Error::Status(err),
        }
    }

    /// A transport failure; the URL is dropped from the error because it holds the id.
    pub(crate) fn unreachable(op: Op, source: reqwest::Error) -> Error {
        Error::Unreachable {
            op,
            source: source.without_url(),
        }
    }

    /// The status error behind this error, if cc-backend answered with an unexpected status.
    pub fn status(&self) -> Option<&StatusError> {
        match self {
            Error::UnknownInstance(s) | Error::Unauthorized(s) | Error::Status(s) => Some(s),
            _ => None,
        }
    }

    /// Whether cc-backend does not know the instance (any more).
    pub fn is_unknown_instance(&self) -> bool {
        matches!(self, Error::UnknownInstance(_))
    }

    /// Whether cc-backend rejected the credentials (401/403).
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, Error::Unauthorized(_))
    }

    /// Whether cc-backend could not be reached or gave no usable answer, including a
    /// transient status (5xx, 429; see [`StatusError::is_transient`]).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Timeout { .. } | Error::InvalidResponse { .. } => {
                true
            }
            Error::Status(status) => status.is_transient(),
            _ => false,
        }
    }
}

/// [`Client::bootstrap`](super::Client::bootstrap) failed; the error carries the update to start
/// with instead (the cached configuration, or none).
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// cc-backend could not be reached, gave no usable answer in time, or answered with a
    /// transient status (5xx, 429).
    #[error("{}", unreachable_message(source))]
    Unreachable {
        /// The cached configuration ([`Source::Cache`](super::Source::Cache)) or none.
        fallback: Update,
        /// What went wrong.
        #[source]
        source: Error,
    },
    /// cc-backend rejected the token or the address (401/403).
    #[error("{source}")]
    Unauthorized {
        /// The cached configuration or none.
        fallback: Update,
        /// The rejection.
        #[source]
        source: Error,
    },
    /// cc-backend answered with another unexpected status (a 4xx other than 401, 403, 429).
    #[error("{source}")]
    Failed {
        /// The cached configuration or none.
        fallback: Update,
        /// The status error.
        #[source]
        source: Error,
    },
}

impl BootstrapError {
    pub(crate) fn classify(fallback: Update, source: Error) -> BootstrapError {
        if source.is_unauthorized() {
            BootstrapError::Unauthorized { fallback, source }
        } else if source.status().is_some() && !source.is_unreachable() {
            BootstrapError::Failed { fallback, source }
        } else {
            BootstrapError::Unreachable { fallback, source }
        }
    }

    /// The update to start with: the cached configuration, or [`Source::None`](super::Source::None).
    pub fn fallback(&self) -> &Update {
        match self {
            BootstrapError::Unreachable { fallback, .. }
            | BootstrapError::Unauthorized { fallback, .. }
            | BootstrapError::Failed { fallback, .. } => fallback,
        }
    }

    /// Takes the fallback update out of the error.
    pub fn into_fallback(self) -> Update {
        match self {
            BootstrapError::Unreachable { fallback, .. }
            | BootstrapError::Unauthorized { fallback, .. }
            | BootstrapError::Failed { fallback, .. } => fallback,
        }
    }

    /// The underlying client error.
    pub fn error(&self) -> &Error {
        match self {
            BootstrapError::Unreachable { source, .. }
            | BootstrapError::Unauthorized { source, .. }
            | BootstrapError::Failed { source, .. } => source,
        }
    }

    /// Whether cc-backend could not be reached.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, BootstrapError::Unreachable { .. })
    }

    /// Whether cc-backend rejected the credentials.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, BootstrapError::Unauthorized { .. })
    }
}

fn unreachable_message(source: &Error) -> String {
    match source {
        // Already says "cc-backend unreachable".
        Error::Unreachable { .. } => source.to_string(),
        other => format!("fleet: cc-backend unreachable: {other}"),
    }
}

/// The error and its sources on one line, so a log line says why a connection failed.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // hyper and reqwest repeat their inner error in their own message at times.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Up to [`MAX_DETAIL`] bytes of a response body, trimmed, instance ids replaced.
pub(crate) fn detail(body: &[u8]) -> String {
    let head = &body[..body.len().min(MAX_DETAIL)];
    let mut text = String::from_utf8_lossy(head).into_owned();
    // A cut multi-byte sequence became U+FFFD, which is longer than what it replaced.
    while text.len() > MAX_DETAIL {
        text.pop();
    }
    redact_ids(text.trim())
}

/// Replaces every run of exactly 32 hex digits (the shape of an instance id) with `<id>`.
pub(crate) fn redact_ids(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_hexdigit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_hexdigit() {
                i += 1;
            }
            if i - start == 32 {
                out.push_str("<id>");
            } else {
                out.push_str(&text[start..i]);
            }
        } else {
            let start = i;
            while i < bytes.len() && !bytes[i].is_ascii_hexdigit() {
                i += 1;
            }
            out.push_str(&text[start..i]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    const ID: &str = "3f1c9a2b7d4e6f8a0b1c2d3e4f5a6b7c";

    #[test]
    fn status_error_text_like_go() {
        let e = StatusError::new(Op::Config, StatusCode::INTERNAL_SERVER_ERROR, b"  boom \n");
        assert_eq!(
            e.to_string(),
            "fleet config: unexpected status 500 Internal Server Error: boom"
        );
        let e = StatusError::new(Op::Register, StatusCode::BAD_REQUEST, b"");
        assert_eq!(
            e.to_string(),
            "fleet register: unexpected status 400 Bad Request"
        );
    }

    #[test]
    fn classification() {
        let s =
            |code: u16| StatusError::new(Op::Heartbeat, StatusCode::from_u16(code).unwrap(), b"");
        assert!(Error::from_status(s(404)).is_unknown_instance());
        assert!(Error::from_status(s(401)).is_unauthorized());
        assert!(Error::from_status(s(403)).is_unauthorized());
        let other = Error::from_status(s(502));
        assert!(matches!(other, Error::Status(ref e) if e.code == 502));
        assert_eq!(other.status().unwrap().op, Op::Heartbeat);
    }

    #[test]
    fn server_errors_and_429_are_unreachable_and_other_statuses_are_not() {
        let s =
            |code: u16| StatusError::new(Op::Register, StatusCode::from_u16(code).unwrap(), b"");
        for code in [500, 502, 503, 504, 429] {
            assert!(Error::from_status(s(code)).is_unreachable(), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 413, 422] {
            assert!(!Error::from_status(s(code)).is_unreachable(), "{code}");
        }
    }

    #[test]
    fn detail_is_bounded_and_never_holds_an_id() {
        let body = format!(
            r#"{{"status":"Not Found","error":"instance {ID} is unknown"}}{}"#,
            "x".repeat(1000)
        );
        let e = StatusError::new(Op::Heartbeat, StatusCode::NOT_FOUND, body.as_bytes());
        assert!(e.detail.len() <= MAX_DETAIL);
        let text = Error::from_status(e).to_string();
        assert!(!text.contains(ID), "{text}");
        assert!(text.contains("instance <id> is unknown"), "{text}");
    }

    #[test]
    fn detail_cuts_multibyte_text_within_bounds() {
        let body = "é".repeat(300);
        let d = detail(body.as_bytes());
        assert!(d.len() <= MAX_DETAIL);
        assert!(d.starts_with("éé"));
    }

    #[test]
    fn redaction_leaves_other_hex_runs_alone() {
        assert_eq!(redact_ids("rev 12345 ok"), "rev 12345 ok");
        let longer = format!("{ID}0");
        assert_eq!(redact_ids(&longer), longer);
        assert_eq!(redact_ids(&format!("/{ID}/")), "/<id>/");
    }

    #[test]
    fn bootstrap_classification() {
        let fallback = Update::none();
        let unauthorized = Error::from_status(StatusError::new(
            Op::Register,
            StatusCode::UNAUTHORIZED,
            br#"{"error":"bad token"}"#,
        ));
        let e = BootstrapError::classify(fallback.clone(), unauthorized);
        assert!(e.is_unauthorized() && !e.is_unreachable());
        let e = BootstrapError::classify(
            fallback.clone(),
            Error::Timeout {
                op: Op::Bootstrap,
                after: Duration::from_secs(10),
            },
        );
        assert!(e.is_unreachable());
        assert_eq!(
            e.to_string(),
            "fleet: cc-backend unreachable: fleet bootstrap: timed out after 10s"
        );
        let e = BootstrapError::classify(
            fallback.clone(),
            Error::from_status(StatusError::new(Op::Config, StatusCode::BAD_GATEWAY, b"")),
        );
        assert!(e.is_unreachable(), "{e}");
        assert_eq!(
            e.to_string(),
            "fleet: cc-backend unreachable: fleet config: unexpected status 502 Bad Gateway"
        );
        let e = BootstrapError::classify(
            fallback,
            Error::from_status(StatusError::new(Op::Register, StatusCode::BAD_REQUEST, b"")),
        );
        assert!(matches!(e, BootstrapError::Failed { .. }));
    }
}
