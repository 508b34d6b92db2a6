//! Serving the HTTP API: connection limits, timeouts and panic containment.
//!
//! Every connection holds a permit of a semaphore sized by `http-max-connections`; when all
//! are taken the listener stops accepting, so new clients wait in the kernel's backlog
//! instead of using up the process's file descriptors (which the config tree reload and the
//! registry need too). hyper closes a connection that does not deliver a request's complete
//! headers within `http-header-timeout`, counted from the connection's start or from the end
//! of the previous response, so idle keep-alive connections and slowloris clients both go
//! away. A request body that stalls for `http-body-timeout` fails the request.
//!
//! A panic while handling one request is caught, logged once, counted in `/metrics`
//! (`ccfleet_message_panics_total{source="http"}`) and answered with cc-backend's 500 body; the connection and
//! the server go on.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::{Layer, ServiceExt};
use tower_http::catch_panic::{CatchPanic, CatchPanicLayer, ResponseForPanic};
use tower_http::timeout::{RequestBodyTimeout, RequestBodyTimeoutLayer};

use super::config::HttpLimits;
use super::metrics::Metrics;
use super::stopped;
use crate::untrusted::Untrusted;

/// How long the accept loop pauses after the listener fails (for example when the process is
/// out of file descriptors), so a persistent failure does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The API router with panic containment and the request body timeout around it.
pub(crate) type Hardened = CatchPanic<RequestBodyTimeout<Router>, PanicResponse>;

/// Wraps the API router with panic containment and the request body timeout, once around
/// the whole router rather than around each route (`Router::layer`), which would box the
/// service and its future again at every layer on every request.
pub(crate) fn harden(router: Router, limits: &HttpLimits, metrics: Arc<Metrics>) -> Hardened {
    // Outermost, so a panic anywhere below (the router included) is contained.
    CatchPanicLayer::custom(PanicResponse { metrics })
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout).layer(router))
}

/// The 500 answer to a panic, counted and logged.
#[derive(Clone)]
pub(crate) struct PanicResponse {
    metrics: Arc<Metrics>,
}

impl ResponseForPanic for PanicResponse {
    type ResponseBody = axum::body::Body;

    fn response_for_panic(
        &mut self,
        err: Box<dyn Any + Send + 'static>,
    ) -> axum::http::Response<Self::ResponseBody> {
        Metrics::add(&self.metrics.http_panics, 1);
        let message = err
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| err.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        // The message may quote what a client sent.
        tracing::error!(
            "fleet: panic while handling an HTTP request, answered 500: {}",
            Untrusted(message)
        );
        super::api_error::internal_error()
    }
}

/// Serves `router` on `listener` until `shutdown`, then lets open requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Hardened,
    limits: HttpLimits,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(max));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // Dropping this set (the server task aborted) aborts every connection with it.
    let mut connections = JoinSet::new();
    let mut saturated = false;
    let mut accept_failing = false;
    loop {
        while connections.try_join_next().is_some() {}
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !saturated {
                    saturated = true;
                    tracing::warn!(
                        "fleet: {max} HTTP connections open (http-max-connections); new clients wait until one closes"
                    );
                }
                tokio::select! {
                    _ = stopped(&mut shutdown) => break,
                    permit = permits.clone().acquire_owned() => {
                        permit.expect("the semaphore is never closed")
                    }
                }
            }
        };
        let accepted = tokio::select! {
            _ = stopped(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                accept_failing = false;
                accepted
            }
            // One client gave up before it was accepted: nothing wrong with the listener.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => {
                if !accept_failing {
                    accept_failing = true;
                    tracing::warn!("fleet: accepting HTTP connections: {e}; retrying");
                }
                drop(permit);
                tokio::select! {
                    _ = stopped(&mut shutdown) => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        if permits.available_permits() > max / 2 {
            saturated = false;
        }
        let connection = Connection {
            router: router.clone(),
            builder: builder.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
        };
        connections.spawn(async move {
            let _permit = permit;
            connection.run(stream, peer).await;
        });
    }
    drop(listener);
    // Open connections finish their current request and close; the caller bounds the wait.
    while connections.join_next().await.is_some() {}
    Ok(())
}

struct Connection {
    router: Hardened,
    builder: hyper::server::conn::http1::Builder,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    async fn run(mut self, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let gauge = OpenConnection::new(&self.metrics);
        let router = self.router;
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request)
        });
        let conn = self.builder.serve_connection(TokioIo::new(stream), service);
        let mut conn = std::pin::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => result,
            _ = stopped(&mut self.shutdown) => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        match result {
            Ok(()) => {}
            Err(e) if e.is_timeout() => Metrics::add(&gauge.metrics.http_header_timeouts, 1),
            // Resets, malformed requests and the like: the client's problem, not ours.
            Err(e) => tracing::debug!("fleet: HTTP connection from {peer}: {e}"),
        }
    }
}

/// Keeps `ccfleet_http_connections` up to date, also when a connection task is aborted.
struct OpenConnection<'a> {
    metrics: &'a Metrics,
}

impl<'a> OpenConnection<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        metrics.http_connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection { metrics }
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.metrics
            .http_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(all(test, feature = "client"))]
mod tests {
    use super::*;
    use axum::routing::get;

    async fn boom() -> &'static str {
        panic!("boom from a client-supplied \n\u{1b}[31m value")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_handler_answers_500_and_the_server_goes_on() {
        let metrics = Arc::new(Metrics::default());
        let limits = HttpLimits {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            max_connections: 8,
        };
        let router = Router::new()
            .route("/boom", get(boom))
            .route("/fine", get(|| async { "fine" }));
        let router = harden(router, &limits, metrics.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stop_rx) = watch::channel(false);
        let server = tokio::spawn(serve(listener, router, limits, metrics.clone(), stop_rx));
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for _ in 0..3 {
            let response = client.get(format!("{base}/boom")).send().await.unwrap();
            assert_eq!(response.status(), 500);
            assert_eq!(response.headers()["content-type"], "application/json");
            assert_eq!(
                response.text().await.unwrap(),
                "{\"status\":\"Internal Server Error\",\"error\":\"internal server error\"}\n"
            );
            let response = client.get(format!("{base}/fine")).send().await.unwrap();
            assert_eq!(response.text().await.unwrap(), "fine");
        }
        assert_eq!(metrics.http_panics.load(Ordering::Relaxed), 3);
        let text = metrics.render(&Default::default());
        assert!(
            text.contains("ccfleet_message_panics_total{source=\"http\"} 3\n"),
            "{text}"
        );
        stop.send(true).unwrap();
        drop(client);
        server.await.unwrap().unwrap();
    }
}
