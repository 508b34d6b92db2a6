//! A TCP proxy in front of an HTTP server that injects the faults of a peer: it forwards
//! connections, answers every request with a status of its own (a load balancer in front of a
//! restarting cc-backend), or accepts connections and never answers (a hung peer). Changing
//! the mode closes the connections it forwards, so pooled client connections cannot bypass
//! the new mode.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward to the upstream server.
    Forward,
    /// Read each request and answer it with this status, closing the connection.
    Answer(u16),
    /// Accept and hold the connection without ever answering.
    Stall,
    /// Forward, holding back every request whose target starts with `path` for `delay`
    /// (a slow download from an overloaded server).
    Delay {
        /// The start of the slow requests' path, e.g. `/api/fleet/plugins/`.
        path: &'static str,
        /// How long each of them is held.
        delay: std::time::Duration,
    },
}

/// The running proxy; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    answered: Arc<AtomicUsize>,
    stalled: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (`host:port`) in `mode`.
    pub async fn start(upstream: SocketAddr, mode: Mode) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().unwrap();
        let (mode_tx, mode_rx) = watch::channel(mode);
        let answered = Arc::new(AtomicUsize::new(0));
        let stalled = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let answered = answered.clone();
            let stalled = stalled.clone();
            async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let mode_rx = mode_rx.clone();
                    let answered = answered.clone();
                    let stalled = stalled.clone();
                    tokio::spawn(async move {
                        serve(socket, upstream, mode_rx, &answered, &stalled).await;
                    });
                }
            }
        });
        FaultProxy {
            addr,
            mode: mode_tx,
            answered,
            stalled,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches the mode; connections being forwarded are closed.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Requests answered with a fault status so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Connections held without an answer so far.
    pub fn stalled(&self) -> usize {
        self.stalled.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut socket: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    answered: &AtomicUsize,
    stalled: &AtomicUsize,
) {
    let current = *mode.borrow_and_update();
    match current {
        Mode::Forward => {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut socket, &mut server) => {}
                _ = mode.changed() => {}
            }
        }
        Mode::Delay { path, delay } => {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (mut client_read, mut client_write) = socket.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let marker = format!(" {path}").into_bytes();
            let upward = async move {
                let mut chunk = [0u8; 16 * 1024];
                loop {
                    let n = match client_read.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // A request's line arrives whole in one read on loopback; a request
                    // for the slow path is held before it reaches the server.
                    if chunk[..n].windows(marker.len()).any(|w| w == marker) {
                        tokio::time::sleep(delay).await;
                    }
                    if server_write.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = server_write.shutdown().await;
            };
            let downward = async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                let _ = client_write.shutdown().await;
            };
            tokio::select! {
                _ = async { tokio::join!(upward, downward) } => {}
                _ = mode.changed() => {}
            }
        }
        Mode::Answer(status) => {
            // Whole requests only: answering before the body is read would reset the
            // connection and the client would see a transport error instead of the status.
            if read_request(&mut socket).await.is_some() {
                let body = "fault injected by the test proxy";
                let response = format!(
                    "HTTP/1.1 {status} Fault\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                answered.fetch_add(1, Ordering::SeqCst);
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
        }
        Mode::Stall => {
            stalled.fetch_add(1, Ordering::SeqCst);
            let mut sink = [0u8; 4096];
            // Read (and ignore) whatever comes until the client gives up.
            while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
        }
    }
}

/// Reads one request (head and a `content-length` body); `None` if the client went away.
async fn read_request(socket: &mut TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(())
}
