//! How the fleet API answers a failed request: cc-backend's status codes and error bodies,
//! in one place below the handlers of every route (the registration routes, the rollouts'
//! and the status view's), so none of them needs another's file for its errors.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::auth;
use super::error::{RegistryError, RegistryErrorKind};

/// Request bodies larger than this answer 413.
pub const BODY_LIMIT: usize = 1 << 20;

/// Go's `http.StatusText`, which cc-backend puts into error bodies.
fn status_text(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Request Entity Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => status.canonical_reason().unwrap_or(""),
    }
}

/// cc-backend's `ErrorResponse`, written by `json.NewEncoder` (with a trailing newline).
pub(crate) fn error_with_status(status: StatusCode, status_field: &str, message: &str) -> Response {
    #[derive(serde::Serialize)]
    struct ErrorResponse<'a> {
        status: &'a str,
        error: &'a str,
    }
    let mut body = serde_json::to_vec(&ErrorResponse {
        status: status_field,
        error: message,
    })
    .expect("error body serializes");
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

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    error_with_status(status, status_text(status), message)
}

/// The 500 answer; what went wrong is logged by the caller, never sent.
pub(crate) fn internal_error() -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, "internal server error")
}

/// Every way an API request fails, mapped to cc-backend's status and error body in one
/// place ([`IntoResponse`]); internal errors are logged there and answered without detail.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// 400 with the message.
    BadRequest(String),
    /// 400: the path's instance id is not 32 lowercase hex digits.
    MalformedId,
    /// 404: no such live instance.
    UnknownInstance,
    /// 401: no, or no valid, credentials (or a client outside `api-allowed-ips`).
    Unauthorized(auth::AuthError),
    /// 403: authenticated, but not allowed.
    Forbidden(&'static str),
    /// 413: the body exceeds [`BODY_LIMIT`].
    PayloadTooLarge,
    /// 400: the body could not be read (it stalled or broke off).
    BodyUnreadable,
    /// 503 with `Retry-After`: the request names an instance this server does not know and
    /// it cannot tell whether another server sharing the registry registered it a moment
    /// ago. Never answered 404 (an agent would re-register and lose its identity) nor
    /// 204 (nothing was deregistered).
    Undecided,
    /// 500: a failure of the server itself.
    Internal {
        /// What the server was doing.
        context: &'static str,
        /// Why it failed (logged, never answered).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ApiError {
    pub(crate) fn internal(
        context: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ApiError::Internal {
            context,
            source: Box::new(e),
        }
    }

    /// A registry failure: [`ApiError::Undecided`] when the registry could not tell whether
    /// the instance exists, else an internal error.
    pub(crate) fn registry(context: &'static str, e: RegistryError) -> Self {
        if e.kind() == RegistryErrorKind::Behind {
            ApiError::Undecided
        } else {
            ApiError::internal(context, e)
        }
    }
}

/// Seconds an undecided request's client is asked to wait before it retries: about how
/// long a shared registry's watch needs to deliver a registration made through another
/// server once the bucket answers again.
const UNDECIDED_RETRY_AFTER: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::BadRequest(message) => error(StatusCode::BAD_REQUEST, &message),
            ApiError::MalformedId => error(StatusCode::BAD_REQUEST, "malformed instance id"),
            ApiError::UnknownInstance => {
                error(StatusCode::NOT_FOUND, "unknown or deregistered instance id")
            }
            ApiError::Unauthorized(e) => error(StatusCode::UNAUTHORIZED, &e.to_string()),
            ApiError::Forbidden(message) => error(StatusCode::FORBIDDEN, message),
            // The rest of the body is never read, so the connection cannot carry another
            // request: say so, or a client reusing it races the server's close and fails
            // its next request with an incomplete message.
            ApiError::PayloadTooLarge => closing(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body exceeds {BODY_LIMIT} bytes"),
            )),
            ApiError::BodyUnreadable => {
                closing(error(StatusCode::BAD_REQUEST, "cannot read request body"))
            }
            ApiError::Undecided => {
                tracing::debug!("fleet: answered 503: the shared registry is not caught up");
                let mut response = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot tell whether the instance exists yet: the shared registry is \
                     catching up; retry",
                );
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(UNDECIDED_RETRY_AFTER),
                );
                response
            }
            ApiError::Internal { context, source } => {
                // The registry logs the first failure of a burst of failed writes itself
                // (and the burst's end); one error line per request would flood the log
                // while the disk is full. An interrupted store task is not logged there.
                let logged_by_registry = source
                    .downcast_ref::<RegistryError>()
                    .is_some_and(|e| e.kind() != RegistryErrorKind::Interrupted);
                if logged_by_registry {
                    tracing::debug!("fleet: {context}: {source}");
                } else {
                    tracing::error!("fleet: {context}: {source}");
                }
                internal_error()
            }
        }
    }
}

/// Marks a response as the connection's last.
pub(crate) fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_undecided_instance_is_a_retryable_503_never_unknown() {
        for context in ["applying a heartbeat", "deregistering a service"] {
            let response = ApiError::registry(context, RegistryError::behind()).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        }
        let full = RegistryError::new(RegistryErrorKind::Unavailable, "disk is full");
        assert_eq!(
            ApiError::registry("registering", full)
                .into_response()
                .status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    /// Counts the error events sent to it.
    struct CountErrors(Arc<std::sync::atomic::AtomicUsize>);

    impl tracing::Subscriber for CountErrors {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::ERROR {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    fn errors_logged(e: ApiError) -> (u16, usize) {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let status = tracing::subscriber::with_default(CountErrors(count.clone()), || {
            e.into_response().status().as_u16()
        });
        (status, count.load(std::sync::atomic::Ordering::Relaxed))
    }

    #[test]
    fn a_failed_registry_write_answers_500_without_an_error_line_per_request() {
        let full = || RegistryError::new(RegistryErrorKind::Unavailable, "disk is full");
        for _ in 0..3 {
            assert_eq!(
                errors_logged(ApiError::internal("register", full())),
                (500, 0)
            );
        }
        let interrupted = RegistryError::new(RegistryErrorKind::Interrupted, "cancelled");
        assert_eq!(
            errors_logged(ApiError::internal("register", interrupted)),
            (500, 1)
        );
        let other = std::io::Error::other("something else");
        assert_eq!(errors_logged(ApiError::internal("tree", other)), (500, 1));
    }
}
