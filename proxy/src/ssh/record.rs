//! Session recording in asciicast v2, written while the session runs: a header line, then one
//! `[seconds, "o"|"i"|"r", data]` line per event, flushed at least every second so that a proxy
//! killed mid-session leaves a readable recording of everything already seen.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Recorder {
    file: std::io::BufWriter<std::fs::File>,
    start: Instant,
    last_flush: Instant,
    /// Events written since the last flush.
    dirty: bool,
    /// Bytes of a UTF-8 sequence split across two chunks, per stream.
    carry: [Vec<u8>; 2],
    pub path: PathBuf,
}

pub struct Header<'a> {
    pub width: u32,
    pub height: u32,
    pub term: &'a str,
    pub title: &'a str,
    pub command: Option<&'a str>,
}

impl Recorder {
    pub fn create(dir: &Path, session_id: &str, h: &Header<'_>) -> std::io::Result<Self> {
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
        Ok(Recorder {
            file,
            start: now,
            last_flush: now,
            dirty: false,
            carry: [Vec::new(), Vec::new()],
            path,
        })
    }

    fn event(&mut self, kind: &str, text: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let line = serde_json::json!([(t * 1e6).round() / 1e6, kind, text]);
        let _ = writeln!(self.file, "{line}");
        self.dirty = true;
        if self.last_flush.elapsed() >= Duration::from_millis(500) {
            let _ = self.file.flush();
            self.last_flush = Instant::now();
            self.dirty = false;
        }
    }

    /// Text of `data` that is complete UTF-8, keeping a split sequence for the next chunk.
    fn text(&mut self, stream: usize, data: &[u8]) -> String {
        let mut bytes = std::mem::take(&mut self.carry[stream]);
        bytes.extend_from_slice(data);
        let mut out = String::new();
        let mut rest: &[u8] = &bytes;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(good));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &bad[n..];
                        }
                        None => {
                            self.carry[stream] = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    pub fn output(&mut self, data: &[u8]) {
        let t = self.text(0, data);
        if !t.is_empty() {
            self.event("o", &t);
        }
    }

    pub fn input(&mut self, data: &[u8]) {
        let t = self.text(1, data);
        if !t.is_empty() {
            self.event("i", &t);
        }
    }

    pub fn resize(&mut self, cols: u32, rows: u32) {
        self.event("r", &format!("{cols}x{rows}"));
    }

    /// Flushes whatever was written since the last flush; a timer calls it every second, so
    /// nothing seen stays unwritten for longer.
    pub fn tick(&mut self) {
        if self.dirty {
            let _ = self.file.flush();
            self.last_flush = Instant::now();
            self.dirty = false;
        }
    }

    pub fn finish(mut self) {
        let _ = self.file.flush();
        let _ = self.file.get_ref().sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_and_escaped_lines() {
        let dir = std::env::temp_dir().join(format!("rec-test-{}", std::process::id()));
        let h = Header {
            width: 80,
            height: 24,
            term: "xterm",
            title: "t",
            command: None,
        };
        let mut r = Recorder::create(&dir, "s1", &h).unwrap_or_else(|e| panic!("{e}"));
        let snow = "☃".as_bytes();
        r.output(&snow[..1]);
        r.output(&snow[1..]);
        r.output(b"a\nb\x1b[0m\xff");
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
