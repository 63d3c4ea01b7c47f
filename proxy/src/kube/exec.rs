//! `kubectl exec` and `attach` as a session of the session engine: the door reads kubectl's
//! stream protocol and speaks it as [`Command`]s and [`Event`]s, exactly as the SSH door speaks
//! SSH. The session is granted by auth (the exec signed into the per-session certificate),
//! dialed over SSH inside the kube agent's tunnel, relayed, recorded and audited by
//! `crate::session`, like every session.
//!
//! Two front ends share what a session is ([`ExecDoor`], [`drive`]): this module's WebSocket
//! one and SPDY/3.1's (`super::spdy`). Each only turns kubectl's protocol into [`Input`] and
//! writes its [`Streams`].
//!
//! The WebSocket channel protocol (`v5.channel.k8s.io` or `v4.channel.k8s.io`): each binary
//! message starts with its stream: 0 stdin, 1 stdout, 2 stderr, 3 the error stream (one
//! `metav1.Status` at the end), 4 resize (`{"Width":W,"Height":H}`); v5 adds `255, 0`: the
//! client closed stdin.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use sallyport_core::kube::KubeExec;
use tokio::sync::{Mutex, mpsc};

use crate::session::relay::Opened;
use crate::session::{Command, Door, Event, Refusal, Target};
use crate::state::{HangUp, ProxyState};

pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// The most one message from kubectl may carry (its own frames are 32 KiB at most).
pub const MAX_MESSAGE: usize = 1024 * 1024;
/// How long a terminal session waits for kubectl's first resize to size the recording.
const FIRST_RESIZE: Duration = Duration::from_secs(1);
/// How long the end (the final Status, the streams' close) may wait for kubectl to read it: a
/// kubectl that stopped reading must not hold the session's tasks and connection.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Reads what kubectl asked for from the exec or attach query.
pub fn read_query(query: &str, subresource: &str) -> Result<ExecQuery, String> {
    let mut q = ExecQuery::default();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        let on = matches!(v.as_ref(), "true" | "1");
        match k.as_ref() {
            "command" => q.command.push(v.into_owned()),
            "container" => q.container = v.into_owned(),
            "stdin" => q.stdin = on,
            "stdout" => q.stdout = on,
            "stderr" => q.stderr = on,
            "tty" => q.tty = on,
            _ => {}
        }
    }
    if subresource == "exec" && q.command.is_empty() {
        return Err("you must specify at least one command for the container".into());
    }
    Ok(q)
}

#[derive(Debug, Default, Clone)]
pub struct ExecQuery {
    pub command: Vec<String>,
    pub container: String,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The `metav1.Status` kubectl reads on the error stream at the end.
fn end_status(exit: Option<u32>, why: Option<&Refusal>) -> serde_json::Value {
    match (why, exit) {
        (Some(r), _) => serde_json::json!({
            "metadata": {}, "status": "Failure", "message": r.to_string(),
            "reason": "InternalError", "code": 500,
        }),
        (None, Some(0)) => serde_json::json!({"metadata": {}, "status": "Success"}),
        (None, Some(n)) => serde_json::json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command [{n}]"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": n.to_string()}]},
        }),
        (None, None) => serde_json::json!({
            "metadata": {}, "status": "Failure",
            "message": "the session ended without an exit status",
            "reason": "InternalError", "code": 500,
        }),
    }
}

fn framed(stream: u8, data: &[u8]) -> Message {
    let mut b = BytesMut::with_capacity(data.len() + 1);
    b.put_u8(stream);
    b.put_slice(data);
    Message::Binary(b.freeze())
}

/// kubectl's side of an exec session, as a front end writes it.
pub trait Streams: Send + Sync + 'static {
    /// Output on stdout, or on stderr when `stderr`; false once kubectl is gone.
    fn output(&self, stderr: bool, data: Bytes) -> impl std::future::Future<Output = bool> + Send;

    /// The final Status on the error stream, then the end of every stream and of the
    /// connection.
    fn finish(&self, status: serde_json::Value) -> impl std::future::Future<Output = ()> + Send;

    /// As [`Door::window`], for a front end that holds kubectl's input back until the node
    /// took it.
    fn window(&self) -> Option<u32> {
        None
    }

    /// As [`Door::consumed`].
    fn consumed(&self, _bytes: usize) {}

    /// [`Streams::finish`] did not complete in time: whatever still holds kubectl's
    /// connection lets it go (dropping the streams does, unless a task of their own writes).
    fn abort(&self) {}
}

/// What a front end read from kubectl, in order.
#[derive(Debug)]
pub enum Input {
    Data(Bytes),
    /// kubectl closed stdin.
    Eof,
    Resize {
        cols: u32,
        rows: u32,
    },
    /// Anything else on kubectl's streams: the person is there.
    Other,
    /// A keep-alive: not the person's activity (`client_idle_timeout`).
    KeepAlive,
    /// kubectl is gone.
    Closed,
    /// kubectl broke the protocol (a message too large).
    Broken,
}

/// The door's side of one exec session: the engine's events as kubectl's streams.
pub struct ExecDoor<S> {
    streams: S,
    /// Requests sent before the command (`pty-req` for a terminal): their replies come first.
    replies_before_exec: u32,
    replies: AtomicU32,
    /// The exec's own reply was a refusal: the agent says why on stderr, which is then the
    /// error stream's Status, not output.
    refused: AtomicBool,
    refusal: std::sync::Mutex<Vec<u8>>,
    exit: std::sync::Mutex<Option<u32>>,
    /// Told once the end was written (or given up on): the front end stops reading kubectl.
    ended: tokio::sync::Notify,
    /// [`FINISH_WAIT`].
    finish_wait: Duration,
    /// The end was written (or is being written): kubectl reads one Status, never two.
    finished: AtomicBool,
}

impl<S: Streams> ExecDoor<S> {
    fn new(streams: S, tty: bool) -> Self {
        ExecDoor {
            streams,
            replies_before_exec: u32::from(tty),
            replies: AtomicU32::new(0),
            refused: AtomicBool::new(false),
            refusal: std::sync::Mutex::new(Vec::new()),
            exit: std::sync::Mutex::new(None),
            ended: tokio::sync::Notify::new(),
            finish_wait: FINISH_WAIT,
            finished: AtomicBool::new(false),
        }
    }

    /// Writes the end to kubectl, waiting at most [`FINISH_WAIT`] for it to be read; what is
    /// left then goes when the connection is dropped.
    async fn finish(&self, status: serde_json::Value) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        if tokio::time::timeout(self.finish_wait, self.streams.finish(status))
            .await
            .is_err()
        {
            tracing::info!("kubectl did not read the end of its exec session: dropped");
            self.streams.abort();
        }
        self.ended.notify_one();
    }
}

impl<S: Streams> Door for ExecDoor<S> {
    async fn send(&self, event: Event) -> bool {
        match event {
            Event::Data { ext, data } => {
                if self.refused.load(Ordering::Acquire) {
                    if let Ok(mut r) = self.refusal.lock()
                        && r.len() < 64 * 1024
                    {
                        r.extend_from_slice(&data);
                    }
                    return true;
                }
                self.streams.output(ext == Some(1), data).await
            }
            Event::Reply(ok) => {
                let n = self.replies.fetch_add(1, Ordering::AcqRel);
                if n == self.replies_before_exec && !ok {
                    self.refused.store(true, Ordering::Release);
                }
                true
            }
            Event::ExitStatus(n) => {
                if let Ok(mut e) = self.exit.lock() {
                    *e = Some(n);
                }
                true
            }
            Event::ExitSignal { .. } | Event::Eof => true,
            Event::Closed { why } => {
                let status = if self.refused.load(Ordering::Acquire) {
                    // The agent's words: the API server's own Status when it refused the exec.
                    let said = self.refusal.lock().map(|r| r.clone()).unwrap_or_default();
                    serde_json::from_slice::<serde_json::Value>(&said)
                        .ok()
                        .filter(|v| v.get("status").is_some())
                        .unwrap_or_else(|| {
                            serde_json::json!({
                                "metadata": {}, "status": "Failure",
                                "message": String::from_utf8_lossy(&said).trim().to_string(),
                                "reason": "InternalError", "code": 500,
                            })
                        })
                } else {
                    let exit = self.exit.lock().ok().and_then(|e| *e);
                    end_status(exit, why.as_ref())
                };
                self.finish(status).await;
                true
            }
        }
    }

    fn window(&self) -> Option<u32> {
        self.streams.window()
    }

    fn consumed(&self, bytes: usize) {
        self.streams.consumed(bytes);
    }
}

/// kubectl's WebSocket, written.
struct WebSocketStreams {
    sink: Mutex<futures::stream::SplitSink<WebSocket, Message>>,
    gone: AtomicBool,
}

impl WebSocketStreams {
    async fn put(&self, m: Message) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return false;
        }
        let ok = self.sink.lock().await.send(m).await.is_ok();
        if !ok {
            self.gone.store(true, Ordering::Release);
        }
        ok
    }
}

impl Streams for WebSocketStreams {
    async fn output(&self, stderr: bool, data: Bytes) -> bool {
        let stream = if stderr { STDERR } else { STDOUT };
        self.put(framed(stream, &data)).await
    }

    async fn finish(&self, status: serde_json::Value) {
        let body = serde_json::to_vec(&status).unwrap_or_default();
        self.put(framed(ERROR, &body)).await;
        let mut sink = self.sink.lock().await;
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: 1000,
                reason: "".into(),
            })))
            .await;
        let _ = sink.close().await;
        self.gone.store(true, Ordering::Release);
    }
}

/// Ends an exec session when its user is locked: the reason reaches kubectl as the Status.
struct LockHangUp(mpsc::Sender<String>);

impl HangUp for LockHangUp {
    fn hang_up(&self, why: String) {
        let _ = self.0.try_send(why);
    }
}

/// A session granted and dialed whose kubectl has not completed its upgrade yet: dropped
/// unused, it is ended in auth (no `session.start` is left without its end).
pub struct Pending {
    state: Arc<ProxyState>,
    opened: Option<Opened>,
}

impl Pending {
    pub fn new(state: Arc<ProxyState>, opened: Opened) -> Self {
        Pending {
            state,
            opened: Some(opened),
        }
    }

    pub(crate) fn take(mut self) -> Option<Opened> {
        self.opened.take()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(o) = self.opened.take() {
            let state = self.state.clone();
            tokio::spawn(async move {
                let id = o.grant.session_id.clone();
                drop(o);
                crate::session::audit::end_now(
                    &state,
                    &id,
                    crate::session::authorize::failed_end(),
                )
                .await;
            });
        }
    }
}

/// Runs one granted exec session on kubectl's WebSocket until either side ends it; `_counted`
/// keeps it among its user's open connections meanwhile.
pub async fn run(
    state: Arc<ProxyState>,
    target: Target,
    exec: KubeExec,
    pending: Pending,
    _counted: Arc<crate::state::OpenConnection>,
    ws: WebSocket,
) {
    let Some(opened) = pending.take() else {
        return;
    };
    let (sink, stream) = ws.split();
    let streams = WebSocketStreams {
        sink: Mutex::new(sink),
        gone: AtomicBool::new(false),
    };
    let stdin = exec.stdin;
    let input = stream.map(move |m| match m {
        Ok(Message::Binary(b)) if b.len() > MAX_MESSAGE => Input::Broken,
        Ok(Message::Binary(b)) => match b.first() {
            Some(&STDIN) if stdin => Input::Data(b.slice(1..)),
            Some(&RESIZE) => match resize(&b[1..]) {
                Some((cols, rows)) => Input::Resize { cols, rows },
                None => Input::Other,
            },
            Some(&CLOSE) if b.get(1) == Some(&STDIN) => Input::Eof,
            _ => Input::Other,
        },
        Ok(Message::Close(_)) | Err(_) => Input::Closed,
        // kubectl's pings.
        Ok(_) => Input::KeepAlive,
    });
    drive(state, target, exec, opened, streams, input).await;
}

/// Runs one granted exec session: the engine started with an [`ExecDoor`] over `streams`, and
/// kubectl's `input` given to it as commands, until either side ends it.
pub async fn drive<S, I>(
    state: Arc<ProxyState>,
    target: Target,
    exec: KubeExec,
    opened: Opened,
    streams: S,
    mut input: I,
) where
    S: Streams,
    I: futures::Stream<Item = Input> + Unpin + Send,
{
    let door = Arc::new(ExecDoor::new(streams, exec.tty));
    let activity = Arc::new(AtomicU64::new(sallyport_core::unix_now_ms()));
    let commands = crate::session::start(
        state.clone(),
        &target,
        opened,
        door.clone(),
        activity.clone(),
    );
    let (lock_tx, mut lock_rx) = mpsc::channel(1);
    let id = crate::state::next_id();
    state.track(id, &target.user, Arc::new(LockHangUp(lock_tx)));

    // A terminal's size comes with kubectl's first resize, which the recording's header takes.
    let mut early = Vec::new();
    if exec.tty {
        let (mut cols, mut rows) = (80, 24);
        let deadline = tokio::time::Instant::now() + FIRST_RESIZE;
        while let Ok(Some(i)) = tokio::time::timeout_at(deadline, input.next()).await {
            if let Input::Resize { cols: c, rows: r } = i {
                (cols, rows) = (c, r);
                break;
            }
            let end = matches!(i, Input::Closed | Input::Broken);
            early.push(i);
            if end {
                break;
            }
        }
        commands.send(Command::Pty {
            term: "xterm".into(),
            cols,
            rows,
            pix_width: 0,
            pix_height: 0,
            modes: vec![],
        });
    }
    commands.send(Command::Exec(exec.command_line().into_bytes()));
    let mut pending = early.into_iter();
    // Once the session ended and kubectl was told (or would not read it): nothing kubectl
    // sends matters any more; it is read until kubectl closes its side (a clean close), and a
    // kubectl that does neither by then is let go.
    let mut ending: Option<tokio::time::Instant> = None;
    loop {
        let next = match pending.next() {
            Some(i) => Some(i),
            None => tokio::select! {
                biased;
                () = door.ended.notified(), if ending.is_none() => {
                    ending = Some(tokio::time::Instant::now() + door.finish_wait);
                    continue;
                }
                () = tokio::time::sleep_until(ending.unwrap_or_else(tokio::time::Instant::now)),
                    if ending.is_some() => break,
                why = lock_rx.recv(), if ending.is_none() => {
                    door.finish(serde_json::json!({
                        "metadata": {}, "status": "Failure",
                        "message": why.unwrap_or_default(),
                        "reason": "Forbidden", "code": 403,
                    })).await;
                    commands.send(Command::Close);
                    ending = Some(tokio::time::Instant::now() + door.finish_wait);
                    continue;
                }
                i = input.next() => i,
            },
        };
        let i = next.unwrap_or(Input::Closed);
        if ending.is_some() {
            match i {
                Input::Closed | Input::Broken => break,
                // Dropped, and given back to a front end that holds kubectl to a window
                // (SPDY), so that kubectl's close can still be read.
                Input::Data(d) => door.consumed(d.len()),
                _ => {}
            }
            continue;
        }
        // What the person does counts; kubectl's keep-alive pings do not.
        if !matches!(i, Input::KeepAlive) {
            activity.store(sallyport_core::unix_now_ms(), Ordering::Relaxed);
        }
        let broken = matches!(i, Input::Broken);
        let ok = match i {
            Input::Data(d) => commands.send(Command::Data(d)),
            Input::Eof => commands.send(Command::Eof),
            Input::Resize { cols, rows } => commands.send(Command::Resize { cols, rows }),
            Input::Other | Input::KeepAlive => true,
            Input::Broken => false,
            Input::Closed => {
                commands.send(Command::Close);
                break;
            }
        };
        if !ok {
            door.finish(serde_json::json!({
                "metadata": {}, "status": "Failure",
                "message": "the session's input was not read in time, or a message was too large",
                "reason": "InternalError", "code": 500,
            }))
            .await;
            commands.send(Command::Close);
            if broken {
                // kubectl broke the protocol: no clean close for it.
                break;
            }
            ending = Some(tokio::time::Instant::now() + door.finish_wait);
        }
    }
    state.untrack(id);
}

/// A resize message's size, when it is a sane one.
pub fn resize(json: &[u8]) -> Option<(u32, u32)> {
    #[derive(serde::Deserialize)]
    struct Size {
        #[serde(rename = "Width")]
        width: u32,
        #[serde(rename = "Height")]
        height: u32,
    }
    let s: Size = serde_json::from_slice(json).ok()?;
    (s.width > 0 && s.height > 0 && s.width <= 10_000 && s.height <= 10_000)
        .then_some((s.width, s.height))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubectl that stopped reading: nothing written to it ever completes.
    struct Stuck;

    impl Streams for Stuck {
        async fn output(&self, _stderr: bool, _data: Bytes) -> bool {
            std::future::pending().await
        }

        async fn finish(&self, _status: serde_json::Value) {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_kubectl_that_stopped_reading_does_not_hold_the_end() {
        let mut door = ExecDoor::new(Stuck, false);
        door.finish_wait = Duration::from_millis(200);
        let door = Arc::new(door);
        let waiting = door.clone();
        let front_end = tokio::spawn(async move { waiting.ended.notified().await });
        let started = std::time::Instant::now();
        let closed = tokio::time::timeout(
            Duration::from_secs(10),
            door.send(Event::Closed { why: None }),
        )
        .await;
        assert_eq!(closed.ok(), Some(true), "the end waited on kubectl");
        assert!(started.elapsed() >= Duration::from_millis(200));
        // The front end is told to stop reading kubectl.
        let told = tokio::time::timeout(Duration::from_secs(1), front_end).await;
        assert!(
            matches!(told, Ok(Ok(()))),
            "the front end was not told the session ended"
        );
    }
}
