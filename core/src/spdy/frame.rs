//! SPDY/3.1 frames on the wire: [`Encoder`] writes them (compressing header blocks in the order
//! sent), [`Decoder`] reads them from a buffer that may hold any part of any frame.
//!
//! A DATA frame is handed on in pieces as its bytes arrive, never held whole, so its size (up
//! to 16 MiB by the format) costs nothing; a control frame is held whole and refused past
//! [`Limits::max_control`], and its header block past [`Limits::max_header_block`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::FrameError;
use super::zlib::{HeaderDeflate, HeaderInflate};

pub const VERSION: u16 = 3;

pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const SETTINGS: u16 = 4;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const HEADERS: u16 = 8;
pub const WINDOW_UPDATE: u16 = 9;

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// RST_STREAM status codes.
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const UNSUPPORTED_VERSION: u32 = 4;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
    pub const FLOW_CONTROL_ERROR: u32 = 7;
}

/// GOAWAY status codes.
pub mod goaway {
    pub const OK: u32 = 0;
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INTERNAL_ERROR: u32 = 2;
}

/// The SETTINGS id of the initial stream window.
pub const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;

/// The largest payload a frame's 24-bit length can say.
pub const MAX_LENGTH: usize = 0xFF_FFFF;

/// A header block's names and values. Names are lower case on the wire (spdystream refuses
/// others); several values of one name travel as one, joined with NUL, and are split again
/// here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

/// The most headers one block may carry (a value with NULs counts once per piece).
pub const MAX_HEADER_ENTRIES: usize = 512;

impl Headers {
    pub fn new() -> Self {
        Headers(Vec::new())
    }

    /// `self` with `name: value` added.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.add(name, value);
        self
    }

    pub fn add(&mut self, name: &str, value: &str) {
        self.0.push((name.to_ascii_lowercase(), value.to_string()));
    }

    /// The first value of `name` (any case).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The uncompressed block: the count, then each name and value with its length.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in &self.0 {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        let mut out = Vec::new();
        out.put_u32(names.len() as u32);
        for name in names {
            let values: Vec<&str> = self
                .0
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .collect();
            let value = values.join("\0");
            out.put_u32(name.len() as u32);
            out.put_slice(name.as_bytes());
            out.put_u32(value.len() as u32);
            out.put_slice(value.as_bytes());
        }
        out
    }

    pub(super) fn decode(mut raw: &[u8]) -> Result<Headers, FrameError> {
        let short = || FrameError::Malformed("a truncated header block");
        let take = |raw: &mut &[u8]| -> Result<Vec<u8>, FrameError> {
            if raw.remaining() < 4 {
                return Err(short());
            }
            let n = raw.get_u32() as usize;
            if raw.remaining() < n {
                return Err(short());
            }
            let v = raw[..n].to_vec();
            raw.advance(n);
            Ok(v)
        };
        if raw.remaining() < 4 {
            return Err(short());
        }
        let count = raw.get_u32() as usize;
        // Each entry takes at least eight bytes: a count beyond that is a lie, not an allocation.
        if count > raw.remaining() / 8 {
            return Err(short());
        }
        // A value holding many NULs is many headers, each with its own copy of the name: what
        // they hold together is bounded by twice the block, and their number by
        // `MAX_HEADER_ENTRIES` (a long name over many empty values would otherwise be a
        // gigabyte from 64 KiB).
        let mut budget = raw.remaining().saturating_mul(2);
        let mut h = Headers(Vec::with_capacity(count));
        for _ in 0..count {
            let name = String::from_utf8_lossy(&take(&mut raw)?).to_ascii_lowercase();
            let value = take(&mut raw)?;
            for v in value.split(|&b| b == 0) {
                let size = name.len().saturating_add(v.len());
                if h.0.len() >= MAX_HEADER_ENTRIES || size > budget {
                    return Err(FrameError::Malformed(
                        "a header block that names too many headers",
                    ));
                }
                budget -= size;
                h.0.push((name.clone(), String::from_utf8_lossy(v).into_owned()));
            }
        }
        if raw.has_remaining() {
            return Err(FrameError::Malformed("bytes after the header block"));
        }
        Ok(h)
    }
}

/// One frame. DATA may be a piece of a frame (see the module doc); `fin` is on its last piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        id: u32,
        associated: u32,
        priority: u8,
        fin: bool,
        unidirectional: bool,
        headers: Headers,
    },
    SynReply {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Settings(Vec<Setting>),
    Ping(u32),
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        id: u32,
        delta: u32,
    },
    Data {
        id: u32,
        fin: bool,
        data: Bytes,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub flags: u8,
    pub id: u32,
    pub value: u32,
}

/// What a peer may make this side hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest control frame (SYN_STREAM and its header block, SETTINGS...).
    pub max_control: usize,
    /// The largest header block once decompressed.
    pub max_header_block: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_control: 64 * 1024,
            max_header_block: 64 * 1024,
        }
    }
}

/// Writes frames; header blocks go through this direction's one zlib stream.
#[derive(Default)]
pub struct Encoder {
    deflate: HeaderDeflate,
}

fn control_head(out: &mut BytesMut, kind: u16, flags: u8, len: usize) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u32((u32::from(flags) << 24) | (len as u32 & 0xFF_FFFF));
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), FrameError> {
        let fin = |f: bool| if f { FLAG_FIN } else { 0 };
        match frame {
            Frame::SynStream {
                id,
                associated,
                priority,
                fin: f,
                unidirectional,
                headers,
            } => {
                let block = self.block(headers)?;
                let flags = fin(*f)
                    | if *unidirectional {
                        FLAG_UNIDIRECTIONAL
                    } else {
                        0
                    };
                control_head(out, SYN_STREAM, flags, 10 + block.len());
                out.put_u32(id & 0x7FFF_FFFF);
                out.put_u32(associated & 0x7FFF_FFFF);
                out.put_u8((priority & 0x07) << 5);
                out.put_u8(0);
                out.put_slice(&block);
            }
            Frame::SynReply {
                id,
                fin: f,
                headers,
            } => {
                let block = self.block(headers)?;
                control_head(out, SYN_REPLY, fin(*f), 4 + block.len());
                out.put_u32(id & 0x7FFF_FFFF);
                out.put_slice(&block);
            }
            Frame::Headers {
                id,
                fin: f,
                headers,
            } => {
                let block = self.block(headers)?;
                control_head(out, HEADERS, fin(*f), 4 + block.len());
                out.put_u32(id & 0x7FFF_FFFF);
                out.put_slice(&block);
            }
            Frame::RstStream { id, status } => {
                control_head(out, RST_STREAM, 0, 8);
                out.put_u32(id & 0x7FFF_FFFF);
                out.put_u32(*status);
            }
            Frame::Settings(entries) => {
                control_head(out, SETTINGS, 0, 4 + 8 * entries.len());
                out.put_u32(entries.len() as u32);
                for s in entries {
                    out.put_u32((u32::from(s.flags) << 24) | (s.id & 0xFF_FFFF));
                    out.put_u32(s.value);
                }
            }
            Frame::Ping(id) => {
                control_head(out, PING, 0, 4);
                out.put_u32(*id);
            }
            Frame::GoAway { last_good, status } => {
                control_head(out, GOAWAY, 0, 8);
                out.put_u32(last_good & 0x7FFF_FFFF);
                out.put_u32(*status);
            }
            Frame::WindowUpdate { id, delta } => {
                control_head(out, WINDOW_UPDATE, 0, 8);
                out.put_u32(id & 0x7FFF_FFFF);
                out.put_u32(delta & 0x7FFF_FFFF);
            }
            Frame::Data { id, fin: f, data } => {
                if data.len() > MAX_LENGTH {
                    return Err(FrameError::TooLarge {
                        what: "DATA frame",
                        len: data.len(),
                        max: MAX_LENGTH,
                    });
                }
                out.put_u32(id & 0x7FFF_FFFF);
                out.put_u32((u32::from(fin(*f)) << 24) | data.len() as u32);
                out.put_slice(data);
            }
        }
        Ok(())
    }

    fn block(&mut self, headers: &Headers) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::new();
        self.deflate.compress(&headers.encode(), &mut out)?;
        if out.len() + 10 > MAX_LENGTH {
            return Err(FrameError::TooLarge {
                what: "header block",
                len: out.len(),
                max: MAX_LENGTH,
            });
        }
        Ok(out)
    }
}

/// The rest of a DATA frame whose first bytes were handed on.
struct DataLeft {
    id: u32,
    left: usize,
    fin: bool,
}

/// Reads frames; header blocks go through the peer's one zlib stream.
pub struct Decoder {
    inflate: HeaderInflate,
    limits: Limits,
    data: Option<DataLeft>,
}

fn u32_at(p: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Decoder {
            inflate: HeaderInflate::new(),
            limits,
            data: None,
        }
    }

    /// The next frame (or piece of DATA) at the front of `buf`, taken off it; `None` until more
    /// bytes arrive. An error leaves the connection unreadable: the caller ends it.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        loop {
            if let Some(d) = &mut self.data {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = d.left.min(buf.len());
                let data = buf.split_to(n).freeze();
                d.left -= n;
                let (id, fin) = (d.id, d.fin && d.left == 0);
                if d.left == 0 {
                    self.data = None;
                }
                return Ok(Some(Frame::Data { id, fin, data }));
            }
            if buf.len() < 8 {
                return Ok(None);
            }
            let first = u32_at(buf, 0);
            let flags = buf[4];
            let len = (u32_at(buf, 4) & 0xFF_FFFF) as usize;
            if first & 0x8000_0000 == 0 {
                let id = first & 0x7FFF_FFFF;
                if id == 0 {
                    return Err(FrameError::Malformed("DATA for stream 0"));
                }
                buf.advance(8);
                let fin = flags & FLAG_FIN != 0;
                if len == 0 {
                    return Ok(Some(Frame::Data {
                        id,
                        fin,
                        data: Bytes::new(),
                    }));
                }
                self.data = Some(DataLeft { id, left: len, fin });
                continue;
            }
            let version = ((first >> 16) & 0x7FFF) as u16;
            let kind = (first & 0xFFFF) as u16;
            if len > self.limits.max_control {
                return Err(FrameError::TooLarge {
                    what: "control frame",
                    len,
                    max: self.limits.max_control,
                });
            }
            if buf.len() < 8 + len {
                buf.reserve(8 + len - buf.len());
                return Ok(None);
            }
            buf.advance(8);
            let payload = buf.split_to(len);
            if version != VERSION {
                return Err(FrameError::Version(version));
            }
            if let Some(f) = self.control(kind, flags, &payload)? {
                return Ok(Some(f));
            }
        }
    }

    fn headers(&mut self, block: &[u8]) -> Result<Headers, FrameError> {
        let raw = self
            .inflate
            .decompress(block, self.limits.max_header_block)?;
        Headers::decode(&raw)
    }

    /// A control frame's payload read; `None` for a type this side does not know (ignored, as
    /// the protocol asks).
    fn control(&mut self, kind: u16, flags: u8, p: &[u8]) -> Result<Option<Frame>, FrameError> {
        let need = |n: usize, what: &'static str| {
            if p.len() < n {
                Err(FrameError::Malformed(what))
            } else {
                Ok(())
            }
        };
        let fin = flags & FLAG_FIN != 0;
        Ok(Some(match kind {
            SYN_STREAM => {
                need(10, "a short SYN_STREAM")?;
                Frame::SynStream {
                    id: u32_at(p, 0) & 0x7FFF_FFFF,
                    associated: u32_at(p, 4) & 0x7FFF_FFFF,
                    priority: p[8] >> 5,
                    fin,
                    unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                    headers: self.headers(&p[10..])?,
                }
            }
            SYN_REPLY => {
                need(4, "a short SYN_REPLY")?;
                Frame::SynReply {
                    id: u32_at(p, 0) & 0x7FFF_FFFF,
                    fin,
                    headers: self.headers(&p[4..])?,
                }
            }
            HEADERS => {
                need(4, "a short HEADERS")?;
                Frame::Headers {
                    id: u32_at(p, 0) & 0x7FFF_FFFF,
                    fin,
                    headers: self.headers(&p[4..])?,
                }
            }
            RST_STREAM => {
                need(8, "a short RST_STREAM")?;
                Frame::RstStream {
                    id: u32_at(p, 0) & 0x7FFF_FFFF,
                    status: u32_at(p, 4),
                }
            }
            SETTINGS => {
                need(4, "a short SETTINGS")?;
                let n = u32_at(p, 0) as usize;
                if n > (p.len() - 4) / 8 {
                    return Err(FrameError::Malformed("SETTINGS longer than its frame"));
                }
                Frame::Settings(
                    (0..n)
                        .map(|i| {
                            let at = 4 + 8 * i;
                            let word = u32_at(p, at);
                            Setting {
                                flags: (word >> 24) as u8,
                                id: word & 0xFF_FFFF,
                                value: u32_at(p, at + 4),
                            }
                        })
                        .collect(),
                )
            }
            PING => {
                need(4, "a short PING")?;
                Frame::Ping(u32_at(p, 0))
            }
            GOAWAY => {
                need(4, "a short GOAWAY")?;
                Frame::GoAway {
                    last_good: u32_at(p, 0) & 0x7FFF_FFFF,
                    status: if p.len() >= 8 { u32_at(p, 4) } else { 0 },
                }
            }
            WINDOW_UPDATE => {
                need(8, "a short WINDOW_UPDATE")?;
                Frame::WindowUpdate {
                    id: u32_at(p, 0) & 0x7FFF_FFFF,
                    delta: u32_at(p, 4) & 0x7FFF_FFFF,
                }
            }
            _ => return Ok(None),
        }))
    }
}
