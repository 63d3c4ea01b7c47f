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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sallyport_core::asciicast::{escape_lossy_into, incomplete_tail};

/// Events queued for the writer thread.
enum Ev {
    Out(bytes::Bytes),
    In(bytes::Bytes),
    Resize(u32, u32),
}

/// How many events may wait for the writer (each at most one SSH packet, 32 KiB).
const QUEUE: usize = 1024;

/// What a recording may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Whether the person's input is written (`i` events): only when a role asks for it.
    pub input: bool,
    /// The largest the file may grow, in bytes (`max_recording_size`).
    pub max_bytes: u64,
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
        let mut w = Writer::create(dir, session_id, h, limits.max_bytes, full.clone())?;
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
            path,
        })
    }

    /// Whether the recording reached its size limit: nothing more is being written.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
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

    /// `data` is shared with the relay, not copied.
    pub fn output(&mut self, data: bytes::Bytes) {
        self.send(Ev::Out(data));
    }

    /// Written only when the roles ask for input (`record_input`).
    pub fn input(&mut self, data: bytes::Bytes) {
        if self.input {
            self.send(Ev::In(data));
        }
    }

    pub fn resize(&mut self, cols: u32, rows: u32) {
        self.send(Ev::Resize(cols, rows));
    }

    /// Waits until everything queued is written, flushed and synced.
    pub fn finish(mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::block_in_place(|| t.join());
        }
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
            path,
        })
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

    fn event(&mut self, kind: &str, text: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let line = format!(
            "{}\n",
            serde_json::json!([(t * 1e6).round() / 1e6, kind, text])
        );
        if self.fits(line.len()) {
            let _ = self.file.write_all(line.as_bytes());
            self.written();
        }
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
        let carried = std::mem::take(&mut self.carry[stream]);
        let joined;
        let bytes: &[u8] = if carried.is_empty() {
            data
        } else {
            joined = [carried.as_slice(), data].concat();
            &joined
        };
        // A trailing incomplete sequence (at most 3 bytes) waits for the next chunk.
        let keep = incomplete_tail(bytes);
        let (bytes, tail) = bytes.split_at(bytes.len() - keep);
        self.carry[stream] = tail.to_vec();
        if bytes.is_empty() {
            return;
        }
        if self.full.load(Ordering::Relaxed) {
            return;
        }
        let t = self.start.elapsed().as_secs_f64();
        let head = format!("[{}, \"{kind}\", \"", (t * 1e6).round() / 1e6);
        let n = escape_lossy_into(bytes, &mut self.scratch);
        if !self.fits(head.len() + n + 3) {
            return;
        }
        let _ = self.file.write_all(head.as_bytes());
        let _ = self.file.write_all(&self.scratch[..n]);
        let _ = self.file.write_all(b"\"]\n");
        self.written();
    }

    fn output(&mut self, data: &[u8]) {
        self.bytes_event(0, "o", data);
    }

    fn input(&mut self, data: &[u8]) {
        self.bytes_event(1, "i", data);
    }

    fn resize(&mut self, cols: u32, rows: u32) {
        self.event("r", &format!("{cols}x{rows}"));
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
}
