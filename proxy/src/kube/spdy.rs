//! `kubectl exec` and `attach` over SPDY/3.1: kubectl's other stream protocol, which it uses
//! with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` and after a WebSocket try that failed. A
//! second front end of the same session as `exec`'s WebSocket one ([`exec::drive`]): only the
//! framing differs.
//!
//! 1. `open_exec` (`super`) decided, granted and dialed the session exactly as for a
//!    WebSocket, before kubectl was answered: a refusal is an HTTP Status, the same on both of
//!    kubectl's tries.
//! 2. The answer is 101 (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version:
//!    v4.channel.k8s.io`), and the connection a SPDY session ([`sallyport_core::spdy`]).
//! 3. kubectl opens one stream per kind, named by its `streamType` header (error, stdin,
//!    stdout, stderr, resize), each after the last one's reply; every one is replied to, as the
//!    kubelet does, and the session waits for those the query asked for ([`Expected`]).
//! 4. The session runs: stdin's bytes and its FIN, and resize's JSON sizes, become commands;
//!    output goes to stdout and stderr; at the end, the Status on the error stream, every
//!    stream's FIN, and GOAWAY. kubectl's input is taken no faster than the node takes it
//!    ([`INPUT_WINDOW`]): a stdin stream that is not read stops the SPDY connection's reading,
//!    and kubectl's writing with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use sallyport_core::kube::KubeExec;
use sallyport_core::spdy::{Config, End, RecvStream, SendStream, Session, Side};
use tokio::sync::{Mutex, mpsc};

use super::exec::{self, Input, Streams};
use crate::session::Target;
use crate::session::window::InputWindow;
use crate::state::{OpenConnection, ProxyState};

pub const UPGRADE: &str = "SPDY/3.1";
/// The one stream protocol served over SPDY: its error stream carries a `metav1.Status`, as
/// WebSocket v4's does. kubectl has offered it since 1.5, beside older ones.
pub const PROTOCOL: &str = exec::V4;

/// How long kubectl has to open its streams once upgraded (the kubelet's
/// `streamCreationTimeout`).
const STREAMS_TIMEOUT: Duration = Duration::from_secs(30);
/// kubectl's input taken but not yet handed to the node.
pub const INPUT_WINDOW: u32 = 1024 * 1024;
/// A resize message, at most, before its end.
const MAX_RESIZE: usize = 4096;

fn tokens<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Whether the request asks to upgrade to SPDY/3.1.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    tokens(headers, header::UPGRADE.as_str()).any(|t| t.eq_ignore_ascii_case(UPGRADE))
        && tokens(headers, header::CONNECTION.as_str()).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

/// The stream protocol served for a SPDY upgrade, when the request offers it.
pub fn offered(headers: &HeaderMap) -> Option<&'static str> {
    (is_upgrade(headers) && tokens(headers, "x-stream-protocol-version").any(|p| p == PROTOCOL))
        .then_some(PROTOCOL)
}

/// The answer that hands the connection over to SPDY.
pub fn switching(protocol: &'static str) -> Response {
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static(UPGRADE));
    h.insert(
        "x-stream-protocol-version",
        HeaderValue::from_static(protocol),
    );
    resp
}

/// The streams kubectl opens for an exec, from its query (a terminal has no stderr, as the
/// kubelet insists, and has a resize stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub resize: bool,
}

impl Expected {
    pub fn of(q: &exec::ExecQuery) -> Self {
        Expected {
            stdin: q.stdin,
            stdout: q.stdout,
            stderr: q.stderr && !q.tty,
            resize: q.tty,
        }
    }
}

/// kubectl's streams, by kind.
#[derive(Default)]
pub struct Kinds {
    pub error: Option<sallyport_core::spdy::Stream>,
    pub stdin: Option<sallyport_core::spdy::Stream>,
    pub stdout: Option<sallyport_core::spdy::Stream>,
    pub stderr: Option<sallyport_core::spdy::Stream>,
    pub resize: Option<sallyport_core::spdy::Stream>,
}

impl Kinds {
    fn complete(&self, e: Expected) -> bool {
        self.error.is_some()
            && (!e.stdin || self.stdin.is_some())
            && (!e.stdout || self.stdout.is_some())
            && (!e.stderr || self.stderr.is_some())
            && (!e.resize || self.resize.is_some())
    }
}

/// Replies to every stream kubectl opens until it has opened those `expected`, within
/// `timeout`; `Err` with what it did open (the error stream, to say why).
pub async fn accept_streams(
    incoming: &mut sallyport_core::spdy::Incoming,
    expected: Expected,
    timeout: Duration,
) -> Result<Kinds, Kinds> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut kinds = Kinds::default();
    while !kinds.complete(expected) {
        let Ok(Some(req)) = tokio::time::timeout_at(deadline, incoming.next()).await else {
            return Err(kinds);
        };
        let kind = req
            .headers
            .get("streamtype")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let Ok(stream) = req.accept().await else {
            return Err(kinds);
        };
        let slot = match kind.as_str() {
            "error" => &mut kinds.error,
            "stdin" => &mut kinds.stdin,
            "stdout" => &mut kinds.stdout,
            "stderr" => &mut kinds.stderr,
            "resize" => &mut kinds.resize,
            // Replied to and dropped, as the kubelet ignores a kind it does not know.
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(stream);
        }
    }
    Ok(kinds)
}

/// kubectl's SPDY streams, written.
pub struct SpdyStreams {
    session: Session,
    stdout: Option<Mutex<SendStream>>,
    stderr: Option<Mutex<SendStream>>,
    error: Mutex<Option<SendStream>>,
    /// The halves nothing is written to (stdin's, resize's): half-closed at the end too, as
    /// kubectl waits for its stdin stream's end.
    idle: Mutex<Vec<SendStream>>,
    gone: AtomicBool,
    window: Arc<InputWindow>,
}

impl SpdyStreams {
    /// The writing halves of `kinds`; the reading halves of stdin and resize are returned.
    pub fn new(
        session: Session,
        kinds: Kinds,
        window: Arc<InputWindow>,
    ) -> (Self, Option<RecvStream>, Option<RecvStream>) {
        let mut idle = Vec::new();
        let (mut stdin, mut resize) = (None, None);
        if let Some(s) = kinds.stdin {
            idle.push(s.send);
            stdin = Some(s.recv);
        }
        if let Some(s) = kinds.resize {
            idle.push(s.send);
            resize = Some(s.recv);
        }
        let streams = SpdyStreams {
            session,
            stdout: kinds.stdout.map(|s| Mutex::new(s.send)),
            stderr: kinds.stderr.map(|s| Mutex::new(s.send)),
            error: Mutex::new(kinds.error.map(|s| s.send)),
            idle: Mutex::new(idle),
            gone: AtomicBool::new(false),
            window,
        };
        (streams, stdin, resize)
    }
}

impl Streams for SpdyStreams {
    async fn output(&self, stderr: bool, data: Bytes) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return false;
        }
        // A terminal has no stderr stream: what the agent says there goes to stdout.
        let (first, second) = if stderr {
            (&self.stderr, &self.stdout)
        } else {
            (&self.stdout, &self.stderr)
        };
        let Some(to) = first.as_ref().or(second.as_ref()) else {
            return true;
        };
        let ok = to.lock().await.write(data).await.is_ok();
        if !ok {
            self.gone.store(true, Ordering::Release);
        }
        ok
    }

    async fn finish(&self, status: serde_json::Value) {
        if let Some(mut e) = self.error.lock().await.take() {
            let body = serde_json::to_vec(&status).unwrap_or_default();
            let _ = e.write(Bytes::from(body)).await;
            let _ = e.finish().await;
        }
        for s in [&self.stdout, &self.stderr].into_iter().flatten() {
            let _ = s.lock().await.finish().await;
        }
        for mut s in self.idle.lock().await.drain(..) {
            let _ = s.finish().await;
        }
        self.gone.store(true, Ordering::Release);
        self.session.close().await;
    }

    fn window(&self) -> Option<u32> {
        Some(INPUT_WINDOW)
    }

    fn abort(&self) {
        self.gone.store(true, Ordering::Release);
        self.session.abort();
    }

    fn consumed(&self, bytes: usize) {
        self.window.consumed(bytes);
    }
}

/// Sizes in a resize stream's bytes so far (JSON objects, newline-separated as Go's encoder
/// writes them, or not); what is incomplete stays in `buf`.
pub fn resizes(buf: &mut Vec<u8>, data: &[u8]) -> Vec<(u32, u32)> {
    buf.extend_from_slice(data);
    let mut sizes = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(buf).into_iter::<serde::de::IgnoredAny>();
    let mut start = 0;
    let taken = loop {
        match de.next() {
            Some(Ok(_)) => {
                let end = de.byte_offset();
                if let Some(s) = exec::resize(&buf[start..end]) {
                    sizes.push(s);
                }
                start = end;
            }
            Some(Err(e)) if e.is_eof() => break start,
            // Not JSON: nothing of it can be read.
            Some(Err(_)) | None => break buf.len(),
        }
    };
    buf.drain(..taken);
    if buf.len() > MAX_RESIZE {
        buf.clear();
    }
    sizes
}

/// Reads kubectl's stdin and resize streams into `tx`, stdin no faster than the node takes it;
/// [`Input::Closed`] once kubectl's side of the connection is over.
async fn read_input(
    session: Session,
    mut stdin: Option<RecvStream>,
    mut resize: Option<RecvStream>,
    window: Arc<InputWindow>,
    tx: mpsc::Sender<Input>,
) {
    let mut partial = Vec::new();
    loop {
        let input = tokio::select! {
            biased;
            d = async {
                window.room().await;
                match stdin.as_mut() {
                    Some(s) => s.read().await,
                    None => None,
                }
            }, if stdin.is_some() => match d {
                Some(data) => {
                    window.took(data.len());
                    vec![Input::Data(data)]
                }
                None => {
                    let end = stdin.take().and_then(|s| s.end());
                    // The connection's end is said once, below.
                    if end == Some(End::Closed) { vec![] } else { vec![Input::Eof] }
                }
            },
            r = async {
                match resize.as_mut() {
                    Some(s) => s.read().await,
                    None => None,
                }
            }, if resize.is_some() => match r {
                Some(data) => resizes(&mut partial, &data)
                    .into_iter()
                    .map(|(cols, rows)| Input::Resize { cols, rows })
                    .collect(),
                None => {
                    resize = None;
                    vec![]
                }
            },
            _ = session.ended() => {
                let _ = tx.send(Input::Closed).await;
                return;
            }
        };
        for i in input {
            if tx.send(i).await.is_err() {
                return;
            }
        }
    }
}

/// Runs one granted exec session on kubectl's SPDY connection, once `upgrade` completes,
/// until either side ends it; `_counted` keeps it among its user's open connections.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    state: Arc<ProxyState>,
    target: Target,
    exec: KubeExec,
    expected: Expected,
    pending: exec::Pending,
    _counted: Arc<OpenConnection>,
    upgrade: hyper::upgrade::OnUpgrade,
) {
    let upgraded = match upgrade.await {
        Ok(u) => u,
        Err(e) => {
            // `pending`, dropped, ends the session in auth.
            tracing::debug!(error = %e, "kubectl's SPDY upgrade did not complete");
            return;
        }
    };
    let (session, mut incoming) =
        Session::start(TokioIo::new(upgraded), Side::Server, Config::default());
    let mut kinds = match accept_streams(&mut incoming, expected, STREAMS_TIMEOUT).await {
        Ok(k) => k,
        Err(k) => {
            if let Some(mut e) = k.error.map(|s| s.send) {
                let why = "timed out waiting for client to create streams";
                let status = sallyport_core::kube::status(500, "InternalError", why);
                let _ = e
                    .write(Bytes::from(serde_json::to_vec(&status).unwrap_or_default()))
                    .await;
                let _ = e.finish().await;
            }
            session.close().await;
            return;
        }
    };
    // Streams kubectl opens later are refused; a stdin the exec did not ask for is not read.
    drop(incoming);
    if !expected.stdin {
        kinds.stdin = None;
    }
    let Some(opened) = pending.take() else {
        return;
    };
    let window = Arc::new(InputWindow::new(INPUT_WINDOW as usize));
    let (streams, stdin, resize) = SpdyStreams::new(session.clone(), kinds, window.clone());
    let (tx, rx) = mpsc::channel(16);
    let reader = tokio::spawn(read_input(session, stdin, resize, window, tx));
    let input = Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|i| (i, rx))
    }));
    exec::drive(state, target, exec, opened, streams, input).await;
    reader.abort();
}

#[cfg(test)]
mod tests;
