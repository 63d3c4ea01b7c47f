//! The writer thread's side of a recording: the file and the asciicast text conversion.
//!
//! The first I/O error ends the writing for good: the error is kept for the relay
//! ([`super::Recorder::stopped`]) and the file is let go without writing what was buffered, so a
//! failed recording holds what was written before the failure and nothing after it (a disk
//! that was full a moment ago must not get a line cut in two, or a hole, appended).

use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sallyport_core::asciicast::{escape_lossy_into, incomplete_tail};
use sallyport_core::metrics::metrics;

use super::{Header, PER_BYTE, RESIZE, Shared, bound};

/// Where a recording's bytes go: the file (buffered), or in tests a writer that fails.
pub(super) trait Sink: Write + Send + 'static {
    /// Flushes, then makes what was written durable.
    fn sync(&mut self) -> std::io::Result<()>;
    /// Lets go of the destination without writing anything more.
    fn abandon(self);
}

/// What a [`BufWriter`] writes to: a file, which can be synced.
pub(super) trait Durable: Write + Send + 'static {
    fn sync_all(&self) -> std::io::Result<()>;
}

impl Durable for std::fs::File {
    fn sync_all(&self) -> std::io::Result<()> {
        std::fs::File::sync_all(self)
    }
}

impl<W: Durable> Sink for BufWriter<W> {
    fn sync(&mut self) -> std::io::Result<()> {
        self.flush()?;
        self.get_ref().sync_all()
    }

    fn abandon(self) {
        // Dropping a BufWriter flushes what it holds: after a failure nothing more is written.
        let _ = self.into_parts();
    }
}

pub(super) struct Writer<S: Sink> {
    /// None once an I/O error ended the writing.
    sink: Option<S>,
    start: Instant,
    last_flush: Instant,
    /// Events written since the last flush.
    dirty: bool,
    /// Bytes of a UTF-8 sequence split across two chunks, per stream.
    carry: [Vec<u8>; 2],
    /// Working space for one event's escaped text, kept at its largest size.
    scratch: Vec<u8>,
    /// Bytes in the file so far, and the most it may hold.
    size: u64,
    max: u64,
    /// Shared with the relay: the size limit and failure flags, and `accounted` (the module
    /// docs of `record`), of which the writer gives back each event's unused bound.
    shared: Arc<Shared>,
    /// Per stream, the bound still held for the bytes in `carry` (counted with their chunk).
    carry_bound: [u64; 2],
}

/// Writes `parts` one after the other, stopping at the first error.
fn write_parts<S: Sink>(sink: &mut S, parts: &[&[u8]]) -> std::io::Result<()> {
    parts.iter().try_for_each(|p| sink.write_all(p))
}

impl<S: Sink> Writer<S> {
    /// Writes the header into `sink` and flushes it: a recording that cannot be made is known
    /// at once (`record_session: strict`).
    pub(super) fn start(
        mut sink: S,
        h: &Header<'_>,
        max: u64,
        shared: Arc<Shared>,
    ) -> std::io::Result<Self> {
        let mut header = serde_json::json!({
            "version": 2,
            "width": h.width,
            "height": h.height,
            "timestamp": sallyport_core::unix_now(),
            "title": h.title,
            "env": {"TERM": h.term, "SHELL": "/bin/sh"},
        });
        if let Some(c) = h.command {
            header["command"] = c.into();
        }
        let header = format!("{header}\n");
        sink.write_all(header.as_bytes())?;
        sink.flush()?;
        metrics().recording_written(header.len() as u64);
        shared
            .accounted
            .store(header.len() as u64, Ordering::Relaxed);
        let now = Instant::now();
        Ok(Writer {
            sink: Some(sink),
            start: now,
            last_flush: now,
            dirty: false,
            carry: [Vec::new(), Vec::new()],
            scratch: Vec::new(),
            size: header.len() as u64,
            max,
            shared,
            carry_bound: [0, 0],
        })
    }

    /// Keeps the first error for the relay and ends the writing (module docs).
    fn check(&mut self, r: std::io::Result<()>) -> bool {
        let Err(e) = r else { return true };
        let _ = self.shared.failed.set(e.to_string());
        if let Some(s) = self.sink.take() {
            s.abandon();
        }
        false
    }

    /// An event for which `reserved` was accounted took `used` bytes (file and held tail).
    fn account(&self, reserved: u64, used: u64) {
        let accounted = &self.shared.accounted;
        if used <= reserved {
            accounted.fetch_sub(reserved - used, Ordering::AcqRel);
        } else {
            // Never by the bounds above; kept honest all the same.
            accounted.fetch_add(used - reserved, Ordering::AcqRel);
        }
    }

    /// Whether `len` more bytes fit; once one event does not, none is written after it (a
    /// recording with a hole in it would mislead more than one that stops). Nothing fits
    /// after a failure.
    fn fits(&mut self, len: usize) -> bool {
        if self.sink.is_none() || self.shared.full.load(Ordering::Acquire) {
            return false;
        }
        if self.size.saturating_add(len as u64) > self.max {
            self.shared.full.store(true, Ordering::Release);
            return false;
        }
        self.size += len as u64;
        true
    }

    /// Writes `parts` as one line of `len` bytes if it fits; answers its length if written.
    fn line(&mut self, len: usize, parts: &[&[u8]]) -> u64 {
        if !self.fits(len) {
            return 0;
        }
        self.give_up_if_failed();
        let Some(sink) = self.sink.as_mut() else {
            return 0;
        };
        let r = write_parts(sink, parts);
        if !self.check(r) {
            return 0;
        }
        metrics().recording_written(len as u64);
        self.dirty = true;
        if self.last_flush.elapsed() >= Duration::from_millis(500) {
            self.flush();
        }
        len as u64
    }

    /// Once the recording is marked failed — by this writer's error, or by the relay that gave
    /// up on it (it stalled, or did not answer) — nothing more is written, flushed or synced.
    fn give_up_if_failed(&mut self) {
        if self.shared.failed.get().is_some()
            && let Some(s) = self.sink.take()
        {
            s.abandon();
        }
    }

    fn flush(&mut self) {
        self.give_up_if_failed();
        if let Some(sink) = self.sink.as_mut() {
            let r = sink.flush();
            self.check(r);
        }
        self.last_flush = Instant::now();
        self.dirty = false;
    }

    /// Writes `data` as one `[t, kind, "text"]` line: the bytes read as UTF-8 in one pass
    /// (invalid bytes become U+FFFD, a sequence split at the end of the chunk waits for the
    /// next one) and JSON-escaped straight into the file buffer, with no intermediate string.
    /// Output of a bulk transfer goes through here, so it must cost little per byte.
    fn bytes_event(&mut self, stream: usize, kind: &str, data: &[u8]) {
        let reserved = bound(data.len()) + std::mem::take(&mut self.carry_bound[stream]);
        let written = self.write_bytes(stream, kind, data, false);
        // The split tail's bytes are still to be written: their share stays held.
        self.carry_bound[stream] = PER_BYTE * self.carry[stream].len() as u64;
        self.account(reserved, written + self.carry_bound[stream]);
    }

    /// [`Writer::bytes_event`]'s writing; answers the bytes written to the file.
    /// `last`: nothing follows, so a split tail is written too (as U+FFFD).
    fn write_bytes(&mut self, stream: usize, kind: &str, data: &[u8], last: bool) -> u64 {
        let carried = std::mem::take(&mut self.carry[stream]);
        let joined;
        let bytes: &[u8] = if carried.is_empty() {
            data
        } else {
            joined = [carried.as_slice(), data].concat();
            &joined
        };
        // A trailing incomplete sequence (at most 3 bytes) waits for the next chunk.
        let keep = if last { 0 } else { incomplete_tail(bytes) };
        let (bytes, tail) = bytes.split_at(bytes.len() - keep);
        self.carry[stream] = tail.to_vec();
        if bytes.is_empty() || self.sink.is_none() || self.shared.full.load(Ordering::Acquire) {
            return 0;
        }
        let t = self.start.elapsed().as_secs_f64();
        let head = format!("[{}, \"{kind}\", \"", (t * 1e6).round() / 1e6);
        let mut scratch = std::mem::take(&mut self.scratch);
        let n = escape_lossy_into(bytes, &mut scratch);
        let len = head.len() + n + 3;
        let written = self.line(len, &[head.as_bytes(), &scratch[..n], b"\"]\n"]);
        self.scratch = scratch;
        written
    }

    pub(super) fn output(&mut self, data: &[u8]) {
        self.bytes_event(0, "o", data);
    }

    pub(super) fn input(&mut self, data: &[u8]) {
        self.bytes_event(1, "i", data);
    }

    pub(super) fn resize(&mut self, cols: u32, rows: u32) {
        let t = self.start.elapsed().as_secs_f64();
        let text = format!(
            "{}\n",
            serde_json::json!([(t * 1e6).round() / 1e6, "r", format!("{cols}x{rows}")])
        );
        let used = self.line(text.len(), &[text.as_bytes()]);
        self.account(RESIZE, used);
    }

    /// Flushes whatever was written since the last flush; a timer calls it every second, so
    /// nothing seen stays unwritten for longer.
    pub(super) fn tick(&mut self) {
        if self.dirty {
            self.flush();
        }
    }

    /// Nothing follows: writes what is held and flushes, so the file is complete for any
    /// reader (not yet durable: [`Writer::finish`]).
    pub(super) fn complete(&mut self) {
        // A sequence cut by the session's end was shown to the person: it is written too
        // (its share of the bound is still held, so it fits under `strict`).
        for (stream, kind) in [(0, "o"), (1, "i")] {
            if !self.carry[stream].is_empty() {
                self.write_bytes(stream, kind, &[], true);
            }
        }
        self.flush();
    }

    /// Completes the file (if [`Writer::complete`] did not already) and makes it durable.
    pub(super) fn finish(mut self) {
        self.complete();
        self.give_up_if_failed();
        if let Some(sink) = self.sink.as_mut() {
            let r = sink.sync();
            self.check(r);
        }
    }
}

impl<S: Sink> Drop for Writer<S> {
    /// A writer that panics lets its buffer go unwritten (the recording has failed: nothing is
    /// written after that, a line cut in two least of all).
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(s) = self.sink.take()
        {
            s.abandon();
        }
    }
}
