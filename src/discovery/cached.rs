//! A discoverer that refreshes another in the background and serves its last good set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::{Discoverer, DiscoveryError, Instance};

/// How often a [`Cached`] discoverer refreshes, and how long one refresh may take.
pub const CACHE_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// How soon a source that is itself still warming up (a nested cache) is asked again; the
/// pause doubles per retry until it reaches the refresh interval.
const WARMUP_RETRY: Duration = Duration::from_millis(50);

/// What a [`Cached`] discoverer currently knows, as published to its subscribers.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The set read by the last successful refresh; `None` until one succeeds.
    pub instances: Option<Arc<Vec<Instance>>>,
    /// Why the latest refresh failed; `None` after a success (and before the first refresh).
    pub error: Option<Arc<DiscoveryError>>,
    /// How many refreshes have completed, successful or not (a source answering
    /// [`DiscoveryError::NotYetSynced`] completes none).
    pub refreshes: u64,
}

impl Snapshot {
    /// The snapshot as [`Discoverer::list_instances`] reports it: the set, or
    /// [`DiscoveryError::NotYetSynced`], or [`DiscoveryError::RefreshFailed`] carrying the last
    /// known set.
    pub fn to_result(&self) -> Result<Vec<Instance>, DiscoveryError> {
        match (&self.instances, &self.error) {
            (_, Some(error)) => Err(DiscoveryError::RefreshFailed {
                last_known: self.instances.as_ref().map(|set| set.as_ref().clone()),
                error: Arc::clone(error),
            }),
            (Some(set), None) => Ok(set.as_ref().clone()),
            (None, None) => Err(DiscoveryError::NotYetSynced),
        }
    }
}

/// Wraps a lister in a background refresh loop.
///
/// [`start`](Discoverer::start) refreshes immediately and then every interval (10 s by
/// default), each refresh bounded by a timeout (the interval by default).
/// [`list_instances`](Discoverer::list_instances) never touches the source: it returns the
/// last good set, or that set together with the error of the latest refresh if it failed,
/// or [`DiscoveryError::NotYetSynced`] before any refresh completed. The latest state is
/// also published through [`subscribe`](Cached::subscribe) as a watch channel, so a consumer
/// can wait for changes instead of polling. Refresh errors are not logged here: they reach
/// the caller, whose sync loop already reports them.
///
/// `start` and `stop` are forwarded to the wrapped lister, so caches compose: a `Cached`
/// over a [`Merged`](super::Merged) of other caches starts and stops them all. A source that
/// answers [`DiscoveryError::NotYetSynced`] has read nothing yet, so that answer is not
/// recorded as a refresh; the loop asks again soon (50 ms, doubling up to the interval)
/// instead of waiting a whole interval.
pub struct Cached {
    inner: Arc<Inner>,
    running: Mutex<Option<Running>>,
    // Serializes start and stop, which await the wrapped lister's own start and stop.
    lifecycle: tokio::sync::Mutex<()>,
}

struct Inner {
    lister: Arc<dyn Discoverer>,
    interval: Duration,
    timeout: Duration,
    state: watch::Sender<Snapshot>,
}

struct Running {
    // Dropping the sender (with the Cached) ends the loop as well as sending on it does.
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Cached {
    /// Wraps `lister` with the default interval and timeout of [`CACHE_REFRESH_INTERVAL`].
    pub fn new(lister: Arc<dyn Discoverer>) -> Cached {
        Cached::with_timing(lister, CACHE_REFRESH_INTERVAL, CACHE_REFRESH_INTERVAL)
    }

    /// Wraps `lister`, refreshing every `interval`, each refresh bounded by `timeout`.
    ///
    /// # Panics
    /// If `interval` is zero.
    pub fn with_timing(
        lister: Arc<dyn Discoverer>,
        interval: Duration,
        timeout: Duration,
    ) -> Cached {
        assert!(!interval.is_zero(), "refresh interval must be positive");
        let (state, _) = watch::channel(Snapshot::default());
        Cached {
            inner: Arc::new(Inner {
                lister,
                interval,
                timeout,
                state,
            }),
            running: Mutex::new(None),
            lifecycle: tokio::sync::Mutex::new(()),
        }
    }

    /// Refreshes once, now, outside the loop; returns the refresh's own outcome (the listing
    /// error, or the timeout) after publishing it. A [`DiscoveryError::NotYetSynced`] answer
    /// is returned but not published.
    pub async fn refresh(&self) -> Result<(), Arc<DiscoveryError>> {
        self.inner.refresh().await
    }

    /// The current state without listing anything.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.state.borrow().clone()
    }

    /// A receiver that always holds the latest [`Snapshot`]; a slow reader skips intermediate
    /// states instead of queueing them.
    pub fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.inner.state.subscribe()
    }

    /// Whether the background loop is running.
    pub fn is_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|r| !r.task.is_finished())
    }
}

impl Inner {
    async fn refresh(&self) -> Result<(), Arc<DiscoveryError>> {
        let outcome = match tokio::time::timeout(self.timeout, self.lister.list_instances()).await {
            Ok(Ok(set)) => Ok(set),
            Ok(Err(e)) => Err(Arc::new(e)),
            Err(_) => Err(Arc::new(DiscoveryError::TimedOut {
                after: self.timeout,
            })),
        };
        if let Err(e) = &outcome
            && e.is_not_yet_synced()
        {
            // The source has read nothing yet either: nothing was learned, so the state stays.
            return outcome.map(|_| ());
        }
        self.state.send_modify(|s| {
            s.refreshes += 1;
            match &outcome {
                Ok(set) => {
                    s.instances = Some(Arc::new(set.clone()));
                    s.error = None;
                }
                // The old set stays: a blip must not empty the fleet.
                Err(e) => s.error = Some(Arc::clone(e)),
            }
        });
        outcome.map(|_| ())
    }

    async fn keep_in_sync(self: Arc<Self>, mut stop: oneshot::Receiver<()>) {
        let mut ticker = tokio::time::interval(self.interval);
        // A refresh that overran must not trigger a burst of catch-up refreshes.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = async {
                    ticker.tick().await;
                    let mut retry = WARMUP_RETRY;
                    while let Err(e) = self.refresh().await {
                        if !e.is_not_yet_synced() || retry >= self.interval {
                            break;
                        }
                        tokio::time::sleep(retry).await;
                        retry *= 2;
                    }
                } => {}
            }
        }
        tracing::info!("stopping service discovery keep-in-sync");
    }
}

#[async_trait]
impl Discoverer for Cached {
    async fn list_instances(&self) -> Result<Vec<Instance>, DiscoveryError> {
        self.inner.state.borrow().to_result()
    }

    /// Starts the wrapped lister, then the refresh loop; does nothing if it is already
    /// running.
    async fn start(&self) {
        let _lifecycle = self.lifecycle.lock().await;
        if self.is_running() {
            return;
        }
        self.inner.lister.start().await;
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(Arc::clone(&self.inner).keep_in_sync(stop_rx));
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(Running { stop, task });
    }

    /// Stops the refresh loop, cancelling a refresh in flight, waits until it has ended, and
    /// then stops the wrapped lister.
    async fn stop(&self) {
        let _lifecycle = self.lifecycle.lock().await;
        let running = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(Running { stop, task }) = running {
            let _ = stop.send(());
            let _ = task.await;
            self.inner.lister.stop().await;
        }
    }
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("interval", &self.inner.interval)
            .field("timeout", &self.inner.timeout)
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}
