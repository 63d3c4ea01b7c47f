//! Which pod ports a `kubectl port-forward` reaches, read off the person's side of the pipe as
//! it passes (never changing or holding a byte of it), for the `kube.port_forward` record.
//! kubectl names the port in each stream it opens (a SYN_STREAM's `port` header), not in the
//! URL: over SPDY/3.1 directly, or (kubectl 1.31 and later) over SPDY tunneled in WebSocket
//! binary messages (`SPDY/3.1+portforward.k8s.io`).
//!
//! Bounded: a control frame is held up to the SPDY decoder's limit, DATA is never held, and a
//! stream that does not read as SPDY ends the watching (the pipe goes on; the record then says
//! only the ports already seen).

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::BytesMut;
use sallyport_core::spdy::{Decoder, Frame, Limits};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The WebSocket subprotocol of SPDY tunneled in WebSocket.
pub const SPDY_IN_WEBSOCKET: &str = "SPDY/3.1+portforward.k8s.io";

/// Ports seen so far; shared with the audit record.
pub type Seen = Arc<Mutex<BTreeSet<u16>>>;

/// How the person's bytes carry SPDY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    Spdy,
    WebSocket,
}

/// Reads the person's side of the pipe.
pub struct Watcher {
    ws: Option<WsFrames>,
    spdy: Decoder,
    buf: BytesMut,
    seen: Seen,
    /// Stopped watching: the bytes did not read as expected.
    gone: bool,
}

impl Watcher {
    pub fn new(carrier: Carrier, seen: Seen) -> Self {
        Watcher {
            ws: (carrier == Carrier::WebSocket).then(WsFrames::default),
            spdy: Decoder::new(Limits::default()),
            buf: BytesMut::new(),
            seen,
            gone: false,
        }
    }

    /// The next bytes the person sent.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.gone {
            return;
        }
        let ok = match &mut self.ws {
            Some(ws) => {
                let mut payload = Vec::new();
                let ok = ws.unwrap(bytes, &mut payload);
                ok && self.spdy(&payload)
            }
            None => self.spdy(bytes),
        };
        if !ok {
            self.gone = true;
            self.buf = BytesMut::new();
        }
    }

    fn spdy(&mut self, bytes: &[u8]) -> bool {
        self.buf.extend_from_slice(bytes);
        loop {
            match self.spdy.decode(&mut self.buf) {
                Ok(Some(Frame::SynStream { headers, .. })) => {
                    if let Some(port) = headers.get("port").and_then(|p| p.parse::<u16>().ok())
                        && let Ok(mut seen) = self.seen.lock()
                    {
                        seen.insert(port);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    }
}

/// WebSocket frames from a client (masked), their data payloads unmasked in order.
#[derive(Default)]
struct WsFrames {
    /// A frame's header being read (at most 14 bytes).
    head: Vec<u8>,
    /// The payload left of the current frame, its mask, where in the mask, and whether it is
    /// data (text, binary, continuation) rather than control.
    left: u64,
    mask: Option<[u8; 4]>,
    at: usize,
    data: bool,
}

impl WsFrames {
    /// Appends the data payload in `bytes` to `out`; `false` when the bytes are not frames.
    fn unwrap(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> bool {
        while !bytes.is_empty() {
            if self.left == 0 {
                self.head.push(bytes[0]);
                bytes = &bytes[1..];
                match self.header() {
                    Ok(true) => self.head.clear(),
                    Ok(false) => {}
                    Err(()) => return false,
                }
                continue;
            }
            let n = usize::try_from(self.left)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            if self.data {
                for &b in &bytes[..n] {
                    let b = match self.mask {
                        Some(m) => b ^ m[self.at % 4],
                        None => b,
                    };
                    self.at += 1;
                    out.push(b);
                }
            }
            self.left -= n as u64;
            bytes = &bytes[n..];
        }
        true
    }

    /// Reads the header in `head` once it is whole: `Ok(true)` then.
    fn header(&mut self) -> Result<bool, ()> {
        let h = &self.head;
        if h.len() < 2 {
            return Ok(false);
        }
        let opcode = h[0] & 0x0F;
        let masked = h[1] & 0x80 != 0;
        let (len, at) = match h[1] & 0x7F {
            126 if h.len() >= 4 => (u64::from(u16::from_be_bytes([h[2], h[3]])), 4),
            127 if h.len() >= 10 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&h[2..10]);
                (u64::from_be_bytes(b), 10)
            }
            126 | 127 => return Ok(false),
            n => (u64::from(n), 2),
        };
        let need = at + if masked { 4 } else { 0 };
        if h.len() < need {
            return Ok(false);
        }
        if !matches!(opcode, 0x0..=0x2 | 0x8..=0xA) {
            return Err(());
        }
        self.mask = masked.then(|| [h[at], h[at + 1], h[at + 2], h[at + 3]]);
        self.at = 0;
        self.data = opcode <= 0x2;
        self.left = len;
        Ok(true)
    }
}

/// The person's side of the pipe, every byte read from it shown to a [`Watcher`] first.
pub struct Watched<T> {
    inner: T,
    watcher: Watcher,
}

impl<T> Watched<T> {
    pub fn new(inner: T, watcher: Watcher) -> Self {
        Watched { inner, watcher }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.watcher.feed(&buf.filled()[before..]);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sallyport_core::spdy::{Encoder, Headers};

    fn syn(encoder: &mut Encoder, id: u32, kind: &str, port: &str) -> Vec<u8> {
        let mut out = BytesMut::new();
        encoder
            .encode(
                &Frame::SynStream {
                    id,
                    associated: 0,
                    priority: 0,
                    fin: false,
                    unidirectional: false,
                    headers: Headers::new()
                        .with("streamtype", kind)
                        .with("port", port)
                        .with("requestid", &id.to_string()),
                },
                &mut out,
            )
            .unwrap();
        out.to_vec()
    }

    fn data(encoder: &mut Encoder, id: u32, n: usize) -> Vec<u8> {
        let mut out = BytesMut::new();
        encoder
            .encode(
                &Frame::Data {
                    id,
                    fin: false,
                    data: bytes::Bytes::from(vec![7u8; n]),
                },
                &mut out,
            )
            .unwrap();
        out.to_vec()
    }

    /// kubectl's streams for two ports, with traffic between, as SPDY bytes.
    fn session() -> Vec<u8> {
        let mut e = Encoder::new();
        let mut s = Vec::new();
        s.extend(syn(&mut e, 1, "error", "80"));
        s.extend(syn(&mut e, 3, "data", "80"));
        s.extend(data(&mut e, 3, 100_000));
        s.extend(syn(&mut e, 5, "error", "8443"));
        s.extend(syn(&mut e, 7, "data", "8443"));
        s.extend(data(&mut e, 7, 10));
        s
    }

    /// `payload` as a client's masked binary WebSocket messages of at most `max` bytes.
    fn ws(payload: &[u8], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, chunk) in payload.chunks(max).enumerate() {
            out.push(0x82);
            let len = chunk.len();
            if len < 126 {
                out.push(0x80 | len as u8);
            } else if len < 65536 {
                out.push(0x80 | 126);
                out.extend((len as u16).to_be_bytes());
            } else {
                out.push(0x80 | 127);
                out.extend((len as u64).to_be_bytes());
            }
            let mask = [1u8, 2, 3, (i % 251) as u8];
            out.extend(mask);
            out.extend(chunk.iter().enumerate().map(|(j, b)| b ^ mask[j % 4]));
            // A ping between messages is no data.
            out.extend([0x89, 0x80, 0, 0, 0, 0]);
        }
        out
    }

    fn seen_after(carrier: Carrier, bytes: &[u8], cut: usize) -> Vec<u16> {
        let seen = Seen::default();
        let mut w = Watcher::new(carrier, seen.clone());
        for piece in bytes.chunks(cut) {
            w.feed(piece);
        }
        seen.lock().unwrap().iter().copied().collect()
    }

    #[test]
    fn ports_are_read_from_spdy_streams_wherever_the_reads_end() {
        let s = session();
        for cut in [1, 7, 4096, s.len()] {
            assert_eq!(
                seen_after(Carrier::Spdy, &s, cut),
                vec![80, 8443],
                "cut {cut}"
            );
        }
    }

    #[test]
    fn and_from_spdy_tunneled_in_websocket_messages() {
        let s = session();
        for max in [3, 125, 200, 70_000] {
            let w = ws(&s, max);
            for cut in [1, 13, 4096] {
                assert_eq!(
                    seen_after(Carrier::WebSocket, &w, cut),
                    vec![80, 8443],
                    "max {max} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn bytes_that_are_not_spdy_stop_the_watching_and_nothing_else() {
        let seen = Seen::default();
        let mut w = Watcher::new(Carrier::Spdy, seen.clone());
        w.feed(b"GET / HTTP/1.1\r\n\r\n");
        w.feed(&session());
        assert!(seen.lock().unwrap().is_empty());
        let mut w = Watcher::new(Carrier::WebSocket, seen.clone());
        w.feed(&[0x83, 0x80, 0, 0, 0, 0]);
        w.feed(&ws(&session(), 100));
        assert!(seen.lock().unwrap().is_empty());
    }
}
