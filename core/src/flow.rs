//! A per-channel inbox between an SSH session loop and the task that consumes its data.
//!
//! russh hands channel data to the handler on the session's only task. A handler that waits for
//! a slow consumer stalls that task — and with it the output path the consumer may itself be
//! waiting on (`cat` both ways deadlocks). So the handler never waits: it queues.
//!
//! What bounds the queue is the channel window. Under russh's own `WindowPolicy::Auto` the window
//! is re-opened as data arrives, so nothing does but a flood cap: a channel whose consumer falls
//! [`HIGH_WATER`] bytes behind is closed ([`inbox`]). Under `WindowPolicy::Consumed` (our patch
//! of russh, `vendor/russh/PATCHES.md`) the window is given back only as the consumer hands
//! bytes on ([`windowed_inbox`]): a slow consumer slows the peer, as between OpenSSH peers, and
//! the queue never holds more than the window — a peer that sends beyond it ignored flow
//! control, and its channel is closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// Bytes a channel whose window russh re-opens by itself ([`inbox`]) may queue before it is
/// closed as a flood. A [`windowed_inbox`] is bounded by its window instead.
pub const HIGH_WATER: usize = 64 * 1024 * 1024;

/// Messages russh may queue for one channel before its session loop waits. An SSH connection
/// carried inside another's channel (ProxyJump) links two session loops; with russh's default of
/// 100, a transfer saturating both directions (`cat` of 32 MiB) fills the queue while each loop
/// waits on the other. Queues are allocated as they fill, so slack costs nothing until used.
pub const CHANNEL_BUFFER: usize = 8192;

/// The channel window between the proxy and OpenSSH (its clients, agentless nodes): the one
/// OpenSSH itself uses (2 MiB). With the 8 MiB that Sallyport's own endpoints use between
/// themselves, OpenSSH's `ssh` let megabytes pile up in its outgoing buffer and spent its time
/// moving them (`perf`: page faults in `memmove`); `ssh -J` pushing 32 MiB through `cat` took
/// 1.35 s at 8 MiB and 0.89 s at 2 MiB.
pub const CLIENT_WINDOW: u32 = 2 * 1024 * 1024;

/// What a session loop hands to a channel's consumer.
#[derive(Debug)]
pub enum Input {
    Data(bytes::Bytes),
    Eof,
    Resize { cols: u32, rows: u32 },
}

/// Tells the session that bytes of a channel were consumed (handed on): under russh's
/// `WindowPolicy::Consumed`, a closure over `Handle::consumed(channel, n)`, which gives them
/// back to the peer as window.
pub type Credit = Arc<dyn Fn(usize) + Send + Sync>;

#[derive(Clone)]
pub struct Sender {
    tx: mpsc::UnboundedSender<Input>,
    queued: Arc<AtomicUsize>,
    /// Data beyond this is refused: [`HIGH_WATER`], or the window the peer was given.
    limit: usize,
}

pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Input>,
    queued: Arc<AtomicUsize>,
    credit: Option<Credit>,
    /// Bytes of the data last handed out, reported consumed at the next [`Receiver::recv`].
    in_hand: usize,
}

/// An inbox for a channel whose window russh re-opens by itself (`WindowPolicy::Auto`): only
/// the flood cap, [`HIGH_WATER`], bounds it.
pub fn inbox() -> (Sender, Receiver) {
    new_inbox(HIGH_WATER, None)
}

/// An inbox for a channel under `WindowPolicy::Consumed` whose peer was given `window` bytes:
/// what its consumer hands on is reported to `credit`, and only that re-opens the window, so a
/// peer that keeps to its window never has more than `window` bytes here. One that sends beyond
/// it ignored flow control: [`Sender::send`] refuses, and the caller closes the channel.
pub fn windowed_inbox(window: u32, credit: Credit) -> (Sender, Receiver) {
    new_inbox(window as usize, Some(credit))
}

fn new_inbox(limit: usize, credit: Option<Credit>) -> (Sender, Receiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Sender {
            tx,
            queued: queued.clone(),
            limit,
        },
        Receiver {
            rx,
            queued,
            credit,
            in_hand: 0,
        },
    )
}

impl Sender {
    /// Queues `input` without waiting. Returns false when the consumer is gone or the data
    /// would take the queue past its limit ([`HIGH_WATER`] for a flood; the window for a
    /// [`windowed_inbox`], which a peer keeping to flow control never reaches): the caller
    /// closes the channel.
    pub async fn send(&self, input: Input) -> bool {
        if let Input::Data(d) = &input {
            let queued = self.queued.fetch_add(d.len(), Ordering::AcqRel);
            if queued.saturating_add(d.len()) > self.limit {
                self.queued.fetch_sub(d.len(), Ordering::AcqRel);
                return false;
            }
        }
        self.tx.send(input).is_ok()
    }

    /// Bytes queued and not yet taken by the consumer.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

impl Receiver {
    /// The next input. The data the previous call handed out is reported consumed first (to a
    /// [`windowed_inbox`]'s credit): a consumer asks for more only once it has written the last
    /// on, so what it holds plus what waits here stays within the window, and its loop needs
    /// nothing more than `while let Some(i) = rx.recv().await { write i on }`.
    pub async fn recv(&mut self) -> Option<Input> {
        self.report();
        let item = self.rx.recv().await?;
        if let Input::Data(d) = &item {
            self.queued.fetch_sub(d.len(), Ordering::AcqRel);
            self.in_hand = d.len();
        }
        Some(item)
    }

    fn report(&mut self) {
        let n = std::mem::take(&mut self.in_hand);
        if n > 0
            && let Some(credit) = &self.credit
        {
            credit(n);
        }
    }
}

/// The credit for channel `channel` of a russh server session: what its consumer hands on is
/// given back to the client as window (`Handle::consumed`; nothing under `WindowPolicy::Auto`).
pub fn server_credit(handle: russh::server::Handle, channel: russh::ChannelId) -> Credit {
    Arc::new(move |n| {
        // A session that has ended has no window left to re-open.
        let _ = handle.consumed(channel, n);
    })
}

/// The credit for channel `channel` of a russh client connection (`Handle::consumed`).
pub fn client_credit<H: russh::client::Handler + 'static>(
    handle: Arc<russh::client::Handle<H>>,
    channel: russh::ChannelId,
) -> Credit
where
    russh::client::Handle<H>: Send + Sync,
{
    Arc::new(move |n| {
        let _ = handle.consumed(channel, n);
    })
}

/// A channel's byte stream (russh's `Channel::into_stream`) under `WindowPolicy::Consumed`:
/// each read first reports the bytes the previous read returned, as [`Receiver::recv`] does,
/// so a relay (`splice`) that reads again only once it has written the last chunk on re-opens
/// the peer's window at the pace of its destination. Writes pass through.
pub struct Credited<S> {
    inner: S,
    credit: Credit,
    in_hand: usize,
}

impl<S> Credited<S> {
    pub fn new(inner: S, credit: Credit) -> Self {
        Credited {
            inner,
            credit,
            in_hand: 0,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Credited<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let done = std::mem::take(&mut this.in_hand);
        if done > 0 {
            (this.credit)(done);
        }
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            this.in_hand = buf.filled().len() - before;
        }
        polled
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Credited<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A transport whose writes do not wait below its queue's bound: one task of its own owns the
/// real stream, reading it into a small queue and writing to it from a bounded one.
///
/// russh reads and writes its transport on one task. When both peers of a connection are russh
/// (agent ↔ proxy over the tunnel, the inner connections of ProxyJump, `sally ssh`) and both
/// directions are saturated, each can block writing while the other blocks writing too, and
/// neither reads again. Decoupling the writes removes that cycle. What is queued is what this
/// side produced, which the peer's channel windows bound (and, under russh's `Auto` windows,
/// its inboxes' flood cap, [`HIGH_WATER`]).
///
/// Both directions are driven by the same task on purpose: a yamux stream shares one command
/// queue between its reads (window updates) and its writes, and parks only one waiting task on
/// it, so reading and writing it from two tasks loses wake-ups and stalls.
pub struct Decoupled {
    rx: mpsc::Receiver<bytes::Bytes>,
    pending: bytes::Bytes,
    tx: Option<mpsc::UnboundedSender<bytes::Bytes>>,
    /// Bytes that may still be queued for writing ([`WRITE_QUEUE`] in all); the writing task
    /// gives them back as it writes.
    room: tokio_util::sync::PollSemaphore,
    /// The most one write takes at a time (a quarter of the queue).
    chunk: usize,
}

/// The most a [`Decoupled`] queues for writing before its writer waits. Peers that keep to the
/// windows they advertise never come near it (what is queued is bounded by their channels'
/// windows); a peer that advertises huge windows and stops reading stalls only its own
/// connection here instead of growing the queue without bound.
pub const WRITE_QUEUE: usize = 64 * 1024 * 1024;

/// The write queue of a connection whose peer is one person's client: the proxy's SSH door and
/// the connection each ProxyJump carries inside it. The client chooses its channels' windows;
/// one that advertises huge ones and stops reading would otherwise park [`WRITE_QUEUE`] here
/// per connection and per jump. What waits here is what the client's windows allow and its
/// reading has not yet taken: an OpenSSH client (2 MiB windows) that reads keeps little queued,
/// a `sally` download (8 MiB windows) may fill it, and then waits on its own reading, as it
/// should. Four of OpenSSH's windows.
///
/// Below [`WRITE_QUEUE`] a writer can wait, so two russh peers can no longer rule out both
/// blocking on writes by this queue alone: it holds because the client's side cannot block
/// writing (OpenSSH never does; `sally`'s transport is itself a [`Decoupled`] of
/// [`WRITE_QUEUE`], which its uploads, bounded by the door's 2 MiB windows, never fill).
pub const CLIENT_WRITE_QUEUE: usize = 4 * CLIENT_WINDOW as usize;

impl Decoupled {
    pub fn new<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static>(
        stream: S,
    ) -> Self {
        Self::with_queue(stream, WRITE_QUEUE)
    }

    /// As [`Decoupled::new`], queueing at most `queue` bytes for writing (at least 64 KiB).
    pub fn with_queue<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static>(
        stream: S,
        queue: usize,
    ) -> Self {
        let queue = queue.max(64 * 1024);
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<bytes::Bytes>();
        let (in_tx, in_rx) = mpsc::channel::<bytes::Bytes>(16);
        let room = Arc::new(tokio::sync::Semaphore::new(queue));
        let given_back = room.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut r, mut w) = tokio::io::split(stream);
            let reading = async move {
                // Read straight into the buffer that is handed on (no copy), a fresh one once
                // a quarter of it is left. It is zeroed once when made rather than left
                // uninitialized: a futures-io stream (yamux behind `Compat`) would otherwise
                // zero all the spare room again on every read. The first is 16 KiB (most streams
                // carry a session's few KiB); a read that fills what it was given moves the
                // stream to 64 KiB buffers.
                let mut buf = bytes::BytesMut::new();
                let mut size = 16 * 1024;
                loop {
                    if buf.len() < size / 4 {
                        buf = bytes::BytesMut::zeroed(size);
                    }
                    let n = match r.read(&mut buf[..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if n == buf.len() {
                        size = 64 * 1024;
                    }
                    if in_tx.send(buf.split_to(n).freeze()).await.is_err() {
                        break;
                    }
                }
            };
            let writing = async move {
                let mut chunks: Vec<bytes::Bytes> = Vec::new();
                while let Some(chunk) = out_rx.recv().await {
                    // What is already queued goes in the same vectored write, uncopied.
                    let mut queued = chunk.len();
                    chunks.push(chunk);
                    while queued < 256 * 1024 {
                        match out_rx.try_recv() {
                            Ok(more) => {
                                queued += more.len();
                                chunks.push(more);
                            }
                            Err(_) => break,
                        }
                    }
                    if write_all_vectored(&mut w, &mut chunks).await.is_err()
                        || w.flush().await.is_err()
                    {
                        given_back.close();
                        return;
                    }
                    given_back.add_permits(queued);
                }
                let _ = w.shutdown().await;
            };
            tokio::join!(reading, writing);
        });
        Decoupled {
            rx: in_rx,
            pending: bytes::Bytes::new(),
            tx: Some(out_tx),
            room: tokio_util::sync::PollSemaphore::new(room),
            chunk: queue / 4,
        }
    }
}

/// Writes every chunk, in order, with as few calls as the stream allows (`writev` on a socket),
/// and empties `chunks`.
async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    chunks: &mut Vec<bytes::Bytes>,
) -> std::io::Result<()> {
    use bytes::Buf;
    use tokio::io::AsyncWriteExt;
    let mut first = 0;
    while first < chunks.len() {
        let slices: Vec<std::io::IoSlice<'_>> = chunks[first..]
            .iter()
            .take(64)
            .map(|c| std::io::IoSlice::new(c))
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(c) = chunks.get_mut(first) else {
                break;
            };
            let take = n.min(c.len());
            c.advance(take);
            n -= take;
            if c.is_empty() {
                first += 1;
            }
        }
        while first < chunks.len() && chunks[first].is_empty() {
            first += 1;
        }
    }
    chunks.clear();
    Ok(())
}

impl tokio::io::AsyncRead for Decoupled {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.pending.is_empty() {
            match self.rx.poll_recv(cx) {
                std::task::Poll::Ready(Some(b)) => self.pending = b,
                std::task::Poll::Ready(None) => return std::task::Poll::Ready(Ok(())),
                std::task::Poll::Pending => return std::task::Poll::Pending,
            }
        }
        let n = self.pending.len().min(buf.remaining());
        let chunk = self.pending.split_to(n);
        buf.put_slice(&chunk);
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Decoupled {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        // Room for what is written is taken first; past the queue's size this waits until the
        // writing task has written some of the queue.
        let take = buf.len().min(this.chunk);
        let want = u32::try_from(take).unwrap_or(u32::MAX);
        match this.room.poll_acquire_many(cx, want) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(None) => {
                return std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            }
            std::task::Poll::Ready(Some(permit)) => permit.forget(),
        }
        let buf = &buf[..take];
        let sent = this
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(bytes::Bytes::copy_from_slice(buf)).is_ok());
        std::task::Poll::Ready(if sent {
            Ok(buf.len())
        } else {
            Err(std::io::ErrorKind::BrokenPipe.into())
        })
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.tx = None;
        std::task::Poll::Ready(Ok(()))
    }
}

/// Relays two byte streams both ways until each direction has ended (EOF or error), shutting
/// down the writing side of each direction as its reading side ends. Returns the bytes that went
/// a→b and b→a, counted even when a direction ends in an error (a reset, a closed channel).
pub async fn splice<A, B>(a: A, b: B) -> (u64, u64)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    splice_with(a, b, None).await
}

/// [`splice`], also stamping `activity` (Unix milliseconds) whenever bytes move, for idle
/// timeouts.
pub async fn splice_with<A, B>(a: A, b: B, activity: Option<&AtomicU64>) -> (u64, u64)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pump<R: tokio::io::AsyncRead, W: tokio::io::AsyncWrite>(
        mut r: tokio::io::ReadHalf<R>,
        mut w: tokio::io::WriteHalf<W>,
        activity: Option<&AtomicU64>,
    ) -> u64 {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some(a) = activity {
                        a.store(crate::unix_now_ms(), Ordering::Relaxed);
                    }
                    if w.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
        let _ = w.shutdown().await;
        total
    }
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    tokio::join!(pump(ar, bw, activity), pump(br, aw, activity))
}

/// Why a peer refused a channel. russh reports the refusal to the opener before its handler's
/// `channel_open_failure` has stored the peer's description in `slot`, so this waits a moment
/// (at most 200 ms) for it; `fallback` (russh's own error) otherwise.
pub async fn open_failure_reason(
    slot: &std::sync::Mutex<Option<String>>,
    fallback: impl std::fmt::Display,
) -> String {
    for _ in 0..40 {
        if let Some(why) = slot.lock().ok().and_then(|mut f| f.take()) {
            return why;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    fallback.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `max` bytes per call, vectored or not, like a busy socket.
    struct Trickle {
        max: usize,
        got: Vec<u8>,
        calls: usize,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.got.extend_from_slice(&buf[..n]);
            self.calls += 1;
            std::task::Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut room = self.max;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(room);
                self.got.extend_from_slice(&b[..take]);
                room -= take;
                n += take;
            }
            self.calls += 1;
            std::task::Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A peer that stops reading holds the writer back at [`WRITE_QUEUE`], not at memory's end;
    /// once it reads, everything queued arrives in order.
    #[tokio::test]
    async fn a_decoupled_writer_waits_once_its_queue_is_full() {
        writer_waits_at(WRITE_QUEUE, Decoupled::new).await;
    }

    /// A jump's connection queues at most [`CLIENT_WRITE_QUEUE`] for a client that stops reading.
    #[tokio::test]
    async fn a_client_connection_queues_a_few_windows_at_most() {
        writer_waits_at(CLIENT_WRITE_QUEUE, |s| {
            Decoupled::with_queue(s, CLIENT_WRITE_QUEUE)
        })
        .await;
    }

    async fn writer_waits_at(queue: usize, make: fn(tokio::io::DuplexStream) -> Decoupled) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let mut d = make(ours);
        let chunk = vec![7u8; 256 * 1024];
        let mut written = 0usize;
        loop {
            match tokio::time::timeout(std::time::Duration::from_millis(200), d.write_all(&chunk))
                .await
            {
                Ok(Ok(())) => written += chunk.len(),
                Ok(Err(e)) => panic!("{e}"),
                Err(_) => break,
            }
            assert!(
                written <= queue + 2 * chunk.len() + 64 * 1024,
                "queued {written} bytes"
            );
        }
        assert!(
            written >= queue - chunk.len(),
            "stalled early, at {written}"
        );
        // The peer reads: the writer goes on.
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1024 * 1024];
            let mut total = 0usize;
            loop {
                match theirs.read(&mut buf).await {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n,
                }
            }
        });
        tokio::time::timeout(std::time::Duration::from_secs(20), d.write_all(&chunk))
            .await
            .unwrap_or_else(|_| panic!("the writer stayed stalled once the peer read"))
            .unwrap_or_else(|e| panic!("{e}"));
        d.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        drop(d);
        let total = reader.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            total >= written,
            "{total} of at least {written} bytes arrived"
        );
    }

    #[tokio::test]
    async fn a_windowed_inbox_reports_data_once_the_consumer_asks_for_more() {
        let reported = Arc::new(AtomicUsize::new(0));
        let r = reported.clone();
        let (tx, mut rx) = windowed_inbox(
            10,
            Arc::new(move |n| {
                r.fetch_add(n, Ordering::SeqCst);
            }),
        );
        assert!(tx.send(Input::Data(vec![1; 4].into())).await);
        assert!(tx.send(Input::Eof).await);
        assert!(tx.send(Input::Data(vec![2; 6].into())).await);
        assert_eq!(tx.queued(), 10);
        assert!(matches!(rx.recv().await, Some(Input::Data(d)) if d.len() == 4));
        // Taken, not yet written on: not consumed.
        assert_eq!(reported.load(Ordering::SeqCst), 0);
        assert_eq!(tx.queued(), 6);
        assert!(matches!(rx.recv().await, Some(Input::Eof)));
        assert_eq!(reported.load(Ordering::SeqCst), 4);
        assert!(matches!(rx.recv().await, Some(Input::Data(d)) if d.len() == 6));
        drop(tx);
        assert!(rx.recv().await.is_none());
        assert_eq!(reported.load(Ordering::SeqCst), 10);
    }

    #[tokio::test]
    async fn a_credited_stream_reports_a_read_once_the_next_read_begins() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let reported = Arc::new(AtomicUsize::new(0));
        let r = reported.clone();
        let (a, mut b) = tokio::io::duplex(1024);
        let mut a = Credited::new(
            a,
            Arc::new(move |n| {
                r.fetch_add(n, Ordering::SeqCst);
            }),
        );
        b.write_all(b"hello")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = [0u8; 16];
        assert_eq!(a.read(&mut buf).await.ok(), Some(5));
        assert_eq!(reported.load(Ordering::SeqCst), 0, "not yet written on");
        b.write_all(b"!").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.read(&mut buf).await.ok(), Some(1));
        assert_eq!(reported.load(Ordering::SeqCst), 5);
        drop(b);
        assert_eq!(a.read(&mut buf).await.ok(), Some(0));
        assert_eq!(reported.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn a_peer_sending_beyond_its_window_is_refused() {
        let (tx, mut rx) = windowed_inbox(10, Arc::new(|_| {}));
        assert!(tx.send(Input::Data(vec![0; 8].into())).await);
        // 8 + 3 > 10: the peer ignored the window it was given; the caller closes the channel.
        assert!(!tx.send(Input::Data(vec![0; 3].into())).await);
        assert_eq!(tx.queued(), 8, "the refused data is not counted");
        assert!(tx.send(Input::Data(vec![0; 2].into())).await);
        assert!(matches!(rx.recv().await, Some(Input::Data(d)) if d.len() == 8));
        assert!(tx.send(Input::Data(vec![0; 8].into())).await);
        // Without a window, only a flood is refused.
        let (tx, _rx) = inbox();
        assert!(tx.send(Input::Data(vec![0; 1 << 20].into())).await);
    }

    #[tokio::test]
    async fn vectored_writes_keep_every_byte_in_order_across_partial_writes() {
        let parts: Vec<Vec<u8>> = (0u8..20).map(|i| vec![i; usize::from(i) * 3]).collect();
        let want = parts.concat();
        for max in [1, 5, 7, 64, 10_000] {
            let mut chunks: Vec<bytes::Bytes> = parts.iter().cloned().map(Into::into).collect();
            let mut w = Trickle {
                max,
                got: Vec::new(),
                calls: 0,
            };
            write_all_vectored(&mut w, &mut chunks)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(w.got, want, "at most {max} bytes a call");
            assert!(chunks.is_empty());
            if max == 10_000 {
                assert_eq!(w.calls, 1, "everything in one vectored write");
            }
        }
    }
}
