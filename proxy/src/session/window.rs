//! Input a door has taken from the person and the session not yet handed to the node, for doors
//! whose protocol has no flow control of its own toward the person (SPDY streams kubectl never
//! windows, a browser's WebSocket): the door reads the person's next message only while less
//! than its window is in flight ([`InputWindow::room`]), and the engine gives the window back
//! as the node takes the bytes ([`Door::consumed`](super::Door::consumed)). The person's input
//! is then never dropped and never piles up: a paste waits in the person's own socket.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

pub struct InputWindow {
    limit: usize,
    in_flight: AtomicUsize,
    room: Notify,
}

impl InputWindow {
    /// A window of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        InputWindow {
            limit,
            in_flight: AtomicUsize::new(0),
            room: Notify::new(),
        }
    }

    /// `n` bytes were taken from the person.
    pub fn took(&self, n: usize) {
        self.in_flight.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` bytes reached the node.
    pub fn consumed(&self, n: usize) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            });
        self.room.notify_waiters();
    }

    /// Returns once less than the window is in flight.
    pub async fn room(&self) {
        loop {
            let more = self.room.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) < self.limit {
                return;
            }
            more.await;
        }
    }
}
