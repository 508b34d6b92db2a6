//! Waiting for a condition in integration tests without fixed sleeps.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 10 ms until it holds, failing the test after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
