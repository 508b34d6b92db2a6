//! A local HTTP server that implements cc-metric-store's `POST /api/write?cluster=...`: it
//! checks the bearer token, inflates gzip bodies, decodes the line protocol with ccfleet's
//! decoder and keeps every point; on demand it fails with a status or stalls.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use ccfleet::lineproto::Decoder;

/// What the store does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decode and keep the points, answer 204.
    Accept,
    /// Answer this status and keep nothing.
    Fail(u16),
    /// Never answer.
    Stall,
}

/// One point as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPoint {
    pub measurement: String,
    pub tags: Vec<(String, String)>,
    pub value: f64,
    pub time: Option<i64>,
}

/// One request as the store saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub authorization: Option<String>,
    pub cluster: Option<String>,
    pub gzip: bool,
    pub points: usize,
    pub mode: Mode,
}

#[derive(Default)]
struct Inner {
    mode: Option<Mode>,
    points: Vec<StoredPoint>,
    requests: Vec<Request>,
    token: Option<String>,
}

/// The running store; it stops when dropped.
pub struct Store {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Inflates a gzip member (header without optional fields, as the agent writes it).
fn gunzip(body: &[u8]) -> Option<Vec<u8>> {
    if body.len() < 18 || body[..3] != [0x1f, 0x8b, 8] || body[3] != 0 {
        return None;
    }
    let data = miniz_oxide::inflate::decompress_to_vec(&body[10..body.len() - 8]).ok()?;
    let crc = u32::from_le_bytes(body[body.len() - 8..body.len() - 4].try_into().ok()?);
    let len = u32::from_le_bytes(body[body.len() - 4..].try_into().ok()?);
    (crc == crc32fast::hash(&data) && len as usize == data.len()).then_some(data)
}

async fn write(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let mode = inner.lock().unwrap().mode.unwrap_or(Mode::Accept);
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let gzip = headers
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes() == b"gzip");
    let cluster = query
        .iter()
        .find(|(k, _)| k == "cluster")
        .map(|(_, v)| v.clone());
    let record = |points: usize| Request {
        authorization: authorization.clone(),
        cluster: cluster.clone(),
        gzip,
        points,
        mode,
    };
    if mode == Mode::Stall {
        inner.lock().unwrap().requests.push(record(0));
        std::future::pending::<()>().await;
    }
    let expected = inner.lock().unwrap().token.clone();
    if let Some(token) = expected
        && authorization.as_deref() != Some(&format!("Bearer {token}"))
    {
        inner.lock().unwrap().requests.push(record(0));
        return StatusCode::UNAUTHORIZED;
    }
    let text = if gzip {
        match gunzip(&body) {
            Some(text) => text,
            None => return StatusCode::BAD_REQUEST,
        }
    } else {
        body.to_vec()
    };
    let mut points = Vec::new();
    for line in Decoder::new(&text) {
        let Ok(line) = line else {
            return StatusCode::BAD_REQUEST;
        };
        use ccfleet::lineproto::FieldValue;
        let value = match line.field("value") {
            Some(FieldValue::Float(v)) => v,
            Some(FieldValue::Int(v)) => v as f64,
            Some(FieldValue::Uint(v)) => v as f64,
            _ => return StatusCode::BAD_REQUEST,
        };
        points.push(StoredPoint {
            measurement: line.measurement().unescape().into_owned(),
            tags: line
                .tags()
                .map(|(k, v)| (k.unescape().into_owned(), v.unescape().into_owned()))
                .collect(),
            value,
            time: line.time(),
        });
    }
    if let Mode::Fail(status) = mode {
        // Decoded, so a test can tell what was refused, but not kept.
        inner.lock().unwrap().requests.push(record(points.len()));
        return StatusCode::from_u16(status).unwrap();
    }
    let mut inner = inner.lock().unwrap();
    let request = record(points.len());
    inner.requests.push(request);
    inner.points.extend(points);
    StatusCode::NO_CONTENT
}

impl Store {
    /// Starts a store that accepts requests bearing `token` (any request without a token).
    pub async fn start(token: Option<&str>) -> Store {
        let inner = Arc::new(Mutex::new(Inner {
            token: token.map(str::to_owned),
            ..Inner::default()
        }));
        let app = Router::new()
            .route("/api/write", post(write))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Store { addr, inner, task }
    }

    /// The write endpoint's URL (without the cluster parameter).
    pub fn url(&self) -> String {
        format!("http://{}/api/write", self.addr)
    }

    /// Changes what the store does with the next requests.
    pub fn set(&self, mode: Mode) {
        self.inner.lock().unwrap().mode = Some(mode);
    }

    /// Every point stored so far.
    pub fn points(&self) -> Vec<StoredPoint> {
        self.inner.lock().unwrap().points.clone()
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<Request> {
        self.inner.lock().unwrap().requests.clone()
    }
}
