//! A one-slot, latest-wins channel for whole snapshots (configurations, rosters).
//!
//! The producer never waits: publishing replaces an unread value. A slow reader therefore
//! skips intermediate states and always gets the newest one, which is all a snapshot consumer
//! needs. Built on [`tokio::sync::watch`].

use std::sync::Mutex;

use tokio::sync::watch;

/// Receiving end of a latest-wins channel, from [`Client::configs`](super::Client::configs) or
/// [`Client::rosters`](super::Client::rosters).
///
/// Every receiver tracks on its own what it has seen; clones start where the original is.
#[derive(Debug)]
pub struct Latest<T> {
    rx: watch::Receiver<Option<T>>,
}

impl<T> Clone for Latest<T> {
    fn clone(&self) -> Self {
        Latest {
            rx: self.rx.clone(),
        }
    }
}

impl<T: Clone> Latest<T> {
    /// Waits for a value this receiver has not seen yet and returns it. Returns `None` once
    /// the client is closed and the last value has been taken.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            self.rx.changed().await.ok()?;
            // The slot only starts out empty; every publication holds a value.
            if let Some(value) = self.rx.borrow_and_update().clone() {
                return Some(value);
            }
        }
    }

    /// Returns the newest value if this receiver has not seen it yet, without waiting.
    pub fn try_recv(&mut self) -> Option<T> {
        if !self.rx.borrow().has_changed() {
            return None;
        }
        self.rx.borrow_and_update().clone()
    }
}

/// Producing end: holds the slot, hands out receivers, and closes the channel.
#[derive(Debug)]
pub(crate) struct Slot<T> {
    tx: Mutex<Option<watch::Sender<Option<T>>>>,
    /// Never read, so receivers cloned from it see every value published after creation.
    origin: watch::Receiver<Option<T>>,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Slot<T> {
        let (tx, origin) = watch::channel(None);
        Slot {
            tx: Mutex::new(Some(tx)),
            origin,
        }
    }

    /// Publishes `value`, replacing an unread one. Does nothing once closed.
    pub(crate) fn offer(&self, value: T) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            tx.send_replace(Some(value));
        }
    }

    /// A receiver that gets the newest value published so far (if any), then later ones.
    pub(crate) fn subscribe(&self) -> Latest<T> {
        Latest {
            rx: self.origin.clone(),
        }
    }

    /// Closes the channel: receivers get what is left, then `None`.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn slow_reader_sees_only_the_latest() {
        let slot = Slot::new();
        let mut rx = slot.subscribe();
        assert_eq!(rx.try_recv(), None);
        for i in 1..=5 {
            slot.offer(i);
        }
        assert_eq!(rx.recv().await, Some(5));
        assert_eq!(rx.try_recv(), None);
        slot.offer(6);
        assert_eq!(rx.try_recv(), Some(6));
    }

    #[tokio::test]
    async fn late_subscriber_gets_the_unread_value() {
        let slot = Slot::new();
        slot.offer("a");
        let mut rx = slot.subscribe();
        assert_eq!(rx.try_recv(), Some("a"));
        // Another receiver keeps its own position.
        let mut other = slot.subscribe();
        assert_eq!(other.recv().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn recv_waits_for_a_new_value() {
        let slot = std::sync::Arc::new(Slot::new());
        let mut rx = slot.subscribe();
        let producer = {
            let slot = slot.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                slot.offer(7);
            })
        };
        assert_eq!(rx.recv().await, Some(7));
        producer.await.unwrap();
    }

    #[tokio::test]
    async fn close_ends_receivers_after_the_last_value() {
        let slot = Slot::new();
        let mut rx = slot.subscribe();
        slot.offer(1);
        slot.close();
        slot.offer(2);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, None);
        let mut late = slot.subscribe();
        assert_eq!(late.try_recv(), Some(1));
        assert_eq!(late.recv().await, None);
    }

    #[tokio::test]
    async fn offering_never_blocks_without_readers() {
        let slot = Slot::new();
        for i in 0..10_000 {
            slot.offer(i);
        }
        assert_eq!(slot.subscribe().try_recv(), Some(9_999));
    }
}
