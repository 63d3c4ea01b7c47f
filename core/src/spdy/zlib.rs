//! SPDY/3 header compression: one zlib stream per direction for the whole connection, every
//! header block ended with a sync flush, and the fixed SPDY/3 dictionary as the stream's preset
//! dictionary (`FDICT`, its Adler-32 `0xE3C6A7C2` in the zlib header).
//!
//! The zlib in the tree is miniz_oxide (flate2's pure-Rust backend), which has no preset
//! dictionaries. A preset dictionary is only history the window starts with, so both sides are
//! built on raw deflate: the compressor is primed by compressing the dictionary and throwing its
//! output away (from there on its matches may reach back into it, exactly as after zlib's
//! `deflateSetDictionary`), and the zlib header is written by hand; the decompressor reads the
//! zlib header itself, checks the dictionary's id, and is primed by inflating the dictionary as
//! one stored block. The peer cannot tell: what goes over the wire is byte for byte a zlib
//! stream with the dictionary (Go's `compress/zlib`, Python's `zlib` and our own read it).

use std::sync::OnceLock;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::FrameError;

/// The dictionary's words, each written with its length as four bytes (`200_OK` is "200 OK"),
/// then [`TAIL`]: draft-mbelshe-httpbis-spdy-00 section 2.6.10.1, byte for byte spdystream's
/// `spdy/dictionary.go`.
const WORDS: &str = "options head post put delete trace accept accept-charset accept-encoding \
    accept-language accept-ranges age allow authorization cache-control connection content-base \
    content-encoding content-language content-length content-location content-md5 content-range \
    content-type date etag expect expires from host if-match if-modified-since if-none-match \
    if-range if-unmodified-since last-modified location max-forwards pragma proxy-authenticate \
    proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade \
    user-agent vary via warning www-authenticate method get status 200_OK version HTTP/1.1 url \
    public set-cookie keep-alive origin";
const TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
);

/// The SPDY/3 header dictionary (1423 bytes).
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let mut d = Vec::with_capacity(1423);
        for w in WORDS.split_whitespace() {
            let w = w.replace('_', " ");
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// Adler-32 (RFC 1950), the id a zlib header gives its preset dictionary.
pub fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5552 bytes is the most that cannot overflow `b` before the modulo (zlib's NMAX).
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// The zlib header Go's `zlib.NewWriterLevelDict(BestCompression, dict)` writes: deflate with a
/// 32 KiB window, level "best", `FDICT`, then the dictionary's Adler-32.
fn zlib_header() -> [u8; 6] {
    let id = adler32(dictionary()).to_be_bytes();
    [0x78, 0xF9, id[0], id[1], id[2], id[3]]
}

/// Output grows by this much at a time while a block is (de)compressed.
const STEP: usize = 4096;

/// Runs `input` through `c` with `flush` until all of it is taken and the output is complete.
fn deflate_all(
    c: &mut Compress,
    input: &[u8],
    out: &mut Vec<u8>,
    flush: FlushCompress,
) -> Result<(), FrameError> {
    // Room for all of it at once (deflate grows incompressible input by a few bytes a block),
    // so that one call takes it and flushes; another would add a second, empty, flush.
    out.reserve(input.len() + input.len() / 64 + 128);
    let mut at = 0;
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(STEP);
        }
        let before = c.total_in();
        c.compress_vec(&input[at..], out, flush)
            .map_err(|e| FrameError::Compression(e.to_string()))?;
        at += (c.total_in() - before) as usize;
        // Done when all input is in and the flush left room to spare (nothing more is pending).
        if at == input.len() && out.capacity() - out.len() >= 64 {
            return Ok(());
        }
    }
}

/// One direction's compressor: every header block this side sends, in the order sent.
pub struct HeaderDeflate {
    c: Compress,
    header_sent: bool,
}

impl Default for HeaderDeflate {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderDeflate {
    pub fn new() -> Self {
        let mut c = Compress::new(Compression::best(), false);
        let mut primed = Vec::with_capacity(2 * 1024);
        // Cannot fail: a fresh compressor taking bytes.
        let _ = deflate_all(&mut c, dictionary(), &mut primed, FlushCompress::Sync);
        HeaderDeflate {
            c,
            header_sent: false,
        }
    }

    /// Appends `block` compressed, ended with a sync flush, to `out`.
    pub fn compress(&mut self, block: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        if !self.header_sent {
            out.extend_from_slice(&zlib_header());
            self.header_sent = true;
        }
        deflate_all(&mut self.c, block, out, FlushCompress::Sync)
    }
}

/// One direction's decompressor: every header block the peer sends, in the order received.
pub struct HeaderInflate {
    d: Decompress,
    /// The zlib header, until it is whole.
    head: Vec<u8>,
    started: bool,
}

impl Default for HeaderInflate {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderInflate {
    pub fn new() -> Self {
        let dict = dictionary();
        let mut d = Decompress::new(false);
        // The dictionary as one stored, not final, block: BFINAL 0, BTYPE 00, LEN, NLEN.
        let len = (dict.len() as u16).to_le_bytes();
        let nlen = (!(dict.len() as u16)).to_le_bytes();
        let mut stored = Vec::with_capacity(dict.len() + 5);
        stored.extend_from_slice(&[0, len[0], len[1], nlen[0], nlen[1]]);
        stored.extend_from_slice(dict);
        let mut out = Vec::with_capacity(dict.len() + STEP);
        // Cannot fail: a stored block of known bytes.
        let _ = d.decompress_vec(&stored, &mut out, FlushDecompress::Sync);
        HeaderInflate {
            d,
            head: Vec::new(),
            started: false,
        }
    }

    /// The uncompressed header block `block` carries; more than `max` bytes of it is refused.
    pub fn decompress(&mut self, block: &[u8], max: usize) -> Result<Vec<u8>, FrameError> {
        let mut input = block;
        if !self.started {
            input = self.read_zlib_header(input)?;
        }
        let mut out = Vec::with_capacity(STEP.min(max + 1));
        let mut at = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(STEP);
            }
            let (in_before, out_before) = (self.d.total_in(), out.len());
            let status = self
                .d
                .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
                .map_err(|e| FrameError::Compression(e.to_string()))?;
            at += (self.d.total_in() - in_before) as usize;
            if out.len() > max {
                return Err(FrameError::TooLarge {
                    what: "header block",
                    len: out.len(),
                    max,
                });
            }
            let stuck = self.d.total_in() == in_before && out.len() == out_before;
            let done = at == input.len() && out.len() < out.capacity();
            if done || status == Status::StreamEnd || (stuck && at == input.len()) {
                return Ok(out);
            }
            if stuck {
                return Err(FrameError::Compression(
                    "the header block does not continue the zlib stream".into(),
                ));
            }
        }
    }

    /// Takes the zlib header off the front of the first block(s): deflate, a window zlib
    /// allows, a correct check, and the SPDY dictionary if one is named.
    fn read_zlib_header<'a>(&mut self, input: &'a [u8]) -> Result<&'a [u8], FrameError> {
        let bad = |why: &str| FrameError::Compression(format!("zlib header: {why}"));
        let mut input = input;
        while !self.started && !input.is_empty() {
            let need = if self.head.len() >= 2 && self.head[1] & 0x20 != 0 {
                6
            } else {
                2
            };
            let n = (need - self.head.len()).min(input.len());
            self.head.extend_from_slice(&input[..n]);
            input = &input[n..];
            if self.head.len() < need {
                continue;
            }
            let (cmf, flg) = (self.head[0], self.head[1]);
            if cmf & 0x0F != 8 || cmf >> 4 > 7 {
                return Err(bad("not deflate with a window zlib allows"));
            }
            if (u16::from(cmf) * 256 + u16::from(flg)) % 31 != 0 {
                return Err(bad("its check bits are wrong"));
            }
            if flg & 0x20 != 0 && need == 2 {
                continue; // the dictionary's id follows
            }
            if need == 6 {
                let id =
                    u32::from_be_bytes([self.head[2], self.head[3], self.head[4], self.head[5]]);
                if id != adler32(dictionary()) {
                    return Err(bad("a dictionary other than SPDY/3's"));
                }
            }
            self.started = true;
        }
        Ok(input)
    }
}
