//! Requests to cc-backend: headers, bounded body reads, draining for connection reuse, and
//! turning unexpected statuses into errors.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT, HeaderValue};
use reqwest::{Method, RequestBuilder, Response};
use tokio::time::Instant;

use super::config::ConfigError;
use super::error::{Error, MAX_DETAIL, Op, StatusError};
use super::servers::Servers;

/// Header carrying the JWT, as cc-backend's API expects it.
pub(crate) const AUTH_HEADER: &str = "X-Auth-Token";
/// How much of an uninteresting response body is read so the connection can be reused.
pub(crate) const DRAIN_LIMIT: usize = 64 << 10;

/// The cc-backend endpoints: the servers (see [`Servers`]), credential and HTTP client.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    servers: Arc<Servers>,
    token: HeaderValue,
    timeout: Duration,
}

impl Http {
    pub(crate) fn new(
        client: reqwest::Client,
        bases: Vec<String>,
        token: &str,
        timeout: Duration,
    ) -> Result<Http, Error> {
        let mut token = HeaderValue::from_str(token).map_err(|_| ConfigError::InvalidToken)?;
        // Keeps the token out of reqwest's and hyper's debug output.
        token.set_sensitive(true);
        Ok(Http {
            client,
            servers: Arc::new(Servers::new(bases)),
            token,
            timeout,
        })
    }

    /// The servers and which one is current.
    pub(crate) fn servers(&self) -> &Servers {
        &self.servers
    }

    /// The current server's URL as logs show it.
    pub(crate) fn current_shown(&self) -> &str {
        &self.servers.get(self.servers.current()).shown
    }

    /// The URL (as logs show it) of the server the latest request's outcome came from.
    pub(crate) fn last_used_shown(&self) -> &str {
        &self.servers.get(self.servers.last_used()).shown
    }

    /// A request to server `i` with the headers every fleet call carries. `Content-Type` is
    /// added only by the callers that send a body. The configured timeout applies even to a
    /// caller-supplied HTTP client.
    fn request(&self, i: usize, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{}", self.servers.get(i).base, path))
            .header(AUTH_HEADER, self.token.clone())
            .header(ACCEPT, "application/json")
            .timeout(self.timeout)
    }

    /// Sends `method path` (completed by `build`, e.g. with a body) to the current server.
    /// A transport failure, a server error (5xx) or 429 moves on to the next server and sends
    /// again, each server at most once; the last failure is the result: a transport failure
    /// becomes [`Error::Unreachable`], a status is returned for the caller to judge.
    pub(crate) async fn send(
        &self,
        op: Op,
        method: Method,
        path: &str,
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<Response, Error> {
        self.start_due_probes();
        let attempts = self.servers.len();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let i = self.servers.current();
            let result = build(self.request(i, method.clone(), path)).send().await;
            self.servers.used(i);
            let (outcome, reason) = match result {
                Ok(response) if !is_transient(response.status()) => {
                    self.servers.succeeded(i);
                    return Ok(response);
                }
                Ok(response) => {
                    let reason = format!("answered {}", response.status());
                    (Ok(response), reason)
                }
                Err(e) => {
                    let err = Error::unreachable(op, e);
                    let reason = err.to_string();
                    (Err(err), reason)
                }
            };
            self.servers.failed(i, &reason, Instant::now());
            if attempt >= attempts {
                return outcome;
            }
            if let Ok(response) = outcome {
                drain(response).await;
            }
        }
    }

    /// Starts the health probes that are due, in the background (see [`Servers`]).
    fn start_due_probes(&self) {
        for i in self.servers.due_probes(Instant::now()) {
            let http = self.clone();
            tokio::spawn(async move {
                let url = format!("{}/healthz", http.servers.get(i).base);
                let result = http.client.get(url).timeout(http.timeout).send().await;
                let health = match result {
                    Ok(response) if !is_transient(response.status()) => {
                        drain(response).await;
                        Ok(())
                    }
                    Ok(response) => Err(format!("/healthz answered {}", response.status())),
                    Err(e) => Err(Error::unreachable(Op::Health, e).to_string()),
                };
                http.servers.probed(i, health, Instant::now());
            });
        }
    }
}

/// Whether a status says "not now": a server error (5xx) or 429 (see
/// [`StatusError::is_transient`]).
fn is_transient(status: reqwest::StatusCode) -> bool {
    status.as_u16() >= 500 || status == reqwest::StatusCode::TOO_MANY_REQUESTS
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
