//! The reverse tunnel: one long-lived TLS connection from an agent to the proxy, multiplexed
//! with yamux so that every session is its own stream (with its own flow control) and no server
//! ever listens for inbound connections. The proxy opens streams; the agent accepts them. The
//! agent also opens one stream of its own for heartbeats and label updates.
//!
//! This module owns only the multiplexing; who may open a tunnel is decided by the TLS handshake
//! (the agent's host certificate) before a connection gets here.

use std::collections::VecDeque;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

/// One stream of a tunnel: a plain bidirectional byte stream.
pub type TunnelStream = Compat<yamux::Stream>;

/// Which side of the tunnel this is.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    /// The proxy: opens session streams.
    Proxy,
    /// The agent: accepts session streams.
    Agent,
}

#[derive(Debug, thiserror::Error)]
#[error("tunnel closed")]
pub struct Closed;

/// Opens streams on a running tunnel; cheap to clone.
#[derive(Clone, Debug)]
pub struct Opener {
    tx: mpsc::Sender<oneshot::Sender<Result<TunnelStream, Closed>>>,
}

impl Opener {
    pub async fn open(&self) -> Result<TunnelStream, Closed> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(tx).await.map_err(|_| Closed)?;
        rx.await.map_err(|_| Closed)?
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Room for one whole yamux frame, no more (every tunnel has one, idle ones too): a 12-byte
/// header and a body of at most yamux's split size (16 KiB; larger writes are split into
/// frames of that size).
const FRAME_BUFFER: usize = 12 + 16 * 1024;

fn config() -> yamux::Config {
    let mut c = yamux::Config::default();
    c.set_max_num_streams(1024);
    // Let a busy stream grow its window up to 16 MiB for bulk copies over the tunnel.
    c.set_max_connection_receive_window(Some(1024 * 1024 * 1024));
    c
}

/// Runs the multiplexer over `io` until the connection ends. Returns the opener and the streams
/// the other side opens; the tunnel is gone when the receiver yields `None`.
pub fn run<T>(io: T, side: Side) -> (Opener, mpsc::Receiver<TunnelStream>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mode = match side {
        Side::Proxy => yamux::Mode::Client,
        Side::Agent => yamux::Mode::Server,
    };
    // yamux writes a frame's 12-byte header and its body with two writes; over TLS each would
    // be a record and a segment of its own, and the peer woken for each. Buffered, a frame
    // goes out whole when yamux flushes, which it does after every frame it writes.
    let io = tokio::io::BufWriter::with_capacity(FRAME_BUFFER, io);
    let mut conn = yamux::Connection::new(io.compat(), config(), mode);
    let (open_tx, mut open_rx) = mpsc::channel::<oneshot::Sender<Result<TunnelStream, Closed>>>(64);
    let (in_tx, in_rx) = mpsc::channel::<TunnelStream>(64);
    tokio::spawn(async move {
        let mut waiting: VecDeque<oneshot::Sender<Result<TunnelStream, Closed>>> = VecDeque::new();
        let mut requests_open = true;
        let result = std::future::poll_fn(|cx| {
            while requests_open {
                match open_rx.poll_recv(cx) {
                    Poll::Ready(Some(r)) => waiting.push_back(r),
                    Poll::Ready(None) => requests_open = false,
                    Poll::Pending => break,
                }
            }
            while !waiting.is_empty() {
                match conn.poll_new_outbound(cx) {
                    Poll::Ready(Ok(s)) => {
                        if let Some(w) = waiting.pop_front() {
                            let _ = w.send(Ok(s.compat()));
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
            }
            loop {
                match conn.poll_next_inbound(cx) {
                    Poll::Ready(Some(Ok(s))) => {
                        // A peer that opens more streams than we consume loses the extras.
                        let _ = in_tx.try_send(s.compat());
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(None) => return Poll::Ready(Ok(())),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "tunnel ended");
        }
        for w in waiting {
            let _ = w.send(Err(Closed));
        }
    });
    (Opener { tx: open_tx }, in_rx)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

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
