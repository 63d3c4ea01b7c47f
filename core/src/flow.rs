//! A per-channel inbox between an SSH session loop and the task that consumes its data.
//!
//! russh hands channel data to the handler on the session's only task and re-opens the window
//! as soon as data arrives. A handler that waits for a slow consumer stalls that task — and with
//! it the output path the consumer may itself be waiting on (`cat` both ways deadlocks). So the
//! handler queues without waiting up to a high-water mark and only then waits: memory per
//! channel is bounded, and ordinary traffic never stalls the session loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

/// Bytes a channel may queue before its producer waits.
pub const HIGH_WATER: usize = 16 * 1024 * 1024;

/// What a session loop hands to a channel's consumer.
#[derive(Debug)]
pub enum Input {
    Data(bytes::Bytes),
    Eof,
    Resize { cols: u32, rows: u32 },
}

#[derive(Clone)]
pub struct Sender {
    tx: mpsc::UnboundedSender<Input>,
    queued: Arc<AtomicUsize>,
}

pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Input>,
    queued: Arc<AtomicUsize>,
}

pub fn inbox() -> (Sender, Receiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Sender {
            tx,
            queued: queued.clone(),
        },
        Receiver { rx, queued },
    )
}

impl Sender {
    /// Queues `input`; waits only while more than [`HIGH_WATER`] bytes are queued. Returns false
    /// when the consumer is gone.
    pub async fn send(&self, input: Input) -> bool {
        if let Input::Data(d) = &input {
            while self.queued.load(Ordering::Acquire) > HIGH_WATER {
                if self.tx.is_closed() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            self.queued.fetch_add(d.len(), Ordering::AcqRel);
        }
        self.tx.send(input).is_ok()
    }
}

impl Receiver {
    pub async fn recv(&mut self) -> Option<Input> {
        let item = self.rx.recv().await?;
        if let Input::Data(d) = &item {
            self.queued.fetch_sub(d.len(), Ordering::AcqRel);
        }
        Some(item)
    }
}
