//! A recording HTTP relay: forwards every request to the fleet server unchanged and records
//! what went over the wire (method, path, the headers the client sent, the status, and the
//! client's TCP peer address, which shows whether connections are reused). It can be told to
//! answer every request with a status of its own instead (a proxy in front of a cc-backend
//! that is restarting), and to forward again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio::sync::watch;

/// One request as the relay saw it.
#[derive(Debug, Clone)]
pub struct Record {
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Status the server answered with (502 when it could not be reached).
    pub status: u16,
    /// Request headers from the client.
    pub headers: HeaderMap,
    /// Length of the request body.
    pub body_len: usize,
    /// The client's address.
    pub peer: SocketAddr,
}

impl Record {
    /// A request header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `METHOD kind STATUS` with the instance id cut off, e.g. `GET config 304`.
    pub fn summary(&self) -> String {
        let kind = self
            .path
            .trim_start_matches("/api/fleet/")
            .split('/')
            .next()
            .unwrap_or_default();
        format!("{} {kind} {}", self.method, self.status)
    }
}

#[derive(Clone)]
struct RelayState {
    upstream: String,
    client: reqwest::Client,
    log: Arc<Mutex<Vec<Record>>>,
    count: Arc<watch::Sender<usize>>,
    fault: Arc<Mutex<Option<StatusCode>>>,
}

/// The running relay.
#[derive(Clone)]
pub struct Relay {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Record>>>,
    count: Arc<watch::Sender<usize>>,
    fault: Arc<Mutex<Option<StatusCode>>>,
}

impl Relay {
    /// Starts a relay in front of `upstream` (must run inside a tokio runtime).
    pub async fn start(upstream: String) -> Relay {
        super::install_crypto();
        let state = RelayState {
            upstream,
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("relay client"),
            log: Arc::default(),
            count: Arc::new(watch::Sender::new(0)),
            fault: Arc::default(),
        };
        let relay = Relay {
            addr: "127.0.0.1:0".parse().unwrap(),
            log: state.log.clone(),
            count: state.count.clone(),
            fault: state.fault.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("relay bind");
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(forward).with_state(state);
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        Relay { addr, ..relay }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<Record> {
        self.log.lock().unwrap().clone()
    }

    /// Summaries (`GET config 200`, ...) of the requests recorded from index `from` on.
    pub fn summaries_since(&self, from: usize) -> Vec<String> {
        self.records()[from..].iter().map(Record::summary).collect()
    }

    /// How many requests were answered so far.
    pub fn len(&self) -> usize {
        *self.count.borrow()
    }

    /// From now on answers every request with `status` itself (`Some`), or forwards again
    /// (`None`).
    pub fn answer_with(&self, status: Option<u16>) {
        *self.fault.lock().unwrap() =
            status.map(|code| StatusCode::from_u16(code).expect("a valid status"));
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        self.log.lock().unwrap().clear();
    }

    /// How many requests match `pattern`: a whole summary (`GET config 200`) or its start
    /// (`POST register`).
    pub fn count(&self, pattern: &str) -> usize {
        let prefix = format!("{pattern} ");
        self.records()
            .iter()
            .map(Record::summary)
            .filter(|s| *s == pattern || s.starts_with(&prefix))
            .count()
    }

    /// Waits (without timers, so it also works under a paused clock) until `n` requests have
    /// been answered.
    pub async fn wait_for_len(&self, n: usize) {
        let mut rx = self.count.subscribe();
        rx.wait_for(|len| *len >= n).await.expect("relay alive");
    }
}

async fn forward(
    State(state): State<RelayState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, 64 << 20).await.unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let fault = *state.fault.lock().unwrap();
    if let Some(status) = fault {
        let mut response = Response::new(Body::from("relay: answering with a fault"));
        *response.status_mut() = status;
        state.log.lock().unwrap().push(Record {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            status: status.as_u16(),
            headers: parts.headers,
            body_len: body.len(),
            peer,
        });
        state.count.send_modify(|n| *n += 1);
        return response;
    }
    let mut upstream = state
        .client
        .request(parts.method.clone(), format!("{}{path}", state.upstream))
        .body(body.clone());
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            upstream = upstream.header(name, value);
        }
    }
    let (status, response) = match upstream.send().await {
        Ok(answer) => {
            let status = answer.status();
            let headers = answer.headers().clone();
            let bytes = answer.bytes().await.unwrap_or_default();
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            for (name, value) in &headers {
                if name != "content-length" && name != "transfer-encoding" && name != "connection" {
                    response.headers_mut().append(name, value.clone());
                }
            }
            (status, response)
        }
        Err(_) => {
            let mut response = Response::new(Body::from("relay: upstream unreachable"));
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            (StatusCode::BAD_GATEWAY, response)
        }
    };
    state.log.lock().unwrap().push(Record {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        status: status.as_u16(),
        headers: parts.headers,
        body_len: body.len(),
        peer,
    });
    state.count.send_modify(|n| *n += 1);
    response
}
