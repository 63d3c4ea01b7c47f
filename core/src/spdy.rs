//! SPDY/3.1 as Kubernetes speaks it after `Upgrade: SPDY/3.1` (exec, attach, port-forward):
//! a [`Session`] over any byte stream, with the streams the peer opens ([`Incoming`]) and those
//! this side opens ([`Session::open`]), each a reader and a writer with half-close. Its peers
//! are github.com/moby/spdystream (kubectl, the kubelet, kube-apiserver) and the fixture in
//! `tests/kube/spdy31.py`.
//!
//! What this gets right because a peer depends on it:
//! - header blocks are one zlib stream per direction for the whole connection, each block
//!   ended with a sync flush, with the SPDY/3 dictionary (`zlib`); they are compressed by the
//!   one writer task, so the stream follows the order frames reach the wire;
//! - a stream's SYN_REPLY precedes its data (spdystream drops data that comes before it), and
//!   several values of one header travel as one, NUL-joined (it refuses a repeated name);
//! - PINGs of the peer's parity (odd from a client, even from a server) are echoed;
//! - GOAWAY ends the peer's side, as spdystream stops reading at one; RST_STREAM and the end of
//!   the connection end a stream's reader as FIN does, with [`RecvStream::end`] saying which.
//!
//! Flow control: SPDY/3.1 gives every stream and the session a 64 KiB window that the receiver
//! opens with WINDOW_UPDATE. spdystream never sends one and never waits for one, so a sender
//! that waited on a spdystream peer's window would stall for good after 64 KiB. This side
//! therefore counts the peer's windows always but waits on them only once the peer has shown it
//! does flow control (a WINDOW_UPDATE or SETTINGS_INITIAL_WINDOW_SIZE); it shows its own with a
//! SETTINGS frame before anything else, and sends WINDOW_UPDATEs as its readers consume. What
//! holds back a peer that ignores windows is the connection: a stream whose reader is a window
//! behind stops this side reading the socket, as spdystream's unbuffered channels do. That
//! cannot deadlock against a peer that keeps to the windows (it never fills one, so reading
//! never stops), and a peer that ignores them waits on nothing this side sends.
//!
//! Bounded: a control frame over [`Limits::max_control`] or a header block over
//! [`Limits::max_header_block`] is a protocol error (GOAWAY, then the connection ends); DATA is
//! handed on in pieces as it arrives, never held whole; each stream holds about one window;
//! more than [`Config::max_streams`] at once are refused, and a peer that keeps opening them, or
//! makes this side owe it more than [`MAX_CONTROL`] control frames, is cut off.

mod frame;
mod zlib;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot, watch};

pub use frame::{
    Decoder, Encoder, FLAG_FIN, FLAG_UNIDIRECTIONAL, Frame, Headers, Limits, MAX_LENGTH,
    SETTINGS_INITIAL_WINDOW_SIZE, Setting, VERSION, goaway, rst,
};
pub use zlib::{HeaderDeflate, HeaderInflate, adler32, dictionary};

/// The initial window of every stream and of the session (SPDY/3.1).
pub const DEFAULT_WINDOW: u32 = 64 * 1024;

/// The most control frames this side may owe the peer (PING echoes, resets) before it is taken
/// for a flood: a peer that sends them faster than it reads their answers.
pub const MAX_CONTROL: usize = 1024;

/// Frames queued for the writer by streams; the writer takes them in order.
const QUEUE: usize = 32;
/// The writer sends what it has gathered once it reaches this much.
const BATCH: usize = 256 * 1024;
/// The reader asks the socket for this much at a time.
const READ: usize = 64 * 1024;

/// Why bytes could not be read as SPDY/3.1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("{what} of {len} bytes (at most {max})")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0}")]
    Malformed(&'static str),
    #[error("header compression: {0}")]
    Compression(String),
    #[error("SPDY version {0} (this side speaks 3)")]
    Version(u16),
}

/// Why a stream could not be opened or written.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the SPDY connection is closed")]
    Closed,
    #[error("the peer reset the stream (status {0})")]
    Reset(u32),
    #[error("the peer refused the stream (status {0})")]
    Refused(u32),
    #[error("too many SPDY streams at once")]
    TooManyStreams,
}

/// Which end of the connection this is: clients open odd streams, servers even ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub limits: Limits,
    /// Streams open at once, both ways.
    pub max_streams: usize,
    /// The window this side gives each stream and the session: the SPDY/3.1 default, so no
    /// SETTINGS frame has to say it (spdystream would only ignore one).
    pub window: u32,
    /// The largest DATA frame this side writes: 32 KiB, what spdystream's peers write.
    pub max_data: usize,
    /// After this side's GOAWAY (or its writing failed), how long the peer's last frames are
    /// still read: a stream's last bytes and its Status may be on their way, and closing the
    /// socket under a peer still writing would reset the connection.
    pub drain: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: Limits::default(),
            max_streams: 16,
            window: DEFAULT_WINDOW,
            max_data: 32 * 1024,
            drain: Duration::from_secs(5),
        }
    }
}

/// How a stream's incoming half ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The peer half-closed it (FIN).
    Fin,
    /// The peer reset it (RST_STREAM with this status).
    Reset(u32),
    /// The connection ended (or went away) first.
    Closed,
}

enum Out {
    Frame(Frame),
    /// GOAWAY after everything queued before it, then the end of this side's writing.
    Close,
}

/// What the reader hands a stream's reader: about one window, then the reader waits.
#[derive(Default)]
struct InboundQueue {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    end: Option<End>,
    /// Nobody will read it: its data is dropped on arrival.
    reader_gone: bool,
}

#[derive(Default)]
struct Inbound {
    q: Mutex<InboundQueue>,
    readable: Notify,
    room: Notify,
}

impl Inbound {
    fn lock(&self) -> MutexGuard<'_, InboundQueue> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn end(&self, end: End) {
        let mut q = self.lock();
        if q.end.is_none() {
            q.end = Some(end);
        }
        drop(q);
        self.readable.notify_one();
        self.room.notify_one();
    }

    fn ended(&self) -> Option<End> {
        self.lock().end
    }
}

struct Entry {
    inbound: Arc<Inbound>,
    /// What the peer lets this side send on it (may go below zero while windows are not
    /// waited for).
    send_window: i64,
    local_done: bool,
    remote_done: bool,
    /// A stream this side opened, until its SYN_REPLY (or RST_STREAM).
    reply: Option<oneshot::Sender<Result<Headers, Error>>>,
    /// Consumed and not yet announced with a WINDOW_UPDATE.
    unacked: u32,
}

struct State {
    streams: HashMap<u32, Entry>,
    next_id: u32,
    last_peer_id: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE from the peer.
    peer_initial: i64,
    session_window: i64,
    /// The peer does SPDY/3.1 flow control: its windows are waited for.
    enforce: bool,
    /// A GOAWAY went one way or the other: no new streams.
    going_away: bool,
    refused: usize,
    session_unacked: u32,
    /// WINDOW_UPDATEs owed, by stream (0 the session), coalesced.
    updates: BTreeMap<u32, u32>,
    /// Other control frames owed: PING echoes, resets.
    control: VecDeque<Frame>,
    /// The GOAWAY the reader decided on (a protocol error): the writer sends it and stops.
    fatal: Option<u32>,
}

struct Shared {
    side: Side,
    config: Config,
    state: Mutex<State>,
    control_ready: Notify,
    window_grew: Notify,
    /// The peer's side is over: EOF, GOAWAY, a protocol error.
    peer_done: watch::Sender<bool>,
    /// This side's is: GOAWAY sent or the writer stopped. What the peer sends is still read
    /// (a stream's last bytes and its Status may be on their way) for [`Config::drain`], then
    /// `drained`.
    closing: watch::Sender<bool>,
    drained: watch::Sender<bool>,
    /// [`Session::abort`]: the writer stops at once, whatever it was writing, and the
    /// connection ends after [`Config::drain`].
    aborted: watch::Sender<bool>,
    /// New streams reach the wire in the order of their ids.
    open_order: tokio::sync::Mutex<()>,
}

/// What the reader does after a frame.
enum Next {
    Go,
    /// The peer sent GOAWAY: its side is over.
    GoneAway,
    /// The peer broke the protocol or flooded: GOAWAY with this status, and stop.
    Stop(u32),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    fn is_peer_done(&self) -> bool {
        *self.peer_done.borrow()
    }

    /// Queues a control frame; false when the peer has made this side owe too many.
    fn owe(&self, st: &mut State, f: Frame) -> bool {
        if st.control.len() >= MAX_CONTROL {
            return false;
        }
        st.control.push_back(f);
        self.control_ready.notify_one();
        true
    }

    /// Whether `id` is one the peer may open.
    fn peer_parity(&self, id: u32) -> bool {
        match self.side {
            Side::Server => !id.is_multiple_of(2),
            Side::Client => id.is_multiple_of(2),
        }
    }

    /// The reader's turn on one frame.
    async fn on_frame(
        self: &Arc<Self>,
        f: Frame,
        incoming: &mpsc::Sender<Requested>,
        tx: &mpsc::WeakSender<Out>,
    ) -> Next {
        match f {
            Frame::Data { id, fin, data } => {
                let inbound = {
                    let st = self.lock();
                    match st.streams.get(&id) {
                        Some(e) if !e.remote_done => Some(e.inbound.clone()),
                        // spdystream too drops data for a stream it does not know.
                        _ => None,
                    }
                };
                let Some(inbound) = inbound else {
                    self.consumed(id, data.len());
                    return Next::Go;
                };
                if !data.is_empty() {
                    self.deliver(id, &inbound, data).await;
                }
                if fin {
                    self.remote_end(id, End::Fin);
                }
                Next::Go
            }
            Frame::SynStream {
                id,
                fin,
                unidirectional,
                headers,
                ..
            } => self.on_syn_stream(id, fin, unidirectional, headers, incoming, tx),
            Frame::SynReply { id, fin, headers } => {
                let reply = self
                    .lock()
                    .streams
                    .get_mut(&id)
                    .and_then(|e| e.reply.take());
                if let Some(r) = reply {
                    let _ = r.send(Ok(headers));
                }
                if fin {
                    self.remote_end(id, End::Fin);
                }
                Next::Go
            }
            Frame::Headers { id, fin, .. } => {
                if fin {
                    self.remote_end(id, End::Fin);
                }
                Next::Go
            }
            Frame::RstStream { id, status } => {
                let mut st = self.lock();
                if let Some(mut e) = st.streams.remove(&id) {
                    if let Some(r) = e.reply.take() {
                        let _ = r.send(Err(Error::Refused(status)));
                    }
                    e.inbound.end(End::Reset(status));
                }
                drop(st);
                self.window_grew.notify_waiters();
                Next::Go
            }
            Frame::Settings(entries) => {
                let mut st = self.lock();
                for s in entries {
                    if s.id == SETTINGS_INITIAL_WINDOW_SIZE {
                        let value = i64::from(s.value.min(0x7FFF_FFFF));
                        let delta = value - st.peer_initial;
                        st.peer_initial = value;
                        for e in st.streams.values_mut() {
                            e.send_window += delta;
                        }
                        st.enforce = true;
                    }
                }
                drop(st);
                self.window_grew.notify_waiters();
                Next::Go
            }
            Frame::Ping(id) => {
                // Ours come back with our parity: we send none, so those are dropped.
                if self.peer_parity(id) {
                    let mut st = self.lock();
                    if !self.owe(&mut st, Frame::Ping(id)) {
                        return Next::Stop(goaway::PROTOCOL_ERROR);
                    }
                }
                Next::Go
            }
            Frame::GoAway { .. } => {
                self.lock().going_away = true;
                Next::GoneAway
            }
            Frame::WindowUpdate { id, delta } => {
                let mut st = self.lock();
                st.enforce = true;
                let cap = i64::from(i32::MAX);
                if id == 0 {
                    st.session_window = (st.session_window + i64::from(delta)).min(cap);
                } else if let Some(e) = st.streams.get_mut(&id) {
                    e.send_window = (e.send_window + i64::from(delta)).min(cap);
                }
                drop(st);
                self.window_grew.notify_waiters();
                Next::Go
            }
        }
    }

    fn on_syn_stream(
        self: &Arc<Self>,
        id: u32,
        fin: bool,
        unidirectional: bool,
        headers: Headers,
        incoming: &mpsc::Sender<Requested>,
        tx: &mpsc::WeakSender<Out>,
    ) -> Next {
        let mut st = self.lock();
        let refuse = |st: &mut State, status| {
            st.refused += 1;
            if st.refused > 64 * self.config.max_streams.max(1)
                || !self.owe(st, Frame::RstStream { id, status })
            {
                return Next::Stop(goaway::PROTOCOL_ERROR);
            }
            Next::Go
        };
        // spdystream's checkStreamFrame: a bad id is a protocol error for that stream.
        if id == 0 || !self.peer_parity(id) || id <= st.last_peer_id {
            return refuse(&mut st, rst::PROTOCOL_ERROR);
        }
        st.last_peer_id = id;
        if st.going_away || self.is_closing() {
            return refuse(&mut st, rst::REFUSED_STREAM);
        }
        if st.streams.len() >= self.config.max_streams {
            return refuse(&mut st, rst::REFUSED_STREAM);
        }
        let inbound = Arc::new(Inbound::default());
        if fin {
            inbound.end(End::Fin);
        }
        let send_window = st.peer_initial;
        st.streams.insert(
            id,
            Entry {
                inbound: inbound.clone(),
                send_window,
                local_done: unidirectional,
                remote_done: fin,
                reply: None,
                unacked: 0,
            },
        );
        drop(st);
        let req = Requested {
            id,
            headers,
            shared: self.clone(),
            tx: tx.upgrade(),
            inbound,
            answered: false,
        };
        // Nobody takes it (or too many wait): dropped, which refuses it.
        let _ = incoming.try_send(req);
        Next::Go
    }

    /// Hands `data` to stream `id`'s reader, waiting while that reader is a window behind.
    async fn deliver(&self, id: u32, inbound: &Inbound, data: Bytes) {
        let cap = self.config.window as usize;
        let mut drained = self.drained.subscribe();
        loop {
            {
                let mut q = inbound.lock();
                if q.reader_gone || q.end.is_some() || *self.drained.borrow() {
                    drop(q);
                    // Dropped, but taken all the same: the session's window is not left short.
                    self.consumed(id, data.len());
                    return;
                }
                if q.bytes < cap {
                    q.bytes += data.len();
                    q.chunks.push_back(data);
                    drop(q);
                    inbound.readable.notify_one();
                    return;
                }
            }
            tokio::select! {
                _ = inbound.room.notified() => {}
                _ = drained.wait_for(|d| *d) => {}
            }
        }
    }

    fn remote_end(&self, id: u32, end: End) {
        let mut st = self.lock();
        if let Some(e) = st.streams.get_mut(&id) {
            e.remote_done = true;
            e.inbound.end(end);
            if e.local_done {
                st.streams.remove(&id);
            }
        }
    }

    fn local_end(&self, id: u32) {
        let mut st = self.lock();
        if let Some(e) = st.streams.get_mut(&id) {
            e.local_done = true;
            if e.remote_done {
                st.streams.remove(&id);
            }
        }
    }

    /// The reader took `n` bytes of stream `id`: window owed back, at half a window at a time.
    fn consumed(&self, id: u32, n: usize) {
        let half = (self.config.window / 2).max(1);
        let n = n.min(u32::MAX as usize) as u32;
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut owed = false;
        if let Some(e) = st.streams.get_mut(&id)
            && !e.remote_done
        {
            e.unacked = e.unacked.saturating_add(n);
            if e.unacked >= half {
                *st.updates.entry(id).or_default() += std::mem::take(&mut e.unacked);
                owed = true;
            }
        }
        st.session_unacked = st.session_unacked.saturating_add(n);
        if st.session_unacked >= half {
            *st.updates.entry(0).or_default() += std::mem::take(&mut st.session_unacked);
            owed = true;
        }
        drop(guard);
        if owed {
            self.control_ready.notify_one();
        }
    }

    /// Takes up to `want` bytes of the peer's windows for stream `id`, waiting for them only
    /// if the peer does flow control.
    async fn take_window(&self, id: u32, want: usize, inbound: &Inbound) -> Result<usize, Error> {
        loop {
            let grew = self.window_grew.notified();
            tokio::pin!(grew);
            grew.as_mut().enable();
            if let Some(End::Reset(status)) = inbound.ended() {
                return Err(Error::Reset(status));
            }
            if self.is_closing() {
                return Err(Error::Closed);
            }
            {
                let mut guard = self.lock();
                let st = &mut *guard;
                let Some(e) = st.streams.get_mut(&id) else {
                    return Err(Error::Closed);
                };
                let avail = e.send_window.min(st.session_window);
                let n = if !st.enforce {
                    want
                } else if avail > 0 {
                    want.min(avail as usize)
                } else if self.is_peer_done() {
                    // No WINDOW_UPDATE can come any more.
                    return Err(Error::Closed);
                } else {
                    0
                };
                if n > 0 {
                    e.send_window -= n as i64;
                    st.session_window -= n as i64;
                    return Ok(n);
                }
            }
            grew.await;
        }
    }

    /// Moves the control frames owed into `buf`.
    fn take_control(&self, enc: &mut Encoder, buf: &mut BytesMut) -> Result<(), FrameError> {
        let (frames, updates) = {
            let mut st = self.lock();
            (
                std::mem::take(&mut st.control),
                std::mem::take(&mut st.updates),
            )
        };
        for f in frames {
            enc.encode(&f, buf)?;
        }
        for (id, delta) in updates {
            enc.encode(&Frame::WindowUpdate { id, delta }, buf)?;
        }
        Ok(())
    }

    /// The peer's side is over: every reader ends, every opener and window waiter learns it.
    fn peer_gone(&self) {
        let mut st = self.lock();
        st.going_away = true;
        for e in st.streams.values_mut() {
            e.remote_done = true;
            e.inbound.end(End::Closed);
            if let Some(r) = e.reply.take() {
                let _ = r.send(Err(Error::Closed));
            }
        }
        drop(st);
        self.peer_done.send_replace(true);
        self.window_grew.notify_waiters();
    }
}

/// One SPDY/3.1 connection. Clones share it; it ends when [`Session::close`] is called or
/// every handle (sessions, streams' writers, unanswered [`Requested`]) is dropped, and when
/// the peer's side ends.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Out>,
}

impl Session {
    /// Runs the connection on `io` (a reader and a writer task); the peer's streams arrive on
    /// the [`Incoming`].
    pub fn start<IO>(io: IO, side: Side, config: Config) -> (Session, Incoming)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let shared = Arc::new(Shared {
            side,
            config,
            state: Mutex::new(State {
                streams: HashMap::new(),
                next_id: match side {
                    Side::Client => 1,
                    Side::Server => 2,
                },
                last_peer_id: 0,
                peer_initial: i64::from(DEFAULT_WINDOW),
                session_window: i64::from(DEFAULT_WINDOW),
                enforce: false,
                going_away: false,
                refused: 0,
                session_unacked: 0,
                updates: BTreeMap::new(),
                control: VecDeque::new(),
                fatal: None,
            }),
            control_ready: Notify::new(),
            window_grew: Notify::new(),
            peer_done: watch::Sender::new(false),
            closing: watch::Sender::new(false),
            drained: watch::Sender::new(false),
            aborted: watch::Sender::new(false),
            open_order: tokio::sync::Mutex::new(()),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        let (in_tx, in_rx) = mpsc::channel(config.max_streams.max(1));
        let (rd, wr) = tokio::io::split(io);
        tokio::spawn(read_loop(shared.clone(), rd, in_tx, tx.downgrade()));
        tokio::spawn(write_loop(shared.clone(), wr, rx));
        (Session { shared, tx }, Incoming { rx: in_rx })
    }

    /// Opens a stream with `headers` and waits for the peer's SYN_REPLY.
    pub async fn open(&self, headers: Headers) -> Result<Stream, Error> {
        let (id, inbound, reply) = {
            let _order = self.shared.open_order.lock().await;
            let (reply_tx, reply_rx) = oneshot::channel();
            let (id, inbound) = {
                let mut st = self.shared.lock();
                if st.going_away || self.shared.is_closing() || self.shared.is_peer_done() {
                    return Err(Error::Closed);
                }
                if st.streams.len() >= self.shared.config.max_streams {
                    return Err(Error::TooManyStreams);
                }
                let id = st.next_id;
                if id > 0x7FFF_FFFF {
                    return Err(Error::Closed);
                }
                st.next_id += 2;
                let inbound = Arc::new(Inbound::default());
                let send_window = st.peer_initial;
                st.streams.insert(
                    id,
                    Entry {
                        inbound: inbound.clone(),
                        send_window,
                        local_done: false,
                        remote_done: false,
                        reply: Some(reply_tx),
                        unacked: 0,
                    },
                );
                (id, inbound)
            };
            let syn = Frame::SynStream {
                id,
                associated: 0,
                priority: 0,
                fin: false,
                unidirectional: false,
                headers,
            };
            if self.tx.send(Out::Frame(syn)).await.is_err() {
                self.shared.lock().streams.remove(&id);
                return Err(Error::Closed);
            }
            (id, inbound, reply_rx)
        };
        let headers = reply.await.map_err(|_| Error::Closed)??;
        Ok(Stream::new(
            id,
            headers,
            inbound,
            self.shared.clone(),
            self.tx.clone(),
        ))
    }

    /// GOAWAY after everything already written, then the end of this side's writing; the
    /// peer's last frames are still read, for [`Config::drain`] at most.
    pub async fn close(&self) {
        let _ = self.tx.send(Out::Close).await;
    }

    /// Ends this side's writing at once, even in the middle of a write a peer that stopped
    /// reading holds up (no GOAWAY then); the connection ends after [`Config::drain`].
    pub fn abort(&self) {
        self.shared.aborted.send_replace(true);
    }

    /// Resolves once the peer's side is over (EOF, GOAWAY, a protocol error, or this side
    /// closed and drained).
    pub async fn ended(&self) {
        let mut rx = self.shared.peer_done.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    pub fn is_ended(&self) -> bool {
        self.shared.is_peer_done()
    }
}

/// The streams the peer opens, in order.
pub struct Incoming {
    rx: mpsc::Receiver<Requested>,
}

impl Incoming {
    /// The next stream the peer opened; `None` once its side is over.
    pub async fn next(&mut self) -> Option<Requested> {
        self.rx.recv().await
    }
}

/// A stream the peer opened, not yet answered: [`Requested::accept`] replies (SYN_REPLY),
/// dropping it refuses it (RST_STREAM REFUSED_STREAM).
pub struct Requested {
    pub id: u32,
    pub headers: Headers,
    shared: Arc<Shared>,
    tx: Option<mpsc::Sender<Out>>,
    inbound: Arc<Inbound>,
    answered: bool,
}

impl Requested {
    /// Replies with an empty header block, as the kubelet does.
    pub async fn accept(mut self) -> Result<Stream, Error> {
        self.answered = true;
        let tx = self.tx.take().ok_or(Error::Closed)?;
        let reply = Frame::SynReply {
            id: self.id,
            fin: false,
            headers: Headers::new(),
        };
        tx.send(Out::Frame(reply))
            .await
            .map_err(|_| Error::Closed)?;
        Ok(Stream::new(
            self.id,
            std::mem::take(&mut self.headers),
            self.inbound.clone(),
            self.shared.clone(),
            tx,
        ))
    }
}

impl Drop for Requested {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.inbound.lock().reader_gone = true;
        let mut st = self.shared.lock();
        st.streams.remove(&self.id);
        if !self.shared.owe(
            &mut st,
            Frame::RstStream {
                id: self.id,
                status: rst::REFUSED_STREAM,
            },
        ) {
            st.fatal.get_or_insert(goaway::PROTOCOL_ERROR);
            self.shared.control_ready.notify_one();
        }
    }
}

/// An open stream: the peer's headers (its SYN_STREAM's, or its SYN_REPLY's for one this side
/// opened), and its two halves.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub recv: RecvStream,
    pub send: SendStream,
}

impl Stream {
    fn new(
        id: u32,
        headers: Headers,
        inbound: Arc<Inbound>,
        shared: Arc<Shared>,
        tx: mpsc::Sender<Out>,
    ) -> Self {
        Stream {
            id,
            headers,
            recv: RecvStream {
                id,
                inbound: inbound.clone(),
                shared: shared.clone(),
            },
            send: SendStream {
                id,
                inbound,
                shared,
                tx,
                done: false,
            },
        }
    }
}

/// What the peer sends on a stream. Dropping it drops whatever else arrives.
pub struct RecvStream {
    id: u32,
    inbound: Arc<Inbound>,
    shared: Arc<Shared>,
}

impl RecvStream {
    /// The next bytes; `None` once the stream ended ([`RecvStream::end`] says how).
    pub async fn read(&mut self) -> Option<Bytes> {
        loop {
            {
                let mut q = self.inbound.lock();
                if let Some(c) = q.chunks.pop_front() {
                    q.bytes -= c.len();
                    drop(q);
                    self.inbound.room.notify_one();
                    self.shared.consumed(self.id, c.len());
                    return Some(c);
                }
                if q.end.is_some() {
                    return None;
                }
            }
            self.inbound.readable.notified().await;
        }
    }

    /// How the stream ended, once it has.
    pub fn end(&self) -> Option<End> {
        self.inbound.ended()
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let mut q = self.inbound.lock();
        q.reader_gone = true;
        q.chunks.clear();
        q.bytes = 0;
        drop(q);
        self.inbound.room.notify_one();
    }
}

/// What this side sends on a stream. Dropped before [`SendStream::finish`], it resets the
/// stream (CANCEL).
pub struct SendStream {
    id: u32,
    inbound: Arc<Inbound>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Out>,
    done: bool,
}

impl SendStream {
    /// Sends `data` in DATA frames of [`Config::max_data`] at most, within the peer's windows
    /// when it does flow control.
    pub async fn write(&mut self, mut data: Bytes) -> Result<(), Error> {
        if self.done {
            return Err(Error::Closed);
        }
        while !data.is_empty() {
            let want = data.len().min(self.shared.config.max_data.max(1));
            let n = self
                .shared
                .take_window(self.id, want, &self.inbound)
                .await?;
            let piece = data.split_to(n);
            let frame = Frame::Data {
                id: self.id,
                fin: false,
                data: piece,
            };
            self.tx
                .send(Out::Frame(frame))
                .await
                .map_err(|_| Error::Closed)?;
        }
        Ok(())
    }

    /// Half-closes the stream: an empty DATA frame with FIN, after what was written.
    pub async fn finish(&mut self) -> Result<(), Error> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        self.shared.local_end(self.id);
        let fin = Frame::Data {
            id: self.id,
            fin: true,
            data: Bytes::new(),
        };
        self.tx
            .send(Out::Frame(fin))
            .await
            .map_err(|_| Error::Closed)
    }

    /// Aborts the stream (RST_STREAM with `status`).
    pub fn reset(&mut self, status: u32) {
        if self.done {
            return;
        }
        self.done = true;
        self.shared.local_end(self.id);
        let rst = Frame::RstStream {
            id: self.id,
            status,
        };
        // Behind what was queued if there is room, else ahead of it (an abort may be).
        if let Err(mpsc::error::TrySendError::Full(Out::Frame(rst))) =
            self.tx.try_send(Out::Frame(rst))
        {
            let mut st = self.shared.lock();
            let _ = self.shared.owe(&mut st, rst);
        }
    }
}

impl Drop for SendStream {
    fn drop(&mut self) {
        if !self.done && !self.shared.is_closing() {
            self.reset(rst::CANCEL);
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    shared: Arc<Shared>,
    mut rd: R,
    incoming: mpsc::Sender<Requested>,
    tx: mpsc::WeakSender<Out>,
) {
    let mut dec = Decoder::new(shared.config.limits);
    let mut buf = BytesMut::with_capacity(READ);
    let mut drained = shared.drained.subscribe();
    let mut gone_away = false;
    'read: loop {
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(f)) => {
                    // After the peer's GOAWAY its frames are read only to be dropped (spdystream
                    // stops reading there).
                    if gone_away {
                        continue;
                    }
                    match shared.on_frame(f, &incoming, &tx).await {
                        Next::Go => {}
                        Next::GoneAway => {
                            gone_away = true;
                            shared.peer_gone();
                        }
                        Next::Stop(status) => {
                            stop(&shared, status);
                            break 'read;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "SPDY: the peer's frames cannot be read");
                    stop(&shared, goaway::PROTOCOL_ERROR);
                    break 'read;
                }
            }
        }
        if buf.capacity() - buf.len() < READ / 4 {
            buf.reserve(READ);
        }
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            _ = drained.wait_for(|d| *d) => break,
        }
    }
    shared.peer_gone();
}

/// The reader gives up on the peer: GOAWAY with `status`, and the writer stops after it.
fn stop(shared: &Shared, status: u32) {
    let mut st = shared.lock();
    st.fatal.get_or_insert(status);
    drop(st);
    shared.control_ready.notify_one();
}

async fn write_loop<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    mut wr: W,
    mut rx: mpsc::Receiver<Out>,
) {
    let mut enc = Encoder::new();
    let mut buf = BytesMut::with_capacity(BATCH + 64 * 1024);
    // First of all, the window this side gives: a peer of our kind learns from it that this
    // side does flow control, and so waits on its windows from its first byte (spdystream
    // ignores it).
    let settings = Frame::Settings(vec![Setting {
        flags: 0,
        id: SETTINGS_INITIAL_WINDOW_SIZE,
        value: shared.config.window,
    }]);
    let _ = enc.encode(&settings, &mut buf);
    let mut next: Option<Option<Out>> = None;
    let mut goaway_status = goaway::OK;
    let mut aborted = shared.aborted.subscribe();
    loop {
        let mut close = false;
        if shared.take_control(&mut enc, &mut buf).is_err() {
            close = true;
        }
        if let Some(status) = shared.lock().fatal {
            goaway_status = status;
            close = true;
        }
        while !close && buf.len() < BATCH {
            let item = match next.take() {
                Some(item) => item,
                None => match rx.try_recv() {
                    Ok(out) => Some(out),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                },
            };
            match item {
                Some(Out::Frame(f)) => {
                    if let Err(e) = enc.encode(&f, &mut buf) {
                        tracing::debug!(error = %e, "SPDY: a frame could not be written");
                        goaway_status = goaway::INTERNAL_ERROR;
                        close = true;
                    }
                }
                Some(Out::Close) | None => close = true,
            }
        }
        if !close && buf.is_empty() {
            tokio::select! {
                biased;
                _ = aborted.wait_for(|a| *a) => break,
                _ = shared.control_ready.notified() => {}
                out = rx.recv() => next = Some(out),
            }
            continue;
        }
        if close {
            let last_good = shared.lock().last_peer_id;
            let goaway = Frame::GoAway {
                last_good,
                status: goaway_status,
            };
            let _ = enc.encode(&goaway, &mut buf);
        }
        let written = tokio::select! {
            biased;
            _ = aborted.wait_for(|a| *a) => false,
            w = async { wr.write_all(&buf).await.is_ok() && wr.flush().await.is_ok() } => w,
        };
        if !written {
            break;
        }
        buf.clear();
        if close {
            break;
        }
    }
    shared.closing.send_replace(true);
    shared.lock().going_away = true;
    shared.window_grew.notify_waiters();
    let drain = shared.config.drain;
    let after = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(drain).await;
        after.drained.send_replace(true);
    });
    tokio::select! {
        biased;
        _ = aborted.wait_for(|a| *a) => {}
        _ = wr.shutdown() => {}
    }
}
