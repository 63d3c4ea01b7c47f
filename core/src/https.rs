//! Serving an axum router over TLS with the peer's verified certificate chain and address
//! attached to every request, so handlers authorize from what the handshake proved — never
//! from a header.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::CertificateDer;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;
use tower::ServiceExt;

/// The certificates the client presented and rustls verified (empty when none).
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// The TCP peer address of the connection a request arrived on.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections whose TLS ClientHello offers `alpn` are not terminated here: their bytes are
/// piped unchanged to `target`, so mutual TLS runs end to end between the client and `target`
/// (how `sallyctl` reaches auth through the proxy's web port).
#[derive(Debug, Clone)]
pub struct Passthrough {
    pub alpn: Vec<u8>,
    pub target: String,
}

/// Accepts connections until the task is dropped; each connection runs on its own task.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: axum::Router,
    passthrough: Option<Passthrough>,
) {
    let passthrough = passthrough.map(Arc::new);
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
        tokio::spawn(async move {
            match tokio::time::timeout(
                HANDSHAKE_TIMEOUT,
                handshake(tcp, tls, passthrough.as_deref()),
            )
            .await
            {
                Ok(Ok(Some(stream))) => serve_connection(stream, addr, router).await,
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::debug!(peer = %addr, error = %e, "tls handshake failed"),
                Err(_) => tracing::debug!(peer = %addr, "tls handshake timed out"),
            }
        });
    }
}

type Stream = tokio_rustls::server::TlsStream<Recorder>;

/// Completes the TLS handshake, or hands the connection to its passthrough target (`None`).
async fn handshake(
    tcp: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    passthrough: Option<&Passthrough>,
) -> std::io::Result<Option<Stream>> {
    let recorder = Recorder {
        inner: tcp,
        seen: Vec::new(),
        recording: passthrough.is_some(),
    };
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), recorder).await?;
    if let Some(p) = passthrough {
        let wants = start
            .client_hello()
            .alpn()
            .is_some_and(|mut protos| protos.any(|a| a == p.alpn.as_slice()));
        if wants {
            let Recorder {
                inner: mut client,
                seen,
                ..
            } = start.io;
            let target = p.target.clone();
            tokio::spawn(async move {
                let Ok(Ok(mut upstream)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(&target)).await
                else {
                    tracing::warn!(%target, "passthrough target unreachable");
                    return;
                };
                let _ = upstream.set_nodelay(true);
                if upstream.write_all(&seen).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
            return Ok(None);
        }
    }
    let mut start = start;
    start.io.recording = false;
    start.io.seen = Vec::new();
    start.into_stream(tls).await.map(Some)
}

async fn serve_connection(tls: Stream, addr: SocketAddr, router: axum::Router) {
    let peer = PeerCertificates(Arc::new(
        tls.get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    ));
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(RemoteAddr(addr));
        router.clone().oneshot(req.map(axum::body::Body::new))
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(tls), svc)
        .await
    {
        tracing::debug!(peer = %addr, error = %e, "connection ended with error");
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
