//! Session recording in asciicast v2, written while the session runs: a header line, then one
//! `[seconds, "o"|"i"|"r", data]` line per event, flushed at least every second so that a proxy
//! killed mid-session leaves a readable recording of everything already seen.
//!
//! The writing runs on a thread of its own per recording ([`writer`]), fed through a queue
//! bounded in bytes ([`QUEUE_BYTES`]), so that turning a bulk transfer's bytes into asciicast
//! text runs beside the relay rather than in it; when the queue is full the relay's task waits
//! for the writer (asynchronously: a slow disk holds back its own sessions, never an async
//! worker thread, so it cannot stall the proxy's other sessions) rather than drop anything. A
//! [`Recorder`] is shared by a session's two tasks (output, and input with `record_input`) and
//! used through `&self`: the relay holds no lock while it waits here, and a wait dropped midway
//! (its task cancelled) has taken nothing.
//!
//! What is recorded is bounded ([`Limits`]): the person's input only when a role asks for it
//! (`record_input`: keystrokes include passwords typed where nothing echoes), and no file grows
//! past `max_recording_size`. A recording also stops at the first error writing, flushing or
//! syncing its file (a full disk), when its writer takes nothing off its queue for [`STALL`]
//! (a disk that hangs) and when its writer panics: nothing more is written after it. Either way the recorder
//! says so ([`Recorder::stopped`]), and the relay then ends the session (`strict`) or goes on
//! unrecorded, audited (`session.recording_limit`, `session.recording_fail`).
//!
//! Under `strict` the writer running behind must not let the person see output the recording
//! will not hold, so the relay side accounts every event before it is queued: `accounted` is the
//! bytes written plus an upper bound of everything queued ([`bound`]: each raw byte is at most 6
//! bytes of asciicast text, `\u00XX`, plus a line's framing), and the writer gives back what it
//! did not use. [`Recorder::output`] takes only as much of a chunk as surely fits; the relay
//! shows the person exactly that much and ends the session. That is exact for the size limit
//! only: an I/O error is met by the writer after the relay queued the event, so output queued
//! before the error (at most the queue: about [`QUEUE_BYTES`] raw bytes) may
//! have been shown and not be in the file. Nothing is taken once the error is known, nor once
//! a wait for the writer ends past it.

mod ended;
#[cfg(test)]
mod tests;
pub mod upload;
mod writer;

pub use upload::{Backlog, Uploads};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use writer::{Sink, Writer};

/// Events queued for the writer thread.
enum Ev {
    Out(bytes::Bytes),
    In(bytes::Bytes),
    Resize(u32, u32),
    /// Answered once everything queued before it is written (and accounted exactly).
    Sync(tokio::sync::oneshot::Sender<()>),
    /// Nothing follows: write what is held and flush, answer (the file is complete), then
    /// sync and end.
    Finish(tokio::sync::oneshot::Sender<()>),
}

/// The most one line adds besides its escaped data: `[`, the time (at most 24 characters),
/// `, "o", "` and `"]\n`, with room to spare.
const FRAME: u64 = 64;
/// The most one raw byte becomes in the file: a control byte is `\u00XX`, an invalid one at
/// most `\ufffd`.
const PER_BYTE: u64 = 6;
/// A resize line: framing plus `COLSxROWS` (two u32s).
const RESIZE: u64 = FRAME + 32;

/// The most an event of `len` raw bytes can add to the file.
fn bound(len: usize) -> u64 {
    FRAME.saturating_add(PER_BYTE.saturating_mul(len as u64))
}

/// How many of `len` raw bytes surely fit when `accounted` of `max` are taken.
fn fitting(len: usize, accounted: u64, max: u64) -> usize {
    let room = max.saturating_sub(accounted);
    if room < FRAME {
        return 0;
    }
    let n = (room - FRAME) / PER_BYTE;
    len.min(usize::try_from(n).unwrap_or(usize::MAX))
}

/// How many pieces one chunk may be cut into while the recording is filling up (each after the
/// writer has caught up, so the space is known exactly); past that the session ends.
const PIECES: usize = 64;

/// How many raw bytes may wait for the writer, each event counted with [`EVENT`] more (a node's
/// output comes in SSH packets of at most 32 KiB, kubectl's input in messages of up to 1 MiB;
/// one event larger than this still goes in when nothing waits). A writer behind — a slow disk,
/// or binary output that escapes to up to 6 bytes a byte — holds the relay back here, so what a
/// session holds for its recording is bounded, however small its events: this is the queue's
/// only bound.
const QUEUE_BYTES: u64 = 4 * 1024 * 1024;

/// What one queued event counts for besides its raw bytes (its place in the queue, its
/// handle on the bytes): a flood of one-byte events or resizes is bounded too.
const EVENT: u64 = 64;

/// What an event of `len` raw bytes counts for in the queue.
fn cost(len: usize) -> u64 {
    EVENT.saturating_add(len as u64)
}

/// How long the relay waits for a writer that takes nothing off its queue (a recordings disk
/// that hangs) before the recording counts as failed: the session then ends under `strict` and
/// goes on unrecorded otherwise, rather than hang with its watchdog (idle timeout, expiry).
pub(super) const STALL: Duration = Duration::from_secs(30);

/// What a recording may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Whether the person's input is written (`i` events): only when a role asks for it.
    pub input: bool,
    /// The largest the file may grow, in bytes (`max_recording_size`).
    pub max_bytes: u64,
    /// `record_session: strict`: nothing is taken that might not fit ([`Recorder::output`]);
    /// otherwise the writer alone stops at the limit.
    pub strict: bool,
}

/// `max_recording_size` when the configuration does not say.
pub const DEFAULT_MAX_RECORDING_SIZE: u64 = 1 << 30;

/// Why a recording stopped when its writer thread panicked or went away unanswering.
pub const WRITER_FAILED: &str = "the recording's writer failed";

/// Why a recording stopped before its session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// It reached `max_recording_size`.
    Full,
    /// Its file could not be written, flushed or synced: the error.
    Failed(String),
}

/// What the relay's side and the writer thread share.
struct Shared {
    /// Bytes written plus the bound of everything queued (module docs).
    accounted: AtomicU64,
    /// Set by the writer when the next event would take the file past `max_bytes`.
    full: AtomicBool,
    /// The writer's first I/O error: nothing is written after it.
    failed: OnceLock<String>,
    /// What the events queued for the writer and not yet written count for ([`cost`],
    /// [`QUEUE_BYTES`]).
    queued: Mutex<u64>,
    /// Signalled as the writer takes events off the queue, and when it ends.
    drained: tokio::sync::Notify,
    /// Events the writer has taken off the queue: its progress, which the relay's waits
    /// watch (the queue's level alone may stay up while the writer works, refilled by the
    /// session's other task).
    taken: AtomicU64,
    /// The writer thread has ended: nothing more is taken off the queue.
    ended: AtomicBool,
}

impl Shared {
    /// The writer took an event of `len` raw bytes off the queue.
    fn dequeued(&self, len: usize) {
        self.uncount(cost(len));
    }

    /// Takes `n` off what the queue counts, and wakes the relay if it waits for room.
    fn uncount(&self, n: u64) {
        let mut q = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        *q = q.saturating_sub(n);
        drop(q);
        self.taken.fetch_add(1, Ordering::AcqRel);
        self.drained.notify_waiters();
    }

    /// The writer thread ends: nobody waits for it any more.
    fn writer_ended(&self) {
        self.ended.store(true, Ordering::Release);
        self.drained.notify_waiters();
    }
}

/// How a wait for the writer's answer ended.
enum Answer {
    Given,
    /// The writer is gone without answering.
    Gone,
    /// It took nothing off its queue for `stall`.
    Stalled,
}

/// Ends a writer thread however it ends: a panic is the recording's failure (so nothing more is
/// taken under `strict`, nothing shown unrecorded), and the relay's waits end either way.
struct WriterEnd(Arc<Shared>);

impl Drop for WriterEnd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.failed.set(WRITER_FAILED.into());
        }
        self.0.writer_ended();
    }
}

/// A recording being written: the relay's handle on its writer thread.
pub struct Recorder {
    tx: std::sync::mpsc::Sender<Ev>,
    /// Answered as the writer thread's last step; dropped unanswered if it panicked. Taken by
    /// [`Recorder::finish`] alone.
    writer_done: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    input: bool,
    shared: Arc<Shared>,
    max: u64,
    strict: bool,
    /// Set when something could not be taken under `strict`: the recording is over.
    over: AtomicBool,
    /// Set by [`Recorder::complete`]: nothing more is taken.
    closed: AtomicBool,
    /// The writer's answer to the end [`Recorder::complete`] queued, until it came.
    completing: tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    /// [`STALL`] (shorter in tests). The end waits twice as long for the finished file's sync
    /// before the recording counts as failed (the session's end is audited `incomplete` then,
    /// rather than never).
    stall: Duration,
    pub path: PathBuf,
}

impl Recorder {
    /// Creates the file and writes the header now (so a recording that cannot be made is known
    /// at once: `record_session: strict`), then starts the writer thread.
    pub fn create(
        dir: &Path,
        session_id: &str,
        h: &Header<'_>,
        limits: Limits,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{session_id}.cast"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        Self::start(std::io::BufWriter::new(f), path, h, limits)
    }

    /// Writes the header into `sink` and starts the writer thread on it.
    fn start<S: Sink>(
        sink: S,
        path: PathBuf,
        h: &Header<'_>,
        limits: Limits,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            accounted: AtomicU64::new(0),
            full: AtomicBool::new(false),
            failed: OnceLock::new(),
            queued: Mutex::new(0),
            drained: tokio::sync::Notify::new(),
            taken: AtomicU64::new(0),
            ended: AtomicBool::new(false),
        });
        let mut w = Writer::start(sink, h, limits.max_bytes, shared.clone())?;
        let (tx, rx) = std::sync::mpsc::channel::<Ev>();
        let (done, writer_done) = tokio::sync::oneshot::channel();
        let queue = shared.clone();
        // Never joined: its end, however it ends, is told by `WriterEnd` and `done`.
        std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                let end = WriterEnd(queue.clone());
                loop {
                    match rx.recv_timeout(Duration::from_millis(500)) {
                        Ok(Ev::Out(d)) => {
                            w.output(&d);
                            queue.dequeued(d.len());
                        }
                        Ok(Ev::In(d)) => {
                            w.input(&d);
                            queue.dequeued(d.len());
                        }
                        Ok(Ev::Resize(c, r)) => {
                            w.resize(c, r);
                            queue.dequeued(0);
                        }
                        Ok(Ev::Sync(done)) => {
                            queue.uncount(EVENT);
                            let _ = done.send(());
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => w.tick(),
                        Ok(Ev::Finish(complete)) => {
                            w.complete();
                            let _ = complete.send(());
                            break;
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
                w.finish();
                drop(rx);
                drop(end);
                let _ = done.send(());
            })?;
        Ok(Recorder {
            tx,
            writer_done: Mutex::new(Some(writer_done)),
            input: limits.input,
            shared,
            max: limits.max_bytes,
            strict: limits.strict,
            over: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            completing: tokio::sync::Mutex::new(None),
            stall: STALL,
            path,
        })
    }

    /// Whether the recording stopped (nothing more is being written), and why. A failure is
    /// named first: a recording that failed may also have been cut short by it.
    pub fn stopped(&self) -> Option<Stop> {
        if let Some(e) = self.shared.failed.get() {
            return Some(Stop::Failed(e.clone()));
        }
        (self.over.load(Ordering::Acquire) || self.shared.full.load(Ordering::Acquire))
            .then_some(Stop::Full)
    }

    fn failed(&self) -> bool {
        self.shared.failed.get().is_some()
    }

    /// Waits until the writer has written everything queued, so that `accounted` holds the
    /// file's size (plus split UTF-8 tails) rather than bounds. False if the writer is gone
    /// (then the recording has failed).
    async fn settle(&self) -> bool {
        let (done, mut wait) = tokio::sync::oneshot::channel();
        self.count(EVENT);
        self.send(Ev::Sync(done));
        match self.answer(&mut wait).await {
            Answer::Given => true,
            Answer::Gone => {
                let _ = self
                    .shared
                    .failed
                    .set("the recording's writer did not answer".into());
                false
            }
            Answer::Stalled => {
                self.stalled();
                false
            }
        }
    }

    /// Waits for the writer's answer to an event queued last, as long as it takes events off
    /// its queue at least every `stall` (a slow disk is waited for, a stalled one is not).
    async fn answer(&self, wait: &mut tokio::sync::oneshot::Receiver<()>) -> Answer {
        let mut last = self.shared.taken.load(Ordering::Acquire);
        loop {
            match tokio::time::timeout(self.stall, &mut *wait).await {
                Ok(Ok(())) => return Answer::Given,
                Ok(Err(_)) => return Answer::Gone,
                Err(_) => {
                    let now = self.shared.taken.load(Ordering::Acquire);
                    if now == last {
                        return Answer::Stalled;
                    }
                    last = now;
                }
            }
        }
    }

    /// Reserves the bound of as many of `len` bytes as surely fit under `strict`, in one step
    /// (both of a session's tasks may take at once); answers how many.
    fn reserve(&self, len: usize) -> usize {
        let max = self.max;
        self.shared
            .accounted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                let n = fitting(len, a, max);
                (n > 0).then(|| a.saturating_add(bound(n)))
            })
            .map_or(0, |a| fitting(len, a, max))
    }

    /// Takes as much of `data` as surely fits under `strict` (all of it otherwise), queued in
    /// up to [`PIECES`] events, and answers how many leading bytes were taken: the relay shows
    /// the person those and no more. Taking less than all marks the recording over.
    async fn take(&self, data: bytes::Bytes, wrap: fn(bytes::Bytes) -> Ev) -> usize {
        let len = data.len();
        if len == 0 {
            return 0;
        }
        if self.closed.load(Ordering::Acquire) || self.failed() {
            // Nothing more is written; under `strict` nothing more goes on either.
            return if self.strict { 0 } else { len };
        }
        if !self.strict {
            // Past a failure or the end met while waiting, it goes on unrecorded.
            if self.wait_for_room(len).await {
                self.shared
                    .accounted
                    .fetch_add(bound(len), Ordering::AcqRel);
                self.send(wrap(data));
            }
            return len;
        }
        if self.over.load(Ordering::Acquire) {
            return 0;
        }
        let mut done = 0;
        for _ in 0..PIECES {
            let all = len - done;
            if fitting(all, self.shared.accounted.load(Ordering::Acquire), self.max) < all {
                // The bounds of queued events may be far above what they will take: count
                // exactly before giving anything up.
                if !self.settle().await {
                    break;
                }
            }
            // Waiting for the writer may meet its failure, or the recording's end: then
            // nothing more is taken.
            if !self.wait_for_room(all).await {
                break;
            }
            let n = self.reserve(all);
            if n == 0 {
                // Nothing goes in: what was counted for it comes off whole.
                self.shared.dequeued(all);
                break;
            }
            // The event queued is counted for `n` bytes (the writer takes that off).
            self.shared.uncount((all - n) as u64);
            if !self.send(wrap(data.slice(done..done + n))) {
                // The writer is gone: nothing more is recorded, so nothing more is shown.
                self.writer_failed();
                break;
            }
            done += n;
            if done == len {
                return len;
            }
        }
        self.over.store(true, Ordering::Release);
        done
    }

    /// Queues `ev`, counted first ([`Recorder::wait_for_room`], [`Recorder::count`]); never
    /// waits (the count is the queue's bound). False if the writer is gone (it is dropped).
    fn send(&self, ev: Ev) -> bool {
        self.tx.send(ev).is_ok()
    }

    /// The writer took nothing off its queue for `stall`: the recording has failed.
    fn stalled(&self) {
        let _ = self.shared.failed.set(format!(
            "the recording's writer wrote nothing for {} s (is the recordings disk stalled?)",
            self.stall.as_secs()
        ));
    }

    /// Counts `n` into the queue without waiting: the few events that are not data.
    fn count(&self, n: u64) {
        let mut q = self.shared.queued.lock().unwrap_or_else(|e| e.into_inner());
        *q = q.saturating_add(n);
    }

    /// Counts an event of `len` raw bytes into the queue, first waiting for the writer while
    /// the queue holds anything and this event would take it past [`QUEUE_BYTES`]. False, and
    /// nothing counted, when the recording failed or was completed meanwhile (nothing more is
    /// taken), when the writer is gone, and when it took nothing off the queue for `stall`
    /// (then the recording has failed). Dropped while it waits, it has counted nothing.
    async fn wait_for_room(&self, len: usize) -> bool {
        let cost = cost(len);
        let shared = &self.shared;
        let fits = |q: u64| q == 0 || q.saturating_add(cost) <= QUEUE_BYTES;
        // Once the failure or the end is known, nothing more is taken, however empty the
        // queue (a `settle` may have just emptied it past an error).
        if self.closed.load(Ordering::Acquire) || self.failed() {
            return false;
        }
        {
            let mut q = shared.queued.lock().unwrap_or_else(|e| e.into_inner());
            if fits(*q) {
                *q = q.saturating_add(cost);
                return true;
            }
        }
        // Each time the writer takes something off the queue, it has another `stall`.
        let mut last = shared.taken.load(Ordering::Acquire);
        let mut deadline = tokio::time::Instant::now() + self.stall;
        loop {
            // Registered before looking again, so that the writer's signal between the look
            // and the wait is not missed.
            let drained = shared.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.writer_gone() && !self.closed.load(Ordering::Acquire) {
                // It ended before the recording was complete: it failed.
                self.writer_failed();
            }
            if self.closed.load(Ordering::Acquire) || self.failed() {
                return false;
            }
            {
                let mut q = shared.queued.lock().unwrap_or_else(|e| e.into_inner());
                if fits(*q) {
                    *q = q.saturating_add(cost);
                    return true;
                }
            }
            let taken = shared.taken.load(Ordering::Acquire);
            if taken != last {
                last = taken;
                deadline = tokio::time::Instant::now() + self.stall;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                self.stalled();
                return false;
            }
            // The writer signals each event it takes off, and its end (`WriterEnd`).
            let _ = tokio::time::timeout(deadline - now, drained).await;
        }
    }

    /// Whether the writer thread has ended (`WriterEnd` says so on every way out, a panic's
    /// too).
    fn writer_gone(&self) -> bool {
        self.shared.ended.load(Ordering::Acquire)
    }

    /// `data` is shared with the relay, not copied. Answers how many leading bytes the
    /// recording takes: all of them unless `strict` and the limit is near or the recording
    /// failed ([`Recorder::take`]).
    pub async fn output(&self, data: bytes::Bytes) -> usize {
        self.take(data, Ev::Out).await
    }

    /// Written only when the roles ask for input (`record_input`); answers how many leading
    /// bytes may go on to the node, as [`Recorder::output`].
    pub async fn input(&self, data: bytes::Bytes) -> usize {
        if self.input {
            self.take(data, Ev::In).await
        } else {
            data.len()
        }
    }

    /// Records a resize; waits for room as output does, so that a flood of resizes is bounded
    /// by the queue too.
    pub async fn resize(&self, cols: u32, rows: u32) {
        if self.closed.load(Ordering::Acquire) || self.over.load(Ordering::Acquire) || self.failed()
        {
            return;
        }
        if !self.wait_for_room(0).await {
            return;
        }
        let accounted = &self.shared.accounted;
        if self.strict {
            let max = self.max;
            let reserved = accounted.fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                (a.saturating_add(RESIZE) <= max).then(|| a + RESIZE)
            });
            if reserved.is_err() {
                self.shared.dequeued(0);
                self.over.store(true, Ordering::Release);
                return;
            }
        } else {
            accounted.fetch_add(RESIZE, Ordering::AcqRel);
        }
        self.send(Ev::Resize(cols, rows));
    }

    /// Waits until everything queued is written and flushed: the file is complete for any
    /// reader, its sync still to come ([`Recorder::finish`]). Answers whether the recording
    /// stopped early and why (the limit, or an error writing). Nothing is taken after it.
    pub async fn complete(&self) -> Option<Stop> {
        // The end is queued once; its answer is awaited under this lock and kept until it
        // came, so a call that was cancelled while waiting leaves the wait to the next one
        // rather than let it report a file not yet complete.
        let mut completing = self.completing.lock().await;
        if !self.closed.swap(true, Ordering::AcqRel) {
            let (done, written) = tokio::sync::oneshot::channel();
            self.send(Ev::Finish(done));
            *completing = Some(written);
        }
        // A recording already failed writes nothing more: its writer (perhaps hung on the
        // disk) is not waited for.
        if let Some(written) = completing.as_mut()
            && !self.failed()
        {
            match self.answer(written).await {
                Answer::Given => {}
                // The writer went without answering: it could not finish the file.
                Answer::Gone => self.writer_failed(),
                Answer::Stalled => self.stalled(),
            }
        }
        *completing = None;
        self.stopped()
    }

    /// Completes the recording ([`Recorder::complete`], if not done yet) and waits until it
    /// is synced; answers whether it stopped early and why (the writer may find so only now:
    /// an error syncing). Nothing is taken after it.
    pub async fn finish(&self) -> Option<Stop> {
        self.complete().await;
        let done = self.writer_done.lock().ok().and_then(|mut d| d.take());
        if let Some(done) = done
            && !self.failed()
        {
            match tokio::time::timeout(self.stall * 2, done).await {
                Ok(Ok(())) => {}
                // Unanswered: the writer thread panicked.
                Ok(Err(_)) => self.writer_failed(),
                Err(_) => {
                    let _ = self.shared.failed.set(format!(
                        "the recording's file did not sync within {} s (is the recordings disk stalled?)",
                        (self.stall * 2).as_secs()
                    ));
                }
            }
        }
        self.stopped()
    }

    fn writer_failed(&self) {
        let _ = self.shared.failed.set(WRITER_FAILED.into());
    }
}

// Without finish (a proxy shutting down), dropping the last handle drops the queue's sender:
// the writer still drains, flushes and syncs.

pub struct Header<'a> {
    pub width: u32,
    pub height: u32,
    pub term: &'a str,
    pub title: &'a str,
    pub command: Option<&'a str>,
}
