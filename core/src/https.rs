//! Serving an axum router over TLS with the peer's verified certificate chain and address
//! attached to every request, so handlers authorize from what the handshake proved — never
//! from a header.
//!
//! Bounded under abuse: a connection counts against its door's unauthenticated caps
//! (`crate::door`) until its first request arrives, and against the door's caps on all open
//! connections (when it has them: the proxy's door) until it closes, since any request, an
//! anonymous `ping` too, takes it out of the first; beyond the caps it is answered 429 (or
//! closed, when many are being refused at once). The TLS handshake must finish within
//! [`HANDSHAKE_TIMEOUT`], request headers arrive within [`HEADER_READ_TIMEOUT`] (which also
//! closes idle HTTP/1.1 keep-alives), and a connection without request activity (a request
//! starting, a byte of a request or response body; not HTTP/2 PINGs or other frames a client
//! can send for free) for the idle timeout ([`IDLE_TIMEOUT`] unless the door's
//! [`door::OpenLimits`] say otherwise) is asked to close (HTTP/2 GOAWAY), then dropped after as
//! long again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::CertificateDer;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;
use tower::ServiceExt;

use crate::door::{self, Door};

/// The certificates the client presented and rustls verified (empty when none).
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// The TCP peer address of the connection a request arrived on.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// A TLS handshake takes a few round trips; more is a client holding a connection open.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// hyper's own default, which it applies only when given a timer (we had none before).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// No request activity for this long: the connection is asked to close.
pub const IDLE_TIMEOUT: Duration = door::DEFAULT_IDLE_TIMEOUT;

/// Connections whose TLS ClientHello offers `alpn` are not terminated here: their bytes are
/// piped unchanged to a target, so mutual TLS runs end to end between the client and the target
/// (how `sallyctl` reaches auth through the proxy's web port). With several targets (auth
/// instances), the first that accepts the connection gets it.
#[derive(Debug, Clone)]
pub struct Passthrough {
    pub alpn: Vec<u8>,
    pub targets: Vec<String>,
}

/// The certificates a listener answers with: one configuration for every client, or on the
/// proxy's web port the cluster's for Sallyport's own clients (they offer
/// [`crate::webcert::CLUSTER_ALPN`]) and public ones for everyone else (browsers).
#[derive(Clone)]
pub struct Certs {
    cluster: Arc<rustls::ServerConfig>,
    public: Option<Arc<crate::webcert::PublicCerts>>,
}

impl Certs {
    pub fn new(
        cluster: Arc<rustls::ServerConfig>,
        public: Option<Arc<crate::webcert::PublicCerts>>,
    ) -> Self {
        Certs { cluster, public }
    }

    fn for_hello(&self, hello: &rustls::server::ClientHello<'_>) -> Arc<rustls::ServerConfig> {
        let ours = hello
            .alpn()
            .is_some_and(|mut p| p.any(|a| a == crate::webcert::CLUSTER_ALPN));
        match &self.public {
            Some(public) if !ours => public.config(),
            _ => self.cluster.clone(),
        }
    }
}

impl From<Arc<rustls::ServerConfig>> for Certs {
    fn from(cluster: Arc<rustls::ServerConfig>) -> Self {
        Certs {
            cluster,
            public: None,
        }
    }
}

/// Accepts connections until the task is dropped; each connection runs on its own task,
/// admitted under `limits` (see the module doc).
pub async fn serve(
    listener: TcpListener,
    tls: impl Into<Certs>,
    router: axum::Router,
    passthrough: Option<Passthrough>,
    limits: door::Limits,
) {
    let tls: Certs = tls.into();
    let passthrough = passthrough.map(Arc::new);
    let idle = limits.open.map_or(IDLE_TIMEOUT, |o| o.idle_timeout);
    let door = Door::new("https", limits);
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (tls, router, passthrough) = (tls.clone(), router.clone(), passthrough.clone());
        let counted = match door.admit(addr.ip()) {
            Ok(c) => c,
            Err(refusal) => {
                if let Some(permit) = door::telling_permit() {
                    tokio::spawn(async move {
                        refuse(tcp, tls, passthrough, refusal.to_string()).await;
                        drop(permit);
                    });
                }
                continue;
            }
        };
        tokio::spawn(async move {
            match tokio::time::timeout(
                HANDSHAKE_TIMEOUT,
                handshake(tcp, tls, passthrough.as_deref()),
            )
            .await
            {
                Ok(Ok(Handshake::Done(stream))) => {
                    serve_connection(*stream, addr, router, counted, idle).await
                }
                Ok(Ok(Handshake::Passthrough {
                    client,
                    seen,
                    target,
                })) => pipe(client, seen, target, counted).await,
                Ok(Err(e)) => tracing::debug!(peer = %addr, error = %e, "tls handshake failed"),
                Err(_) => tracing::debug!(peer = %addr, "tls handshake timed out"),
            }
        });
    }
}

type Stream = tokio_rustls::server::TlsStream<Recorder>;

enum Handshake {
    /// Boxed: a TLS stream is far larger than the other variant.
    Done(Box<Stream>),
    /// A connection for the passthrough target, with the bytes already read from it.
    Passthrough {
        client: TcpStream,
        seen: Vec<u8>,
        target: Vec<String>,
    },
}

fn wants_passthrough(hello: &rustls::server::ClientHello<'_>, p: &Passthrough) -> bool {
    hello
        .alpn()
        .is_some_and(|mut protos| protos.any(|a| a == p.alpn.as_slice()))
}

/// Completes the TLS handshake, or reads enough to hand the connection to its passthrough
/// target.
async fn handshake(
    tcp: TcpStream,
    tls: Certs,
    passthrough: Option<&Passthrough>,
) -> std::io::Result<Handshake> {
    let recorder = Recorder {
        inner: tcp,
        seen: Vec::new(),
        recording: passthrough.is_some(),
    };
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), recorder).await?;
    if let Some(p) = passthrough
        && wants_passthrough(&start.client_hello(), p)
    {
        let Recorder {
            inner: client,
            seen,
            ..
        } = start.io;
        return Ok(Handshake::Passthrough {
            client,
            seen,
            target: p.targets.clone(),
        });
    }
    let config = tls.for_hello(&start.client_hello());
    let mut start = start;
    start.io.recording = false;
    start.io.seen = Vec::new();
    start
        .into_stream(config)
        .await
        .map(|s| Handshake::Done(Box::new(s)))
}

/// Pipes a passthrough connection to its target. The mutual TLS it carries is checked there,
/// out of our sight, so it stays counted against this door for as long as a handshake may take.
async fn pipe(
    mut client: TcpStream,
    seen: Vec<u8>,
    targets: Vec<String>,
    counted: door::Unauthenticated,
) {
    let mut upstream = None;
    for target in &targets {
        match tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(target)).await {
            Ok(Ok(s)) => {
                upstream = Some(s);
                break;
            }
            _ => tracing::warn!(%target, "passthrough target unreachable"),
        }
    }
    let Some(mut upstream) = upstream else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    if upstream.write_all(&seen).await.is_err() {
        return;
    }
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    tokio::select! {
        _ = &mut copy => return,
        () = tokio::time::sleep(HANDSHAKE_TIMEOUT) => drop(counted),
    }
    let _ = copy.await;
}

/// Answers a connection beyond the door's caps with 429 and the reason (the caller holds a
/// `door::telling_permit`; without one the connection is just closed). A passthrough client
/// expects the target's TLS, not ours: it is closed too.
async fn refuse(tcp: TcpStream, tls: Certs, passthrough: Option<Arc<Passthrough>>, reason: String) {
    let _ = tokio::time::timeout(door::telling_time(), async move {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await?;
        if let Some(p) = passthrough.as_deref()
            && wants_passthrough(&start.client_hello(), p)
        {
            return Ok(());
        }
        let config = tls.for_hello(&start.client_hello());
        let stream = start.into_stream(config).await?;
        let svc = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
            let reason = reason.clone();
            async move {
                use axum::response::IntoResponse;
                let answer = (
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    [(axum::http::header::CONNECTION, "close")],
                    axum::Json(serde_json::json!({ "error": reason })),
                )
                    .into_response();
                Ok::<_, std::convert::Infallible>(answer)
            }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().keep_alive(false);
        let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Where a connection stands in its door's count.
enum Count {
    /// No request yet: under the unauthenticated caps.
    Waiting(door::Unauthenticated),
    /// Under the open caps only, until the connection closes.
    /// Held for its drop.
    Requested(#[allow(dead_code)] door::Open),
    Gone,
}

async fn serve_connection(
    tls: Stream,
    addr: SocketAddr,
    router: axum::Router,
    counted: door::Unauthenticated,
    idle: Duration,
) {
    let peer = PeerCertificates(Arc::new(
        tls.get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    ));
    // The first request takes a connection out of the door's unauthenticated count: a peer that
    // has sent one is no longer holding a connection open for nothing. It stays counted as an
    // open connection (the guard lives as long as this function).
    let count = Arc::new(std::sync::Mutex::new(Count::Waiting(counted)));
    let waiting = |count: &std::sync::Mutex<Count>| {
        count
            .lock()
            .map(|c| matches!(*c, Count::Waiting(_)))
            .unwrap_or(false)
    };
    let last = Arc::new(AtomicU64::new(crate::unix_now_ms()));
    let (pending, active) = (count.clone(), last.clone());
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        if let Ok(mut c) = pending.lock()
            && let Count::Waiting(u) = std::mem::replace(&mut *c, Count::Gone)
        {
            *c = Count::Requested(u.requested());
        }
        active.store(crate::unix_now_ms(), Ordering::Relaxed);
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(RemoteAddr(addr));
        let last = active.clone();
        let req = req.map(|b| {
            axum::body::Body::new(Active {
                inner: b,
                last: last.clone(),
            })
        });
        let answer = router.clone().oneshot(req);
        async move {
            let resp = answer.await?;
            Ok::<_, std::convert::Infallible>(resp.map(|b| Active { inner: b, last }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    let first_request_by = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    let mut asked_to_close = false;
    loop {
        let before_first = waiting(&count);
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(peer = %addr, error = %e, "connection ended with error");
                }
                return;
            }
            // HTTP/2 has no header timeout of its own: no first request in time, no connection.
            () = tokio::time::sleep_until(first_request_by), if before_first => {
                if waiting(&count) {
                    tracing::debug!(peer = %addr, "no request in time");
                    return;
                }
            }
            () = tokio::time::sleep(idle / 4) => {
                let quiet = crate::unix_now_ms().saturating_sub(last.load(Ordering::Relaxed));
                if quiet >= 2 * idle.as_millis() as u64 {
                    tracing::debug!(peer = %addr, "idle connection dropped");
                    return;
                }
                if quiet >= idle.as_millis() as u64 && !asked_to_close {
                    asked_to_close = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A request or response body that notes when a frame of it last moved: that is request
/// activity, which keeps a connection open; bytes a client can send for free (HTTP/2 PINGs,
/// SETTINGS, WINDOW_UPDATE) are not.
struct Active<B> {
    inner: B,
    last: Arc<AtomicU64>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Active<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            self.last.store(crate::unix_now_ms(), Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A TCP stream that remembers the bytes read while `recording` (the ClientHello), so that a
/// passthrough can replay them to its target.
pub struct Recorder {
    inner: TcpStream,
    seen: Vec<u8>,
    recording: bool,
}

/// A ClientHello is far smaller; more than this while recording is not a TLS client.
const MAX_RECORDED: usize = 64 * 1024;

impl AsyncRead for Recorder {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.recording
            && let Poll::Ready(Ok(())) = &r
        {
            let new = buf.filled()[before..].to_vec();
            if self.seen.len() + new.len() > MAX_RECORDED {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "ClientHello too large",
                )));
            }
            self.seen.extend_from_slice(&new);
        }
        r
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
