//! Session recording in asciicast v2, written while the session runs: a header line, then one
//! `[seconds, "o"|"i"|"r", data]` line per event, flushed at least every second so that a proxy
//! killed mid-session leaves a readable recording of everything already seen.
//!
//! The writing runs on a thread of its own per recording, fed through a bounded queue, so that
//! turning a bulk transfer's bytes into asciicast text runs beside the relay rather than in it;
//! when the queue is full the relay waits (`block_in_place`) rather than drop anything.
//!
//! What is recorded is bounded ([`Limits`]): the person's input only when a role asks for it
//! (`record_input`: keystrokes include passwords typed where nothing echoes), and no file grows
//! past `max_recording_size`. At the limit the writer stops and says so ([`Recorder::is_full`]);
//! the relay then ends the session (`strict`) or goes on unrecorded with an audit event.
//!
//! Under `strict` the writer running behind must not let the person see output the recording
//! will not hold, so the relay side accounts every event before it is queued: `accounted` is the
//! bytes written plus an upper bound of everything queued ([`bound`]: each raw byte is at most 6
//! bytes of asciicast text, `\u00XX`, plus a line's framing), and the writer gives back what it
//! did not use. [`Recorder::output`] takes only as much of a chunk as surely fits; the relay
//! shows the person exactly that much and ends the session.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sallyport_core::asciicast::{escape_lossy_into, incomplete_tail};

/// Events queued for the writer thread.
enum Ev {
    Out(bytes::Bytes),
    In(bytes::Bytes),
    Resize(u32, u32),
    /// Answered once everything queued before it is written (and accounted exactly).
    Sync(std::sync::mpsc::SyncSender<()>),
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

/// How many events may wait for the writer (each at most one SSH packet, 32 KiB).
const QUEUE: usize = 1024;

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

/// A recording being written: the relay's handle on its writer thread.
pub struct Recorder {
    tx: Option<std::sync::mpsc::SyncSender<Ev>>,
    thread: Option<std::thread::JoinHandle<()>>,
    input: bool,
    /// Set by the writer when the next event would take the file past `max_bytes`.
    full: Arc<AtomicBool>,
    /// Bytes written plus the bound of everything queued (module docs).
    accounted: Arc<AtomicU64>,
    max: u64,
    strict: bool,
    /// Set when something could not be taken under `strict`: the recording is over.
    over: bool,
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
        let full = Arc::new(AtomicBool::new(false));
        let accounted = Arc::new(AtomicU64::new(0));
        let mut w = Writer::create(
            dir,
            session_id,
            h,
            limits.max_bytes,
            full.clone(),
            accounted.clone(),
        )?;
        let path = w.path.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Ev>(QUEUE);
        let thread = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                loop {
                    match rx.recv_timeout(Duration::from_millis(500)) {
                        Ok(Ev::Out(d)) => w.output(&d),
                        Ok(Ev::In(d)) => w.input(&d),
                        Ok(Ev::Resize(c, r)) => w.resize(c, r),
                        Ok(Ev::Sync(done)) => {
                            let _ = done.send(());
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => w.tick(),
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
                w.finish();
            })?;
        Ok(Recorder {
            tx: Some(tx),
            thread: Some(thread),
            input: limits.input,
            full,
            accounted,
            max: limits.max_bytes,
            strict: limits.strict,
            over: false,
            path,
        })
    }

    /// Whether the recording reached its size limit: nothing more is being written.
    pub fn is_full(&self) -> bool {
        self.over || self.full.load(Ordering::Relaxed)
    }

    /// Waits until the writer has written everything queued, so that `accounted` holds the
    /// file's size (plus split UTF-8 tails) rather than bounds. False if the writer is gone.
    fn settle(&mut self) -> bool {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        self.send(Ev::Sync(done));
        tokio::task::block_in_place(|| wait.recv_timeout(Duration::from_secs(30))).is_ok()
    }

    /// Takes as much of `data` as surely fits under `strict` (all of it otherwise), queued in
    /// up to [`PIECES`] events, and answers how many leading bytes were taken: the relay shows
    /// the person those and no more. Taking less than all marks the recording over.
    fn take(&mut self, data: bytes::Bytes, wrap: fn(bytes::Bytes) -> Ev) -> usize {
        let len = data.len();
        if len == 0 {
            return 0;
        }
        if !self.strict {
            self.accounted.fetch_add(bound(len), Ordering::Relaxed);
            self.send(wrap(data));
            return len;
        }
        if self.over {
            return 0;
        }
        let mut done = 0;
        for _ in 0..PIECES {
            let all = len - done;
            if fitting(all, self.accounted.load(Ordering::Relaxed), self.max) < all {
                // The bounds of queued events may be far above what they will take: count
                // exactly before giving anything up.
                if !self.settle() {
                    break;
                }
            }
            let n = fitting(all, self.accounted.load(Ordering::Relaxed), self.max);
            if n == 0 {
                break;
            }
            self.accounted.fetch_add(bound(n), Ordering::Relaxed);
            self.send(wrap(data.slice(done..done + n)));
            done += n;
            if done == len {
                return len;
            }
        }
        self.over = true;
        done
    }

    fn send(&mut self, ev: Ev) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(ev) {
            Ok(()) => {}
            Err(std::sync::mpsc::TrySendError::Full(ev)) => {
                // The writer is behind: wait for it, off the async worker's hot path.
                let _ = tokio::task::block_in_place(|| tx.send(ev));
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => self.tx = None,
        }
    }

    /// `data` is shared with the relay, not copied. Answers how many leading bytes the
    /// recording takes: all of them unless `strict` and the limit is near ([`Recorder::take`]).
    pub fn output(&mut self, data: bytes::Bytes) -> usize {
        self.take(data, Ev::Out)
    }

    /// Written only when the roles ask for input (`record_input`); answers how many leading
    /// bytes may go on to the node, as [`Recorder::output`].
    pub fn input(&mut self, data: bytes::Bytes) -> usize {
        if self.input {
            self.take(data, Ev::In)
        } else {
            data.len()
        }
    }

    pub fn resize(&mut self, cols: u32, rows: u32) {
        if self.over {
            return;
        }
        if self.strict
            && self
                .accounted
                .load(Ordering::Relaxed)
                .saturating_add(RESIZE)
                > self.max
        {
            self.over = true;
            return;
        }
        self.accounted.fetch_add(RESIZE, Ordering::Relaxed);
        self.send(Ev::Resize(cols, rows));
    }

    /// Waits until everything queued is written, flushed and synced; answers whether the
    /// recording reached its size limit (the writer may find so only now).
    pub fn finish(mut self) -> bool {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::block_in_place(|| t.join());
        }
        self.is_full()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // Without finish (a proxy shutting down): the writer still drains and flushes.
        self.tx = None;
    }
}

/// The writer thread's side: the file and the text conversion.
struct Writer {
    file: std::io::BufWriter<std::fs::File>,
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
    /// Set once an event did not fit: nothing more is written.
    full: Arc<AtomicBool>,
    /// Shared with the relay (module docs): the writer gives back each event's unused bound.
    accounted: Arc<AtomicU64>,
    /// Per stream, the bound still held for the bytes in `carry` (counted with their chunk).
    carry_bound: [u64; 2],
    pub path: PathBuf,
}

pub struct Header<'a> {
    pub width: u32,
    pub height: u32,
    pub term: &'a str,
    pub title: &'a str,
    pub command: Option<&'a str>,
}

impl Writer {
    fn create(
        dir: &Path,
        session_id: &str,
        h: &Header<'_>,
        max: u64,
        full: Arc<AtomicBool>,
        accounted: Arc<AtomicU64>,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{session_id}.cast"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let mut file = std::io::BufWriter::new(f);
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
        file.write_all(header.as_bytes())?;
        file.flush()?;
        accounted.store(header.len() as u64, Ordering::Relaxed);
        let now = Instant::now();
        Ok(Writer {
            file,
            start: now,
            last_flush: now,
            dirty: false,
            carry: [Vec::new(), Vec::new()],
            scratch: Vec::new(),
            size: header.len() as u64,
            max,
            full,
            accounted,
            carry_bound: [0, 0],
            path,
        })
    }

    /// An event for which `reserved` was accounted took `used` bytes (file and held tail).
    fn account(&self, reserved: u64, used: u64) {
        if used <= reserved {
            self.accounted.fetch_sub(reserved - used, Ordering::Relaxed);
        } else {
            // Never by the bounds above; kept honest all the same.
            self.accounted.fetch_add(used - reserved, Ordering::Relaxed);
        }
    }

    /// Whether `len` more bytes fit; once one event does not, none is written after it (a
    /// recording with a hole in it would mislead more than one that stops).
    fn fits(&mut self, len: usize) -> bool {
        if self.full.load(Ordering::Relaxed) {
            return false;
        }
        if self.size.saturating_add(len as u64) > self.max {
            self.full.store(true, Ordering::Relaxed);
            return false;
        }
        self.size += len as u64;
        true
    }

    /// Writes one line; answers its length if written.
    fn event(&mut self, kind: &str, text: &str) -> u64 {
        let t = self.start.elapsed().as_secs_f64();
        let line = format!(
            "{}\n",
            serde_json::json!([(t * 1e6).round() / 1e6, kind, text])
        );
        if self.fits(line.len()) {
            let _ = self.file.write_all(line.as_bytes());
            self.written();
            return line.len() as u64;
        }
        0
    }

    fn written(&mut self) {
        self.dirty = true;
        if self.last_flush.elapsed() >= Duration::from_millis(500) {
            let _ = self.file.flush();
            self.last_flush = Instant::now();
            self.dirty = false;
        }
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
        if bytes.is_empty() {
            return 0;
        }
        if self.full.load(Ordering::Relaxed) {
            return 0;
        }
        let t = self.start.elapsed().as_secs_f64();
        let head = format!("[{}, \"{kind}\", \"", (t * 1e6).round() / 1e6);
        let n = escape_lossy_into(bytes, &mut self.scratch);
        let len = head.len() + n + 3;
        if !self.fits(len) {
            return 0;
        }
        let _ = self.file.write_all(head.as_bytes());
        let _ = self.file.write_all(&self.scratch[..n]);
        let _ = self.file.write_all(b"\"]\n");
        self.written();
        len as u64
    }

    fn output(&mut self, data: &[u8]) {
        self.bytes_event(0, "o", data);
    }

    fn input(&mut self, data: &[u8]) {
        self.bytes_event(1, "i", data);
    }

    fn resize(&mut self, cols: u32, rows: u32) {
        let used = self.event("r", &format!("{cols}x{rows}"));
        self.account(RESIZE, used);
    }

    /// Flushes whatever was written since the last flush; a timer calls it every second, so
    /// nothing seen stays unwritten for longer.
    fn tick(&mut self) {
        if self.dirty {
            let _ = self.file.flush();
            self.last_flush = Instant::now();
            self.dirty = false;
        }
    }

    fn finish(mut self) {
        // A sequence cut by the session's end was shown to the person: it is written too
        // (its share of the bound is still held, so it fits under `strict`).
        for (stream, kind) in [(0, "o"), (1, "i")] {
            if !self.carry[stream].is_empty() {
                self.write_bytes(stream, kind, &[], true);
            }
        }
        let _ = self.file.flush();
        let _ = self.file.get_ref().sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNLIMITED: Limits = Limits {
        input: true,
        max_bytes: u64::MAX,
        strict: false,
    };

    fn header() -> Header<'static> {
        Header {
            width: 80,
            height: 24,
            term: "xterm",
            title: "t",
            command: None,
        }
    }

    #[test]
    fn binary_output_reads_as_lossy_utf8_however_it_is_cut() {
        let dir = std::env::temp_dir().join(format!("rec-bin-{}", std::process::id()));
        let h = header();
        use rand::Rng;
        let mut data = vec![0u8; 20_000];
        rand::rng().fill_bytes(&mut data);
        data.extend_from_slice("snow ☃ and \"quotes\" \\ \u{1} end".as_bytes());
        let mut r = Recorder::create(&dir, "bin", &h, UNLIMITED).unwrap_or_else(|e| panic!("{e}"));
        let mut at = 0;
        let mut step = 1;
        while at < data.len() {
            let end = (at + step).min(data.len());
            r.output(bytes::Bytes::copy_from_slice(&data[at..end]));
            at = end;
            step = step % 97 + 1;
        }
        let path = r.path.clone();
        r.finish();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut got = String::new();
        for l in text.lines().skip(1) {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            got.push_str(v[2].as_str().unwrap_or_default());
        }
        assert_eq!(got, String::from_utf8_lossy(&data));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn utf8_split_across_chunks_and_escaped_lines() {
        let dir = std::env::temp_dir().join(format!("rec-test-{}", std::process::id()));
        let h = header();
        let mut r = Recorder::create(&dir, "s1", &h, UNLIMITED).unwrap_or_else(|e| panic!("{e}"));
        let snow = "☃".as_bytes();
        r.output(bytes::Bytes::copy_from_slice(&snow[..1]));
        r.output(bytes::Bytes::copy_from_slice(&snow[1..]));
        r.output(bytes::Bytes::from_static(b"a\nb\x1b[0m\xff"));
        r.resize(100, 30);
        let path = r.path.clone();
        r.finish();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_default())
            .collect();
        assert_eq!(lines[0]["version"], 2);
        assert_eq!(lines[1][2], "☃");
        assert_eq!(lines[2][2], "a\nb\u{1b}[0m\u{fffd}");
        assert_eq!(lines[3][1], "r");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn events(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn input_is_written_only_when_asked_for() {
        let dir = std::env::temp_dir().join(format!("rec-input-{}", std::process::id()));
        for input in [false, true] {
            let id = format!("in-{input}");
            let limits = Limits {
                input,
                max_bytes: u64::MAX,
                strict: false,
            };
            let mut r =
                Recorder::create(&dir, &id, &header(), limits).unwrap_or_else(|e| panic!("{e}"));
            r.input(bytes::Bytes::from_static(b"hunter2\n"));
            r.output(bytes::Bytes::from_static(b"ok\n"));
            let path = r.path.clone();
            r.finish();
            let kinds: Vec<String> = events(&path)
                .iter()
                .map(|e| e[1].as_str().unwrap_or_default().to_string())
                .collect();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if input {
                assert_eq!(kinds, ["i", "o"]);
            } else {
                assert_eq!(kinds, ["o"]);
                assert!(!text.contains("hunter2"), "{text}");
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_recording_stops_whole_at_its_size_limit() {
        let dir = std::env::temp_dir().join(format!("rec-limit-{}", std::process::id()));
        let max = 4096;
        let limits = Limits {
            input: false,
            max_bytes: max,
            strict: false,
        };
        let mut r =
            Recorder::create(&dir, "limit", &header(), limits).unwrap_or_else(|e| panic!("{e}"));
        assert!(!r.is_full());
        for i in 0..200 {
            r.output(bytes::Bytes::from(format!("line {i} \x01\n")));
        }
        let path = r.path.clone();
        let full = r.full.clone();
        r.finish();
        assert!(full.load(Ordering::Relaxed));
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size <= max && size > max / 2, "{size}");
        // Every line written is whole, and they stop at a line, not in the middle.
        let got = events(&path);
        assert!(!got.is_empty());
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e[2], format!("line {i} \u{1}\n"));
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn under_strict_only_what_the_recording_will_hold_is_taken() {
        let dir = std::env::temp_dir().join(format!("rec-strict-{}", std::process::id()));
        let max = 64 * 1024;
        let limits = Limits {
            input: false,
            max_bytes: max,
            strict: true,
        };
        let mut r =
            Recorder::create(&dir, "strict", &header(), limits).unwrap_or_else(|e| panic!("{e}"));
        // 32 KiB chunks (an SSH packet each), control bytes and a UTF-8 sequence cut between
        // chunks among them, queued faster than the writer writes.
        let mut chunk = Vec::new();
        while chunk.len() < 32 * 1024 {
            chunk.extend_from_slice("ligne \x01 é\n".as_bytes());
        }
        chunk.truncate(32 * 1024 - 1);
        let mut taken = Vec::new();
        for _ in 0..40 {
            let n = r.output(bytes::Bytes::from(chunk.clone()));
            taken.extend_from_slice(&chunk[..n]);
            if n < chunk.len() {
                break;
            }
        }
        assert!(r.is_full(), "the limit was reached");
        assert_eq!(r.output(bytes::Bytes::from_static(b"more")), 0);
        let path = r.path.clone();
        r.finish();
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size <= max, "{size}");
        // Close to the limit: the writer caught up before the last pieces were cut.
        assert!(size > max * 3 / 4, "{size}");
        let recorded: String = events(&path)
            .iter()
            .map(|e| e[2].as_str().unwrap_or_default().to_string())
            .collect();
        // Everything taken (the relay shows exactly that) is in the recording, a UTF-8
        // sequence cut at the very end included (as U+FFFD).
        assert_eq!(recorded, String::from_utf8_lossy(&taken));
        let _ = std::fs::remove_dir_all(dir);
    }
}
