//! Session recording in asciicast v2, written while the session runs: a header line, then one
//! `[seconds, "o"|"i"|"r", data]` line per event, flushed at least every second so that a proxy
//! killed mid-session leaves a readable recording of everything already seen.
//!
//! The writing runs on a thread of its own per recording, fed through a bounded queue, so that
//! turning a bulk transfer's bytes into asciicast text runs beside the relay rather than in it;
//! when the queue is full the relay waits (`block_in_place`) rather than drop anything.

use std::io::Write;
use std::path::{Path, PathBuf};
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

/// A recording being written: the relay's handle on its writer thread.
pub struct Recorder {
    tx: Option<std::sync::mpsc::SyncSender<Ev>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub path: PathBuf,
}

impl Recorder {
    /// Creates the file and writes the header now (so a recording that cannot be made is known
    /// at once: `record_session: strict`), then starts the writer thread.
    pub fn create(dir: &Path, session_id: &str, h: &Header<'_>) -> std::io::Result<Self> {
        let mut w = Writer::create(dir, session_id, h)?;
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
            path,
        })
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

    pub fn input(&mut self, data: bytes::Bytes) {
        self.send(Ev::In(data));
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
    fn create(dir: &Path, session_id: &str, h: &Header<'_>) -> std::io::Result<Self> {
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
        writeln!(file, "{header}")?;
        file.flush()?;
        let now = Instant::now();
        Ok(Writer {
            file,
            start: now,
            last_flush: now,
            dirty: false,
            carry: [Vec::new(), Vec::new()],
            scratch: Vec::new(),
            path,
        })
    }

    fn event(&mut self, kind: &str, text: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let line = serde_json::json!([(t * 1e6).round() / 1e6, kind, text]);
        let _ = writeln!(self.file, "{line}");
        self.written();
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
        let t = self.start.elapsed().as_secs_f64();
        let _ = write!(self.file, "[{}, \"{kind}\", \"", (t * 1e6).round() / 1e6);
        let n = escape_lossy_into(bytes, &mut self.scratch);
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
        let mut r = Recorder::create(&dir, "bin", &h).unwrap_or_else(|e| panic!("{e}"));
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
        let mut r = Recorder::create(&dir, "s1", &h).unwrap_or_else(|e| panic!("{e}"));
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
}
