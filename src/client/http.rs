//! Requests to cc-backend: headers, bounded body reads, draining for connection reuse, and
//! turning unexpected statuses into errors.

use std::time::Duration;

use reqwest::header::{ACCEPT, HeaderValue};
use reqwest::{Method, RequestBuilder, Response};

use super::config::ConfigError;
use super::error::{Error, MAX_DETAIL, Op, StatusError};

/// Header carrying the JWT, as cc-backend's API expects it.
pub(crate) const AUTH_HEADER: &str = "X-Auth-Token";
/// How much of an uninteresting response body is read so the connection can be reused.
pub(crate) const DRAIN_LIMIT: usize = 64 << 10;

/// A cc-backend endpoint: base URL, credential and HTTP client.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    base: String,
    token: HeaderValue,
    timeout: Duration,
}

impl Http {
    pub(crate) fn new(
        client: reqwest::Client,
        base: String,
        token: &str,
        timeout: Duration,
    ) -> Result<Http, Error> {
        let mut token = HeaderValue::from_str(token).map_err(|_| ConfigError::InvalidToken)?;
        // Keeps the token out of reqwest's and hyper's debug output.
        token.set_sensitive(true);
        Ok(Http {
            client,
            base,
            token,
            timeout,
        })
    }

    /// A request with the headers every fleet call carries. `Content-Type` is added only by
    /// the callers that send a body. The configured timeout applies even to a caller-supplied
    /// HTTP client.
    pub(crate) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{}", self.base, path))
            .header(AUTH_HEADER, self.token.clone())
            .header(ACCEPT, "application/json")
            .timeout(self.timeout)
    }

    /// Sends a request; a transport failure becomes [`Error::Unreachable`].
    pub(crate) async fn send(&self, op: Op, request: RequestBuilder) -> Result<Response, Error> {
        request.send().await.map_err(|e| Error::unreachable(op, e))
    }
}

/// Reads at most `limit` bytes of the body. `Ok(None)` means the body is longer; the rest is
/// left unread (the connection is then not reused, which is right for a misbehaving peer).
pub(crate) async fn read_limited(
    op: Op,
    mut response: Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Error::unreachable(op, e))?
    {
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// Reads and discards up to [`DRAIN_LIMIT`] bytes so the connection returns to the pool.
pub(crate) async fn drain(mut response: Response) {
    let mut read = 0;
    while read <= DRAIN_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            _ => return,
        }
    }
}

/// The error for an unexpected status, quoting the start of the body. The rest of the body
/// is drained (up to [`DRAIN_LIMIT`]) so the connection can be reused.
pub(crate) async fn status_error(op: Op, mut response: Response) -> Error {
    let status = response.status();
    let mut head = Vec::new();
    let mut read = 0;
    while read <= DRAIN_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                read += chunk.len();
                let room = MAX_DETAIL.saturating_sub(head.len());
                head.extend_from_slice(&chunk[..room.min(chunk.len())]);
            }
            _ => break,
        }
    }
    Error::from_status(StatusError::new(op, status, &head))
}
