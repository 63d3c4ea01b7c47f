//! What every door does with a connection before its peer has proved who it is: the SSH door
//! (3023), the agents' tunnels (3024), HTTPS (3080 and auth's 3025) and each agent's SSH server.
//!
//! A door admits a connection only under a global cap and a per-address cap on connections that
//! have not authenticated yet, and a token bucket of new connections per source address (refused
//! before any key exchange, so a DHEat flood — CVE-2002-20001, many connections each costing the
//! server a Diffie-Hellman computation — costs us an `accept` and a few bytes). A connection that
//! authenticates leaves the caps and gives its token back, so a peer that logs in is never
//! throttled; what stays throttled is what never logs in. An SSH connection that has not
//! authenticated within its login grace is told why and cut ([`serve_ssh`]).
//!
//! Where authenticating proves little (at the HTTPS door any request, an anonymous `ping`
//! included, takes a connection out of the unauthenticated caps), a door also caps every open
//! connection, globally and per source ([`OpenLimits`]): a connection leaves the
//! unauthenticated caps with [`Unauthenticated::requested`] and stays counted until it closes.
//!
//! This module never decides who someone is: the door's own checks do, and call
//! [`Pending::authenticated`] when they are satisfied.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long an SSH connection may take to authenticate (OpenSSH's `LoginGraceTime` is 120 s;
/// every client we serve authenticates with a certificate, in well under a second).
pub const DEFAULT_LOGIN_GRACE: Duration = Duration::from_secs(30);
/// Connections still authenticating, all addresses together. Sized for a 2-core proxy: each
/// costs a socket and a task, and the CPU they cost is bounded by the per-address rate.
pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 256;
/// Connections still authenticating from one address (an IPv4 address or an IPv6 /64). OpenSSH
/// starts refusing at 10 unauthenticated connections in all (`MaxStartups 10:30:100`).
pub const DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS: usize = 16;
/// New connections a second one address may open, sustained, beyond a burst of
/// [`DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS`]; a connection that authenticates does not count.
/// `ssh-audit` calls a server that lets one address complete more than 20 a second open to DHEat.
pub const DEFAULT_NEW_PER_SECOND_PER_ADDRESS: u32 = 5;

/// Refused peers that are told why at the same time, over all doors of a process; beyond this a
/// refused connection is simply closed. Telling costs a few writes for SSH and a TLS handshake
/// for HTTPS, which a flood must not be able to multiply.
const MAX_TELLING: usize = 16;
/// How long a refused peer gets to read why.
const TELLING_TIME: Duration = Duration::from_secs(3);

/// Open connections at a door where any request leaves the unauthenticated caps (the proxy's
/// HTTPS door), all addresses together. Each costs a socket, a task and TLS buffers; 4096 is
/// well within a 2-core proxy's memory and the default 1024-descriptor limit raised by systemd.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Open connections at such a door from one source (an IPv4 address or an IPv6 /64): far above
/// what browsers and `sally` open (a handful each), even many users behind one NAT.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 128;
/// How long an open connection at such a door may go without a request or a byte of a request
/// or response body before it is asked to close (then dropped after as long again).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A door's limits on connections that have not authenticated.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_unauthenticated: usize,
    /// `None` where one address speaks for many people (auth's door, whose clients are the
    /// proxies): capping it there would let one person's flood through a proxy lock out everyone.
    pub per_address: Option<PerAddress>,
    /// Caps on every open connection, where authenticating proves little; `None` where it
    /// proves who the peer is (SSH, tunnels, auth's mutual TLS).
    pub open: Option<OpenLimits>,
}

/// Caps on all open connections at a door; see the module doc.
#[derive(Debug, Clone, Copy)]
pub struct OpenLimits {
    pub max_connections: usize,
    pub max_per_address: usize,
    /// Without request activity for this long, a connection is asked to close.
    pub idle_timeout: Duration,
}

impl Default for OpenLimits {
    fn default() -> Self {
        OpenLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct PerAddress {
    pub max_unauthenticated: usize,
    pub new_per_second: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_unauthenticated: DEFAULT_MAX_UNAUTHENTICATED,
            per_address: Some(PerAddress {
                max_unauthenticated: DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS,
                new_per_second: DEFAULT_NEW_PER_SECOND_PER_ADDRESS,
            }),
            open: None,
        }
    }
}

/// Why a door refused a connection, in words for the person behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Busy { max: usize },
    Address { source: String, max: usize },
    Rate { source: String, per_second: u32 },
    Open { max: usize },
    OpenAddress { source: String, max: usize },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Busy { max } => write!(
                f,
                "too many unauthenticated connections to this server (max_unauthenticated_connections: {max}); try again later"
            ),
            Refusal::Address { source, max } => write!(
                f,
                "too many unauthenticated connections from {source} (max_unauthenticated_per_address: {max}); try again later"
            ),
            Refusal::Rate { source, per_second } => write!(
                f,
                "too many new connections from {source} (more than {per_second} a second that do not log in); try again later"
            ),
            Refusal::Open { max } => write!(
                f,
                "too many connections to this server (max_connections: {max}); try again later"
            ),
            Refusal::OpenAddress { source, max } => write!(
                f,
                "too many connections from {source} (max_connections_per_address: {max}); close some and try again"
            ),
        }
    }
}

/// One door's count of connections still authenticating, shared by its accept loop and its
/// connections.
pub struct Door {
    name: &'static str,
    limits: Limits,
    state: Mutex<State>,
    /// Refusals since the last log line: a flood is logged as a count, never line by line.
    refused: Mutex<(Instant, u64)>,
}

/// At most one log line per door this often about refused connections.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

struct State {
    total: usize,
    /// Open connections (under [`Limits::open`]), authenticated or not.
    open: usize,
    sources: HashMap<IpAddr, Source>,
    swept: Instant,
}

struct Source {
    pending: usize,
    open: usize,
    tokens: f64,
    at: Instant,
}

impl Source {
    /// Tokens now, refilled since `at` up to `burst`.
    fn refill(&mut self, now: Instant, per: &PerAddress) {
        let burst = per.max_unauthenticated as f64;
        let gained = now.duration_since(self.at).as_secs_f64() * f64::from(per.new_per_second);
        self.tokens = (self.tokens + gained).min(burst);
        self.at = now;
    }

    /// Nothing counted and the bucket full (or no bucket): the source can be forgotten.
    fn idle(&self, per: Option<&PerAddress>) -> bool {
        self.pending == 0
            && self.open == 0
            && per.is_none_or(|p| self.tokens >= p.max_unauthenticated as f64)
    }
}

/// The address a source is counted under: IPv4 as is (an IPv4-mapped IPv6 address too), IPv6
/// by its /64, which one subscriber holds whole.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

fn shown(source: IpAddr) -> String {
    match source {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("{v6}/64"),
    }
}

impl Door {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Door> {
        Arc::new(Door {
            name,
            limits,
            state: Mutex::new(State {
                total: 0,
                open: 0,
                sources: HashMap::new(),
                swept: Instant::now(),
            }),
            refused: Mutex::new((Instant::now() - REFUSAL_LOG_EVERY, 0)),
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Counts a new connection from `peer` as unauthenticated, or says why it is refused (and
    /// logs refusals, at most one line per door every ten seconds).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Unauthenticated, Refusal> {
        let admitted = self.count(peer);
        if let Err(refusal) = &admitted {
            self.log_refusal(peer, refusal);
        }
        admitted
    }

    fn log_refusal(&self, peer: IpAddr, refusal: &Refusal) {
        let Ok(mut refused) = self.refused.lock() else {
            return;
        };
        refused.1 += 1;
        if refused.0.elapsed() >= REFUSAL_LOG_EVERY {
            tracing::warn!(
                door = self.name,
                refused = refused.1,
                last_peer = %peer,
                last_reason = %refusal,
                "connections refused before authentication"
            );
            *refused = (Instant::now(), 0);
        }
    }

    fn count(self: &Arc<Self>, peer: IpAddr) -> Result<Unauthenticated, Refusal> {
        let source = source_of(peer);
        let now = Instant::now();
        let Ok(mut state) = self.state.lock() else {
            return Err(Refusal::Busy {
                max: self.limits.max_unauthenticated,
            });
        };
        let per = self.limits.per_address;
        if per.is_some() || self.limits.open.is_some() {
            // Sources that went quiet leave the table; swept at most once a second, and only
            // when it is large, so a flood of addresses costs amortized constant time.
            let open_max = self.limits.open.map_or(0, |o| o.max_connections);
            if state.sources.len() > 2 * (self.limits.max_unauthenticated + open_max) + 1024
                && now.duration_since(state.swept) > Duration::from_secs(1)
            {
                state.sources.retain(|_, s| {
                    if let Some(per) = &per {
                        s.refill(now, per);
                    }
                    !s.idle(per.as_ref())
                });
                state.swept = now;
            }
            let entry = state.sources.entry(source).or_insert(Source {
                pending: 0,
                open: 0,
                tokens: per.map_or(0.0, |p| p.max_unauthenticated as f64),
                at: now,
            });
            if let Some(per) = &per {
                entry.refill(now, per);
                if entry.pending >= per.max_unauthenticated {
                    return Err(Refusal::Address {
                        source: shown(source),
                        max: per.max_unauthenticated,
                    });
                }
                if entry.tokens < 1.0 {
                    return Err(Refusal::Rate {
                        source: shown(source),
                        per_second: per.new_per_second,
                    });
                }
            }
            if let Some(open) = &self.limits.open
                && entry.open >= open.max_per_address
            {
                return Err(Refusal::OpenAddress {
                    source: shown(source),
                    max: open.max_per_address,
                });
            }
        }
        if state.total >= self.limits.max_unauthenticated {
            return Err(Refusal::Busy {
                max: self.limits.max_unauthenticated,
            });
        }
        if let Some(open) = &self.limits.open
            && state.open >= open.max_connections
        {
            return Err(Refusal::Open {
                max: open.max_connections,
            });
        }
        state.total += 1;
        let open = self.limits.open.is_some();
        if open {
            state.open += 1;
        }
        if let Some(s) = state.sources.get_mut(&source) {
            s.pending += 1;
            if per.is_some() {
                s.tokens -= 1.0;
            }
            if open {
                s.open += 1;
            }
        }
        Ok(Unauthenticated {
            door: self.clone(),
            source,
            done: false,
            open,
        })
    }

    /// A connection leaves the unauthenticated count (its token given back when it
    /// authenticated) and, when `open`, the open count.
    fn release(&self, source: IpAddr, pending: bool, authenticated: bool, open: bool) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if pending {
            state.total = state.total.saturating_sub(1);
        }
        if open {
            state.open = state.open.saturating_sub(1);
        }
        let per = self.limits.per_address;
        if let Some(s) = state.sources.get_mut(&source) {
            if pending {
                s.pending = s.pending.saturating_sub(1);
            }
            if open {
                s.open = s.open.saturating_sub(1);
            }
            if let Some(per) = &per {
                s.refill(Instant::now(), per);
                if authenticated {
                    s.tokens = (s.tokens + 1.0).min(per.max_unauthenticated as f64);
                }
            }
            if s.idle(per.as_ref()) {
                state.sources.remove(&source);
            }
        }
    }

    /// Open connections counted now (for tests and logs).
    pub fn open(&self) -> usize {
        self.state.lock().map(|s| s.open).unwrap_or(0)
    }

    /// Connections counted now (for tests and logs).
    pub fn unauthenticated(&self) -> usize {
        self.state.lock().map(|s| s.total).unwrap_or(0)
    }
}

/// A connection counted against its door until it authenticates or ends.
pub struct Unauthenticated {
    door: Arc<Door>,
    source: IpAddr,
    done: bool,
    /// Also counted under the door's [`OpenLimits`].
    open: bool,
}

impl Unauthenticated {
    /// The peer proved who it is: it leaves the caps and its token is given back.
    pub fn authenticated(mut self) {
        self.done = true;
        self.door.release(self.source, true, true, self.open);
    }

    /// The peer sent a request, which proves little: it leaves the unauthenticated caps and
    /// its token is given back (people using the service are not throttled), but it stays
    /// counted under the door's open caps for as long as the returned guard lives.
    pub fn requested(mut self) -> Open {
        self.done = true;
        self.door.release(self.source, true, true, false);
        Open {
            door: self.door.clone(),
            source: self.source,
            open: self.open,
        }
    }
}

impl Drop for Unauthenticated {
    fn drop(&mut self) {
        if !self.done {
            self.door.release(self.source, true, false, self.open);
        }
    }
}

/// A connection counted under its door's open caps until it is dropped.
pub struct Open {
    door: Arc<Door>,
    source: IpAddr,
    open: bool,
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.open {
            self.door.release(self.source, false, false, true);
        }
    }
}

static TELLING: Semaphore = Semaphore::const_new(MAX_TELLING);

/// Leave to spend a little work telling a refused peer why, if not too many are being told;
/// without it, a refused connection is just closed (a flood then costs an accept and a close).
pub fn telling_permit() -> Option<tokio::sync::SemaphorePermit<'static>> {
    TELLING.try_acquire().ok()
}

/// How long a refused peer gets to read why.
pub fn telling_time() -> Duration {
    TELLING_TIME
}

/// What an SSH door says to a connection it refuses before key exchange: the reason as a line
/// before the version (RFC 4253 4.2 lets a server send such lines; tools that probe connection
/// rates, like `ssh-audit`, read it as a refusal as they read OpenSSH's "Exceeded
/// MaxStartups"), then the version and an unencrypted SSH_MSG_DISCONNECT with the reason, which
/// OpenSSH's `ssh` prints ("Received disconnect from …: too many …").
pub fn ssh_refusal(server_id: &russh::SshId, reason: &str) -> Vec<u8> {
    let line: String = reason
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let mut out = format!("{line}\r\n").into_bytes();
    match server_id {
        russh::SshId::Standard(s) => out.extend_from_slice(format!("{s}\r\n").as_bytes()),
        russh::SshId::Raw(s) => out.extend_from_slice(s.as_bytes()),
    }
    // SSH_MSG_DISCONNECT: byte 1, uint32 reason code, string description, string language.
    let mut payload = vec![1u8];
    payload.extend_from_slice(&(russh::Disconnect::TooManyConnections as u32).to_be_bytes());
    payload.extend_from_slice(&(line.len() as u32).to_be_bytes());
    payload.extend_from_slice(line.as_bytes());
    payload.extend_from_slice(&0u32.to_be_bytes());
    // Binary packet before keys: length, padding length, payload, padding; the whole a multiple
    // of 8 with at least 4 bytes of padding.
    let mut padding = 8 - (4 + 1 + payload.len()) % 8;
    if padding < 4 {
        padding += 8;
    }
    let length = (1 + payload.len() + padding) as u32;
    out.extend_from_slice(&length.to_be_bytes());
    out.push(padding as u8);
    out.extend_from_slice(&payload);
    out.extend(std::iter::repeat_n(0u8, padding));
    out
}

/// Tells a refused SSH peer why, then closes; the caller holds a [`telling_permit`].
pub async fn refuse_ssh<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    server_id: &russh::SshId,
    reason: &str,
) {
    let bytes = ssh_refusal(server_id, reason);
    let _ = tokio::time::timeout(TELLING_TIME, async {
        if stream.write_all(&bytes).await.is_ok() {
            let _ = stream.shutdown().await;
            // Read what the client sends until it closes: closing with its bytes unread would
            // reset the connection and could discard our message before the client reads it.
            let mut sink = [0u8; 1024];
            loop {
                match tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    })
    .await;
}

/// The handler's side of a connection that has not authenticated yet: it calls
/// [`Pending::authenticated`] once the peer has proved who it is (russh's `auth_succeeded`).
#[derive(Default)]
pub struct Pending {
    counted: Option<Unauthenticated>,
    signal: Option<oneshot::Sender<()>>,
}

/// The serving side of the same connection: fires when the handler calls
/// [`Pending::authenticated`].
pub struct Login(oneshot::Receiver<()>);

impl Pending {
    /// A connection counted as `counted` (None where the door keeps no count).
    pub fn new(counted: Option<Unauthenticated>) -> (Pending, Login) {
        let (tx, rx) = oneshot::channel();
        (
            Pending {
                counted,
                signal: Some(tx),
            },
            Login(rx),
        )
    }

    pub fn authenticated(&mut self) {
        if let Some(c) = self.counted.take() {
            c.authenticated();
        }
        if let Some(s) = self.signal.take() {
            let _ = s.send(());
        }
    }
}

/// Serves one SSH connection on `stream` until it ends, and ends it if the handler has not
/// called [`Pending::authenticated`] within `grace`: the client is sent a disconnect with the
/// reason, and if the session cannot send it (russh holds its queue during a key exchange, which
/// is where a stalled or hostile client sits) the transport is cut a second later. At most
/// `write_queue` bytes wait for the peer to read ([`crate::flow::Decoupled::with_queue`]).
pub async fn serve_ssh<H, S>(
    config: Arc<russh::server::Config>,
    stream: S,
    handler: H,
    login: Login,
    grace: Duration,
    write_queue: usize,
) -> Result<(), String>
where
    H: russh::server::Handler<Error = russh::Error> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cut = CancellationToken::new();
    let stream = crate::flow::Decoupled::with_queue(Cut::new(stream, cut.clone()), write_queue);
    let deadline = tokio::time::Instant::now() + grace;
    let why = format!(
        "not authenticated within {}s (ssh_login_grace)",
        grace.as_secs()
    );
    // Until the client's version line arrives there is no session to speak through.
    let mut running =
        match tokio::time::timeout_at(deadline, russh::server::run_stream(config, stream, handler))
            .await
        {
            Ok(Ok(running)) => running,
            Ok(Err(e)) => return Err(format!("ssh handshake failed: {e}")),
            Err(_) => {
                cut.cancel();
                return Err(why);
            }
        };
    let Login(mut login) = login;
    tokio::select! {
        ended = &mut running => return ended.map_err(|e| e.to_string()),
        // Authenticated, or the handler is gone because the session ended.
        _ = &mut login => return running.await.map_err(|e| e.to_string()),
        () = tokio::time::sleep_until(deadline) => {}
    }
    let handle = running.handle();
    let told = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = handle
            .disconnect(russh::Disconnect::ByApplication, why.clone(), String::new())
            .await;
        let _ = (&mut running).await;
    })
    .await;
    cut.cancel();
    // A finished session must not be polled again.
    if told.is_err() {
        let _ = tokio::time::timeout(Duration::from_secs(5), running).await;
    }
    Err(why)
}

/// A transport that reads as closed, and refuses writes, once its token is cancelled: how a
/// connection is ended from outside a session loop that is not listening.
pub struct Cut<S> {
    inner: S,
    token: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<S> Cut<S> {
    pub fn new(inner: S, token: CancellationToken) -> Self {
        let cancelled = Box::pin(token.clone().cancelled_owned());
        Cut {
            inner,
            token,
            cancelled,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Cut<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.token.is_cancelled() {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => Poll::Ready(r),
            // Only a reader about to wait needs waking on the cut: a busy transfer pays one
            // atomic load a read, not a waker registration.
            Poll::Pending if self.cancelled.as_mut().poll(cx).is_ready() => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Cut<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.token.is_cancelled() {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(global: usize, per: usize, rate: u32) -> Limits {
        Limits {
            max_unauthenticated: global,
            per_address: Some(PerAddress {
                max_unauthenticated: per,
                new_per_second: rate,
            }),
            open: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn caps_per_address_then_globally() {
        let door = Door::new("test", limits(3, 2, 1000));
        let a1 = door.admit(ip("10.0.0.1"));
        let a2 = door.admit(ip("10.0.0.1"));
        assert!(a1.is_ok() && a2.is_ok());
        assert_eq!(
            door.admit(ip("10.0.0.1")).err(),
            Some(Refusal::Address {
                source: "10.0.0.1".into(),
                max: 2
            })
        );
        let b1 = door.admit(ip("10.0.0.2"));
        assert!(b1.is_ok());
        assert_eq!(
            door.admit(ip("10.0.0.3")).err(),
            Some(Refusal::Busy { max: 3 })
        );
        drop(a1);
        assert!(door.admit(ip("10.0.0.3")).is_ok());
    }

    #[test]
    fn authenticated_connections_leave_the_count_and_refund_their_token() {
        // A burst of 2 and no refill to speak of: only refunds let a third connection in.
        let door = Door::new("test", limits(10, 2, 0));
        for _ in 0..5 {
            let c = door.admit(ip("10.0.0.1")).unwrap_or_else(|e| panic!("{e}"));
            c.authenticated();
        }
        assert_eq!(door.unauthenticated(), 0);
        // Connections that never log in spend the bucket.
        drop(door.admit(ip("10.0.0.1")));
        drop(door.admit(ip("10.0.0.1")));
        let refused = door.admit(ip("10.0.0.1")).err();
        assert_eq!(
            refused,
            Some(Refusal::Rate {
                source: "10.0.0.1".into(),
                per_second: 0
            })
        );
        assert!(
            refused
                .map(|r| r.to_string())
                .unwrap_or_default()
                .contains("too many new connections from 10.0.0.1")
        );
        // Another address has its own bucket.
        assert!(door.admit(ip("10.0.0.2")).is_ok());
    }

    #[test]
    fn the_bucket_refills_at_the_rate() {
        let door = Door::new("test", limits(10, 1, 50));
        drop(door.admit(ip("10.0.0.1")));
        assert!(door.admit(ip("10.0.0.1")).is_err());
        std::thread::sleep(Duration::from_millis(60));
        assert!(door.admit(ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let door = Door::new("test", limits(10, 1, 1000));
        let _a = door.admit(ip("2001:db8:1:2::1"));
        assert_eq!(
            door.admit(ip("2001:db8:1:2:ffff::9")).err(),
            Some(Refusal::Address {
                source: "2001:db8:1:2::/64".into(),
                max: 1
            })
        );
        assert!(door.admit(ip("2001:db8:1:3::1")).is_ok());
        let _b = door.admit(ip("192.0.2.7"));
        assert!(door.admit(ip("::ffff:192.0.2.7")).is_err());
    }

    #[test]
    fn no_per_address_limits_where_one_address_speaks_for_many() {
        let door = Door::new(
            "auth",
            Limits {
                max_unauthenticated: 3,
                per_address: None,
                open: None,
            },
        );
        let held: Vec<_> = (0..3).map(|_| door.admit(ip("127.0.0.1"))).collect();
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(
            door.admit(ip("127.0.0.1")).err(),
            Some(Refusal::Busy { max: 3 })
        );
    }

    #[test]
    fn quiet_sources_leave_the_table() {
        let door = Door::new("test", limits(1, 1, 1));
        for i in 0..5000u32 {
            let a = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            drop(door.admit(a));
        }
        std::thread::sleep(Duration::from_millis(1100));
        drop(door.admit(ip("10.255.0.1")));
        let left = door
            .state
            .lock()
            .map(|s| s.sources.len())
            .unwrap_or(usize::MAX);
        assert!(left <= 1, "{left} sources left");
    }

    #[test]
    fn the_refusal_is_a_line_then_a_disconnect_packet() {
        let id = russh::SshId::Standard("SSH-2.0-test".into());
        let bytes = ssh_refusal(&id, "too many\r\nSSH-2.0-evil");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.starts_with("too manySSH-2.0-evil\r\nSSH-2.0-test\r\n"),
            "{text:?}"
        );
        let packet = &bytes[text.find("test\r\n").map(|i| i + 6).unwrap_or(0)..];
        let length = u32::from_be_bytes([packet[0], packet[1], packet[2], packet[3]]) as usize;
        assert_eq!(packet.len(), 4 + length);
        assert_eq!(packet.len() % 8, 0);
        let padding = packet[4] as usize;
        assert!(padding >= 4);
        assert_eq!(packet[5], 1, "SSH_MSG_DISCONNECT");
        assert_eq!(
            u32::from_be_bytes([packet[6], packet[7], packet[8], packet[9]]),
            12
        );
    }

    /// A request takes a connection out of the unauthenticated caps (and gives its token back)
    /// but not out of the open caps: a flood of connections that each sent a `ping` is still
    /// refused, per source and in all, with the key to raise named.
    #[test]
    fn requests_leave_the_unauthenticated_caps_but_not_the_open_ones() {
        let open = OpenLimits {
            max_connections: 5,
            max_per_address: 3,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        };
        let door = Door::new(
            "https",
            Limits {
                open: Some(open),
                ..limits(100, 2, 1)
            },
        );
        let mut held = vec![];
        for _ in 0..3 {
            let c = door.admit(ip("10.0.0.1")).map(Unauthenticated::requested);
            held.push(c.unwrap_or_else(|r| panic!("refused under the caps: {r}")));
        }
        assert_eq!((door.unauthenticated(), door.open()), (0, 3));
        let refused = door.admit(ip("10.0.0.1")).err();
        assert_eq!(
            refused,
            Some(Refusal::OpenAddress {
                source: "10.0.0.1".into(),
                max: 3
            })
        );
        assert!(
            refused
                .map(|r| r.to_string())
                .unwrap_or_default()
                .contains("(max_connections_per_address: 3)")
        );
        // The same /64 is the same source.
        held.extend((1..=3).filter_map(|i| {
            door.admit(ip(&format!("2001:db8::{i}")))
                .ok()
                .map(Unauthenticated::requested)
        }));
        assert_eq!(held.len(), 5);
        // Every address together: the global cap.
        let refused = door.admit(ip("10.0.0.9")).err();
        assert_eq!(refused, Some(Refusal::Open { max: 5 }));
        assert!(
            refused
                .map(|r| r.to_string())
                .unwrap_or_default()
                .contains("(max_connections: 5)")
        );
        // Closing connections makes room.
        held.clear();
        assert_eq!(door.open(), 0);
        assert!(door.admit(ip("10.0.0.1")).is_ok());
        // An unauthenticated connection counts under both, and leaves both when dropped.
        let pending = door.admit(ip("10.0.0.2"));
        assert_eq!((door.unauthenticated(), door.open()), (1, 1));
        drop(pending);
        assert_eq!((door.unauthenticated(), door.open()), (0, 0));
    }
}
