//! The reverse tunnel: one long-lived TLS connection from an agent to the proxy, multiplexed
//! with yamux so that every session is its own stream (with its own flow control) and no server
//! ever listens for inbound connections. The proxy opens streams; the agent accepts them. The
//! agent also opens one stream of its own for heartbeats and label updates.
//!
//! This module owns only the multiplexing; who may open a tunnel is decided by the TLS handshake
//! (the agent's host certificate) before a connection gets here.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

/// One stream of a tunnel: a plain bidirectional byte stream. A stream the proxy opened holds
/// one of its tunnel's [`PROXY_OPENS`] places until it is dropped.
pub struct TunnelStream {
    io: Compat<yamux::Stream>,
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl TunnelStream {
    fn new(s: yamux::Stream, place: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        TunnelStream {
            io: s.compat(),
            _place: place,
        }
    }
}

impl std::fmt::Debug for TunnelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelStream").finish_non_exhaustive()
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The streams a proxy keeps open through one tunnel at most (sessions, kube requests and
/// watches, port forwards), counted by their handles: a stream holds its place until the
/// proxy's side of it is dropped, which for a session is when both sides have closed it. One
/// more is refused on its own ([`OpenError::Full`]); the tunnel and everything on it go on.
pub const PROXY_OPENS: usize = 1024;
/// yamux's own limit on a tunnel's streams, on both sides: far above [`PROXY_OPENS`], because
/// one stream past it ends the whole connection (an open past it on the proxy's side as much
/// as an inbound one on the agent's), and yamux counts a stream for a while after its handle
/// is gone (the agent until its own side lets go; the proxy until its connection task has
/// sent the close).
pub const YAMUX_STREAMS: usize = 4 * PROXY_OPENS;

/// Which side of the tunnel this is.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    /// The proxy: opens session streams.
    Proxy,
    /// The agent: accepts session streams.
    Agent,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("tunnel closed")]
    Closed,
    /// As many streams are open through the tunnel as it carries. The one wording the SSH and
    /// kube doors both show, after the node's or cluster's name.
    #[error("{0} streams are open through the tunnel, the most it carries")]
    Full(usize),
}

type Opened = Result<TunnelStream, OpenError>;

/// Opens streams on a running tunnel; cheap to clone.
#[derive(Clone, Debug)]
pub struct Opener {
    tx: mpsc::Sender<(oneshot::Sender<Opened>, tokio::sync::OwnedSemaphorePermit)>,
    places: std::sync::Arc<tokio::sync::Semaphore>,
    most: usize,
}

impl Opener {
    /// A new stream, or at once [`OpenError::Full`] when the tunnel carries as many as it may.
    pub async fn open(&self) -> Result<TunnelStream, OpenError> {
        if self.tx.is_closed() {
            return Err(OpenError::Closed);
        }
        let place = self
            .places
            .clone()
            .try_acquire_owned()
            .map_err(|_| OpenError::Full(self.most))?;
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((tx, place))
            .await
            .map_err(|_| OpenError::Closed)?;
        rx.await.map_err(|_| OpenError::Closed)?
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// yamux writes each frame as two writes, its 12-byte header and then its body; over TLS each
/// write would be a record and a segment of its own, and the peer woken for each. This holds a
/// short write (a header) back and gives it to the next write together with that one (the body,
/// one vectored write: one record), or to the flush that yamux makes after every frame (a frame
/// without a body). It holds at most [`HELD`] bytes, inline: an idle tunnel costs no buffer
/// (a 16 KiB one per tunnel was ~170 MiB at 10,000 idle tunnels).
struct WholeFrames<T> {
    io: T,
    head: [u8; HELD],
    held: usize,
}

/// The most held back: a yamux header (12 bytes), with room to spare.
const HELD: usize = 16;

impl<T> WholeFrames<T> {
    fn new(io: T) -> Self {
        WholeFrames {
            io,
            head: [0; HELD],
            held: 0,
        }
    }
}

impl<T: AsyncWrite + Unpin> WholeFrames<T> {
    /// Writes out what is held.
    fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.held > 0 {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.head[..self.held]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.head.copy_within(n..self.held, 0);
            self.held -= n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WholeFrames<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if this.held == 0 {
                if buf.len() <= HELD {
                    this.head[..buf.len()].copy_from_slice(buf);
                    this.held = buf.len();
                    return Poll::Ready(Ok(buf.len()));
                }
                return Pin::new(&mut this.io).poll_write(cx, buf);
            }
            let held = this.held;
            let n =
                ready!(Pin::new(&mut this.io).poll_write_vectored(
                    cx,
                    &[IoSlice::new(&this.head[..held]), IoSlice::new(buf)]
                ))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            if n < held {
                this.head.copy_within(n..held, 0);
                this.held = held - n;
                continue;
            }
            this.held = 0;
            if n > held || buf.is_empty() {
                return Poll::Ready(Ok(n - held));
            }
            // Exactly what was held went out: `buf` is still to go.
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WholeFrames<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

/// yamux's limit on the streams of one connection: what this side opens and what it accepts
/// together (one past it ends the whole connection).
fn config(streams: usize) -> yamux::Config {
    let mut c = yamux::Config::default();
    // Set first: yamux asserts room for every stream's first 256 KiB when the stream limit is set.
    c.set_max_connection_receive_window(Some(receive_window(streams)));
    c.set_max_num_streams(streams);
    c
}

/// Every stream's first window (yamux's 256 KiB) and [`WINDOW_GROWTH`] above them.
fn receive_window(streams: usize) -> usize {
    streams * 256 * 1024 + WINDOW_GROWTH
}

/// What yamux lets the streams of one connection grow their windows by, together, beyond their
/// first 256 KiB each (a stream up to 16 MiB): a bulk copy over a long round trip needs more
/// than 256 KiB in flight. yamux gives only what the connection's window has above every
/// stream's first: a stream limit raised without it would hold each stream at 256 KiB a round
/// trip.
const WINDOW_GROWTH: usize = 768 * 1024 * 1024;

/// Runs the multiplexer over `io` until the connection ends. Returns the opener and the streams
/// the other side opens; the tunnel is gone when the receiver yields `None`.
pub fn run<T>(io: T, side: Side) -> (Opener, mpsc::Receiver<TunnelStream>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    run_limited(io, side, PROXY_OPENS, YAMUX_STREAMS)
}

/// [`run`] with this side opening at most `opens` streams (counted by live handles) and yamux
/// counting at most `streams` on each side.
fn run_limited<T>(
    io: T,
    side: Side,
    opens: usize,
    streams: usize,
) -> (Opener, mpsc::Receiver<TunnelStream>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mode = match side {
        Side::Proxy => yamux::Mode::Client,
        Side::Agent => yamux::Mode::Server,
    };
    // Each frame to TLS whole (`WholeFrames`): yamux flushes after every frame it writes.
    let io = WholeFrames::new(io);
    let mut conn = yamux::Connection::new(io.compat(), config(streams), mode);
    let (open_tx, mut open_rx) = mpsc::channel(64);
    let (in_tx, in_rx) = mpsc::channel::<TunnelStream>(64);
    tokio::spawn(async move {
        let mut waiting: VecDeque<(oneshot::Sender<Opened>, tokio::sync::OwnedSemaphorePermit)> =
            VecDeque::new();
        let mut requests_open = true;
        let result = std::future::poll_fn(|cx| {
            while requests_open {
                match open_rx.poll_recv(cx) {
                    Poll::Ready(Some(r)) => waiting.push_back(r),
                    Poll::Ready(None) => requests_open = false,
                    Poll::Pending => break,
                }
            }
            loop {
                // Inbound first: polling the connection is also where yamux forgets the
                // streams whose handles are gone, before an open is counted against them.
                loop {
                    match conn.poll_next_inbound(cx) {
                        Poll::Ready(Some(Ok(s))) => {
                            // A peer that opens more streams than we consume loses the extras.
                            let _ = in_tx.try_send(TunnelStream::new(s, None));
                        }
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                        Poll::Ready(None) => return Poll::Ready(Ok(())),
                        Poll::Pending => break,
                    }
                }
                let mut opened = false;
                while !waiting.is_empty() {
                    match conn.poll_new_outbound(cx) {
                        Poll::Ready(Ok(s)) => {
                            opened = true;
                            if let Some((w, place)) = waiting.pop_front() {
                                let _ = w.send(Ok(TunnelStream::new(s, Some(place))));
                            }
                        }
                        // Past yamux's own count (which the places keep far from): yamux has
                        // already ended the connection.
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => break,
                    }
                }
                // A stream opened since the connection was last polled is polled with it, so
                // that its first write wakes the connection.
                if !opened {
                    return Poll::Pending;
                }
            }
        })
        .await;
        match result {
            Err(e @ yamux::ConnectionError::TooManyStreams) => {
                tracing::warn!(error = %e, "tunnel ended: past yamux's stream limit")
            }
            Err(e) => tracing::debug!(error = %e, "tunnel ended"),
            Ok(()) => {}
        }
        for (w, _) in waiting {
            let _ = w.send(Err(OpenError::Closed));
        }
    });
    let opener = Opener {
        tx: open_tx,
        places: std::sync::Arc::new(tokio::sync::Semaphore::new(opens)),
        most: opens,
    };
    (opener, in_rx)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A destination that keeps each write it is given as one piece (a vectored one joined),
    /// taking at most `most` bytes a write, as a socket may.
    #[derive(Default)]
    struct Writes {
        got: Vec<Vec<u8>>,
        most: usize,
        flushes: usize,
    }

    impl AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            let n = buf.len().min(this.most);
            this.got.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = all.len().min(this.most);
            this.got.push(all[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_frame_reaches_the_connection_as_one_write_and_nothing_is_left_held() {
        let header = [7u8; 12];
        let body = vec![9u8; 3000];
        let mut w = WholeFrames::new(Writes {
            most: usize::MAX,
            ..Writes::default()
        });
        // A frame with a body: one write of both.
        assert_eq!(w.write(&header).await.ok(), Some(12));
        assert!(w.io.got.is_empty(), "the header waits for its body");
        assert_eq!(w.write(&body).await.ok(), Some(3000));
        w.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.io.got, vec![[&header[..], &body[..]].concat()]);
        // A frame without a body (a window update): out at the flush, whole.
        w.write_all(&header).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.io.got.len(), 1);
        w.flush().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.io.got.len(), 2);
        assert_eq!(w.io.got[1], header.to_vec());
        assert_eq!(w.io.flushes, 2);

        // A connection that takes a few bytes at a time: every byte goes, in order.
        let mut w = WholeFrames::new(Writes {
            most: 5,
            ..Writes::default()
        });
        w.write_all(&header).await.unwrap_or_else(|e| panic!("{e}"));
        w.write_all(&body[..40])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        w.write_all(&header).await.unwrap_or_else(|e| panic!("{e}"));
        w.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        let sent: Vec<u8> = w.io.got.concat();
        assert_eq!(sent, [&header[..], &body[..40], &header[..]].concat());
    }

    #[tokio::test]
    async fn an_open_past_the_limit_is_refused_alone_and_the_tunnel_goes_on() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (proxy, _proxy_in) = run_limited(a, Side::Proxy, 4, 16);
        let (_agent, mut agent_in) = run_limited(b, Side::Agent, 4, 16);
        let echo = tokio::spawn(async move {
            while let Some(mut s) = agent_in.recv().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let mut open = Vec::new();
        for _ in 0..4 {
            match proxy.open().await {
                Ok(s) => open.push(s),
                Err(e) => panic!("{e}"),
            }
        }
        let past = proxy.open().await;
        assert!(matches!(past, Err(OpenError::Full(4))), "{past:?}");
        assert_eq!(
            past.map(|_| ()).map_err(|e| e.to_string()),
            Err("4 streams are open through the tunnel, the most it carries".to_string())
        );
        // Every stream opened before still carries, both ways.
        for (i, s) in open.iter_mut().enumerate() {
            let sent = [u8::try_from(i).unwrap_or(0); 3];
            assert!(s.write_all(&sent).await.is_ok());
            let mut got = [0u8; 3];
            assert!(s.read_exact(&mut got).await.is_ok());
            assert_eq!(got, sent);
        }
        // A stream let go of makes room for the next.
        drop(open.pop());
        let next = proxy.open().await;
        assert!(next.is_ok(), "{next:?}");
        assert!(!proxy.is_closed());
        drop(echo);
    }

    #[test]
    fn streams_can_grow_their_windows_at_every_stream_limit() {
        for streams in [PROXY_OPENS, YAMUX_STREAMS] {
            // yamux's own invariant (it asserts it), and room above it for growth.
            assert!(receive_window(streams) >= streams * 256 * 1024 + 512 * 1024 * 1024);
            let _ = config(streams);
        }
    }

    #[tokio::test]
    async fn a_full_tunnel_that_ends_says_closed_not_busy() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (proxy, _proxy_in) = run_limited(a, Side::Proxy, 1, 16);
        let held = proxy.open().await;
        assert!(held.is_ok(), "{held:?}");
        assert!(matches!(proxy.open().await, Err(OpenError::Full(1))));
        // The agent's connection goes away while the one place is held.
        drop(b);
        for _ in 0..200 {
            if proxy.is_closed() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let after = proxy.open().await;
        assert!(matches!(after, Err(OpenError::Closed)), "{after:?}");
    }

    #[tokio::test]
    async fn streams_in_both_directions_and_closure() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (proxy, _proxy_in) = run(a, Side::Proxy);
        let (_agent, mut agent_in) = run(b, Side::Agent);
        let echo = tokio::spawn(async move {
            while let Some(mut s) = agent_in.recv().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
        });
        let mut handles = Vec::new();
        for i in 0..8u8 {
            let proxy = proxy.clone();
            handles.push(tokio::spawn(async move {
                let mut s = proxy.open().await.map_err(|e| e.to_string())?;
                let data = vec![i; 300_000];
                let (mut r, mut w) = tokio::io::split(&mut s);
                let send = async {
                    w.write_all(&data).await?;
                    w.flush().await
                };
                let mut got = vec![0u8; data.len()];
                let recv = r.read_exact(&mut got);
                let (a, b) = tokio::join!(send, recv);
                a.map_err(|e| e.to_string())?;
                b.map_err(|e| e.to_string())?;
                if got != data {
                    return Err("data differs".to_string());
                }
                Ok::<_, String>(())
            }));
        }
        for h in handles {
            h.await
                .map_err(|e| e.to_string())
                .and_then(|r| r)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        drop(echo);
    }
}

#[cfg(test)]
mod bulk {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// 32 MiB echoed through one stream, both directions at once, over TCP loopback.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_echo_both_ways() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let server = tokio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap_or_else(|e| panic!("{e}"));
            let (_o, mut inbound) = run(tcp, Side::Agent);
            let s = inbound.recv().await.unwrap_or_else(|| panic!("no stream"));
            // As every russh transport here is used: through `flow::Decoupled`.
            let (mut r, mut w) = tokio::io::split(crate::flow::Decoupled::new(s));
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                let n = r.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                if w.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = w.shutdown().await;
        });
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (opener, _in) = run(tcp, Side::Proxy);
        let s = opener.open().await.unwrap_or_else(|e| panic!("{e}"));
        let (mut r, mut w) = tokio::io::split(crate::flow::Decoupled::new(s));
        let total = 32 * 1024 * 1024;
        let writer = tokio::spawn(async move {
            let chunk = vec![7u8; 32 * 1024];
            for _ in 0..total / chunk.len() {
                w.write_all(&chunk).await.unwrap_or_else(|e| panic!("{e}"));
            }
            w
        });
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        let res = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while got < total {
                let n = r.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                got += n;
            }
        })
        .await;
        assert!(res.is_ok(), "stalled after {got} bytes");
        assert_eq!(got, total);
        drop(writer);
        drop(server);
    }
}
