//! Access to the bucket: opening (or creating) it, counting the requests sent, and
//! retrying while JetStream is unavailable.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use async_nats::jetstream::kv;

use super::super::{RegistryError, RegistryErrorKind};
use super::{JetStreamSettings, REQUEST_TIMEOUT};

/// Key-value operations (reads and writes) this process sent to JetStream; the bench's
/// "operations per heartbeat".
static KV_OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// Key-value operations this process has sent to JetStream so far (all buckets).
pub fn kv_operations() -> u64 {
    KV_OPERATIONS.load(Relaxed)
}

pub(super) fn count(n: usize) {
    KV_OPERATIONS.fetch_add(n as u64, Relaxed);
}

pub(super) fn unavailable(
    what: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> RegistryError {
    RegistryError::with_source(
        RegistryErrorKind::Unavailable,
        format!("JetStream: {what}: {e}"),
        e,
    )
}

/// Whether a bucket name is valid (`[A-Za-z0-9_-]+`).
pub fn is_bucket_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The bucket (created with `settings` if it does not exist).
pub async fn bucket(
    client: &async_nats::Client,
    settings: &JetStreamSettings,
    create: bool,
) -> Result<kv::Store, RegistryError> {
    let mut js = async_nats::jetstream::new(client.clone());
    // A write that JetStream does not confirm within this time is answered with an error
    // (it acknowledges nothing) instead of holding the request for the default 5 s.
    js.set_timeout(REQUEST_TIMEOUT);
    count(1);
    match js.get_key_value(&settings.bucket).await {
        Ok(kv) => return Ok(kv),
        Err(e) if !create => {
            return Err(unavailable(
                &format!("opening bucket {:?}", settings.bucket),
                e,
            ));
        }
        Err(_) => {}
    }
    count(1);
    js.create_key_value(kv::Config {
        bucket: settings.bucket.clone(),
        description: "ccfleet service registry".to_owned(),
        history: 1,
        num_replicas: settings.replicas,
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| unavailable(&format!("creating bucket {:?}", settings.bucket), e))
}

/// Runs `attempt` until it succeeds, for at most `wait`: a failure of kind
/// [`Unavailable`](RegistryErrorKind::Unavailable) (JetStream answering 503 while it elects
/// leaders, a request timing out while a node restarts) is retried with a growing pause
/// (0.25 s doubling up to 4 s), logged once when the waiting starts and once when it ends.
/// Other failures, and the last one after `wait`, are returned.
pub(super) async fn retry_unavailable<T, F, Fut>(
    what: &str,
    wait: Duration,
    mut attempt: F,
) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RegistryError>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(250);
    let mut failed = 0u32;
    loop {
        match attempt().await {
            Ok(value) => {
                if failed > 0 {
                    tracing::info!(
                        "fleet registry: {what} succeeded after {failed} failed attempt(s)"
                    );
                }
                return Ok(value);
            }
            Err(e)
                if e.kind() == RegistryErrorKind::Unavailable
                    && tokio::time::Instant::now() + pause < deadline =>
            {
                failed += 1;
                if failed == 1 {
                    tracing::warn!(
                        "fleet registry: {what} failed, retrying for up to {}: {e}",
                        crate::duration::format(wait)
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(4));
            }
            Err(e) => return Err(e),
        }
    }
}
