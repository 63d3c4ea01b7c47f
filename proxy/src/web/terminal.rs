//! The browser terminal: a WebSocket door of the session engine, as the SSH door and
//! `kubectl exec` are. The door only translates; the grant, the dial, the recording, the audit
//! (`session.start`/`session.end` with the browser's address) and the watchdog are the
//! engine's (`crate::session`).
//!
//! `GET /v1/webapi/terminal?node=N&login=L&cols=C&rows=R`, subprotocol `sallyport.term.v1`:
//!
//! 1. The upgrade: the exact `Origin` of the proxy (403 otherwise: SameSite is per site, so
//!    another port or subdomain would carry the cookie), and the subprotocol offered (400).
//! 2. The web session from the cookie; none: close 4401.
//! 3. The node among those the user's roles reach (asked of auth as the session's
//!    certificate), the grant (`session::relay::open`); a refusal closes with its code and the
//!    roles' explanation in an error frame first.
//! 4. `{"type":"session","id":...}`, then a pty of the asked size and a shell.
//! 5. Binary frames both ways are the terminal's raw bytes (a character split across frames
//!    survives). Text frames in are one JSON object: `{"type":"resize","cols":C,"rows":R}`
//!    (1–1000, else an error frame and the session lives); bad JSON or another type closes
//!    1008. Out: `{"type":"exit","status":N}` or `{"type":"error","message":M}` before the
//!    close.
//!
//! Close codes: 1000 exited; 4401 not signed in, signed out or expired; 4403 refused (roles,
//! limits); 4408 idle (`client_idle_timeout`); 4409 locked; 1008 bad message; 1009 a frame
//! over 64 KiB; 1011 the node could not be reached.
//!
//! Bounded: input is read only while less than [`INPUT_WINDOW`] waits for the node (never
//! dropped: a paste waits in the browser's socket), output is sent no faster than the browser
//! takes it, and a browser that takes nothing for [`WRITE_STALL`] is far behind: closed.
//! Server pings every [`PING_EVERY`]; they and their pongs are not activity.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, extract::ws::rejection::WebSocketUpgradeRejection};
use bytes::Bytes;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use sallyport_core::https::RemoteAddr;
use tokio::sync::{Mutex, Notify, mpsc};

use super::browser::{ApiError, Browser, NOT_SIGNED_IN, is_locked, user_nodes};
use super::sessions::{CLOSE_LOCKED, CLOSE_SIGNED_OUT, Ending, Terminal, WebSession};
use crate::session::window::InputWindow;
use crate::session::{Command, Door, Event, Refusal, Target};

pub const PROTOCOL: &str = "sallyport.term.v1";
/// The largest frame either way the browser may send.
pub const MAX_FRAME: usize = 64 * 1024;
/// The browser's input in flight toward the node at most.
pub const INPUT_WINDOW: usize = 1024 * 1024;
pub const PING_EVERY: Duration = Duration::from_secs(20);
/// A browser that takes no frame for this long is far behind: the session is closed.
pub const WRITE_STALL: Duration = Duration::from_secs(60);
/// How long the last frames (error or exit, then the close) may take.
const CLOSING: Duration = Duration::from_secs(5);

pub const CLOSE_EXITED: u16 = 1000;
pub const CLOSE_REFUSED: u16 = 4403;
pub const CLOSE_IDLE: u16 = 4408;
pub const CLOSE_BAD_MESSAGE: u16 = 1008;
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_INTERNAL: u16 = 1011;

type Web = State<Arc<super::Web>>;

/// The upgrade: same origin and the subprotocol, or a plain HTTP refusal; everything after is
/// said on the WebSocket.
pub(crate) async fn upgrade(
    State(web): Web,
    Extension(remote): Extension<RemoteAddr>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Err(e) = web.browser.same_origin(&headers) {
        return e.into_response();
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return ApiError::new(e.status(), e.body_text()).into_response(),
    };
    let offered = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == PROTOCOL);
    if !offered {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the terminal speaks the WebSocket subprotocol {PROTOCOL}; offer it"),
        )
        .into_response();
    }
    let session = match super::sessions::cookie_value(&headers) {
        Some(id) => web.browser.sessions.find(&id).await,
        None => Ok(None),
    };
    let browser = web.browser.clone();
    // Frames up to twice the limit are read and refused with 1009 here; larger ones are
    // refused by the WebSocket layer before it reads them.
    ws.protocols([PROTOCOL])
        .max_frame_size(2 * MAX_FRAME)
        .max_message_size(2 * MAX_FRAME)
        .on_upgrade(move |socket| run(browser, session, query, remote, socket))
}

/// The browser's side of the socket, written by the door, the pings and the ends.
struct Out {
    sink: Mutex<SplitSink<WebSocket, Message>>,
    closed: AtomicBool,
    /// Set once the close went out (or the browser is gone).
    finished: Notify,
}

impl Out {
    /// Sends `m`, waiting for the browser to take it, at most [`WRITE_STALL`].
    async fn put(&self, m: Message) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        let sent = tokio::time::timeout(WRITE_STALL, async {
            self.sink.lock().await.send(m).await.is_ok()
        })
        .await;
        match sent {
            Ok(true) => true,
            Ok(false) => {
                self.gone();
                false
            }
            Err(_) => {
                tracing::info!("a browser terminal fell too far behind its output: closed");
                self.gone();
                false
            }
        }
    }

    fn gone(&self) {
        self.closed.store(true, Ordering::Release);
        self.finished.notify_one();
    }

    /// The last frames: `frame` (an exit or error), then the close with `code`. Once.
    async fn close(&self, code: u16, frame: serde_json::Value) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = tokio::time::timeout(CLOSING, async {
            let mut sink = self.sink.lock().await;
            let text = serde_json::to_string(&frame).unwrap_or_default();
            let _ = sink.send(Message::Text(text.into())).await;
            let _ = sink
                .send(Message::Close(Some(CloseFrame {
                    code,
                    reason: "".into(),
                })))
                .await;
            let _ = sink.close().await;
        })
        .await;
        self.finished.notify_one();
    }

    async fn fail(&self, code: u16, message: impl Into<String>) {
        let message: String = message.into();
        self.close(
            code,
            serde_json::json!({"type": "error", "message": message}),
        )
        .await;
    }
}

/// The close code for a refusal of the engine.
fn close_code(r: &Refusal, cert_expires: u64) -> u16 {
    match r {
        Refusal::Denied { .. } | Refusal::Limit(_) => CLOSE_REFUSED,
        Refusal::Locked(_) => CLOSE_LOCKED,
        Refusal::Expired(_) if sallyport_core::unix_now() as u64 >= cert_expires => {
            CLOSE_SIGNED_OUT
        }
        Refusal::Expired(_) => CLOSE_IDLE,
        Refusal::Offline(_) | Refusal::HostKey(_) | Refusal::Failed(_) => CLOSE_INTERNAL,
    }
}

/// The door's side of one terminal: the engine's events as frames.
struct TermDoor {
    out: Arc<Out>,
    window: Arc<InputWindow>,
    exit: std::sync::Mutex<Option<serde_json::Value>>,
    cert_expires: u64,
}

impl Door for TermDoor {
    async fn send(&self, event: Event) -> bool {
        match event {
            // stdout and stderr alike: a terminal has one screen.
            Event::Data { data, .. } => self.out.put(Message::Binary(data)).await,
            Event::ExitStatus(n) => {
                if let Ok(mut e) = self.exit.lock() {
                    *e = Some(serde_json::json!({"type": "exit", "status": n}));
                }
                true
            }
            Event::ExitSignal { signal, .. } => {
                if let Ok(mut e) = self.exit.lock() {
                    *e = Some(serde_json::json!({
                        "type": "exit", "status": null, "signal": format!("{signal:?}"),
                    }));
                }
                true
            }
            Event::Reply(_) | Event::Eof => true,
            Event::Closed { why: Some(r) } => {
                let code = close_code(&r, self.cert_expires);
                self.out.fail(code, r.to_string()).await;
                true
            }
            Event::Closed { why: None } => {
                let exit = self.exit.lock().ok().and_then(|e| e.clone());
                let frame =
                    exit.unwrap_or_else(|| serde_json::json!({"type": "exit", "status": null}));
                self.out.close(CLOSE_EXITED, frame).await;
                true
            }
        }
    }

    fn window(&self) -> Option<u32> {
        Some(INPUT_WINDOW as u32)
    }

    fn consumed(&self, bytes: usize) {
        self.window.consumed(bytes);
    }
}

/// Tells the terminal's loop how it must end (sign-out, expiry, lock).
struct Ends(mpsc::Sender<Ending>);

impl Terminal for Ends {
    fn end(&self, why: Ending) {
        let _ = self.0.try_send(why);
    }
}

/// What the query asks for.
struct Asked {
    node: String,
    login: String,
    cols: u32,
    rows: u32,
}

/// A terminal size: 1 to 1000.
fn size(v: Option<&serde_json::Value>) -> Option<u32> {
    v.and_then(|v| v.as_u64())
        .filter(|n| (1..=1000).contains(n))
        .map(|n| n as u32)
}

fn read_query(q: &HashMap<String, String>) -> Result<Asked, String> {
    let node = q.get("node").filter(|n| !n.is_empty());
    let login = q.get("login").filter(|l| !l.is_empty());
    let (Some(node), Some(login)) = (node, login) else {
        return Err("say which node and login: ?node=N&login=L&cols=C&rows=R".into());
    };
    let dim = |k: &str, default: u32| -> Result<u32, String> {
        match q.get(k) {
            None => Ok(default),
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| format!("{k} must be a number from 1 to 1000")),
        }
    };
    Ok(Asked {
        node: node.clone(),
        login: login.clone(),
        cols: dim("cols", 80)?,
        rows: dim("rows", 24)?,
    })
}

/// What a text frame from the browser asks.
enum TextFrame {
    Resize {
        cols: u32,
        rows: u32,
    },
    /// A resize out of range: said, and the session lives.
    BadSize,
    /// Not one JSON object of a known type: the session ends (1008).
    Broken(String),
}

fn read_text(text: &str) -> TextFrame {
    let v: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return TextFrame::Broken(format!("a text frame must be one JSON object: {e}")),
    };
    match v.get("type").and_then(|t| t.as_str()) {
        Some("resize") => match (size(v.get("cols")), size(v.get("rows"))) {
            (Some(cols), Some(rows)) => TextFrame::Resize { cols, rows },
            _ => TextFrame::BadSize,
        },
        Some(t) => TextFrame::Broken(format!("unknown message type {t:?}")),
        None => TextFrame::Broken("a text frame must be a JSON object with a \"type\"".into()),
    }
}

async fn run(
    browser: Arc<Browser>,
    session: Result<Option<Arc<WebSession>>, crate::auth_client::ClientError>,
    query: HashMap<String, String>,
    remote: RemoteAddr,
    socket: WebSocket,
) {
    let (sink, mut stream) = socket.split();
    let out = Arc::new(Out {
        sink: Mutex::new(sink),
        closed: AtomicBool::new(false),
        finished: Notify::new(),
    });
    let session = match session {
        Ok(Some(s)) => s,
        Ok(None) => return out.fail(CLOSE_SIGNED_OUT, NOT_SIGNED_IN).await,
        Err(e) => {
            tracing::error!(error = %e, "auth unreachable");
            return out
                .fail(
                    CLOSE_INTERNAL,
                    "the auth service is unreachable; try again shortly",
                )
                .await;
        }
    };
    let asked = match read_query(&query) {
        Ok(a) => a,
        Err(why) => return out.fail(CLOSE_BAD_MESSAGE, why).await,
    };
    // The node as the user's roles reach it, asked of auth as the session's certificate.
    let node = match user_nodes(&session).await {
        Ok(nodes) => nodes
            .into_iter()
            .find(|n| n.hostname == asked.node && n.kind != sallyport_core::api::NodeKind::Kube),
        Err(e) if is_locked(&e) => return out.fail(CLOSE_LOCKED, e.to_string()).await,
        Err(crate::auth_client::ClientError::Refused {
            status: 401,
            message,
            ..
        }) => return out.fail(CLOSE_SIGNED_OUT, message).await,
        Err(e @ crate::auth_client::ClientError::Refused { .. }) => {
            return out.fail(CLOSE_REFUSED, e.to_string()).await;
        }
        Err(e) => {
            tracing::error!(error = %e, "auth unreachable");
            return out
                .fail(
                    CLOSE_INTERNAL,
                    "the auth service is unreachable; try again shortly",
                )
                .await;
        }
    };
    let Some(node) = node else {
        return out
            .fail(
                CLOSE_REFUSED,
                format!(
                    "node {} is not registered, or your roles do not reach it",
                    asked.node
                ),
            )
            .await;
    };
    let state = browser.state.clone();
    let counted = Arc::new(state.open_connection(&session.user));
    let target = Target {
        user: session.user.clone(),
        login: asked.login.clone(),
        node,
        addr: remote.0,
        cert_expires: session.expires,
        // One terminal is one connection with one session channel.
        open_sessions: Some(0),
        connection: Some(counted.clone()),
        // As the SSH door does for a certificate without the login: auth still decides and
        // audits, and the session is refused.
        credential_refusal: (!session.logins.contains(&asked.login)).then(|| {
            format!(
                "your web session's certificate does not allow login {}; sign out and in again to get one with your current logins",
                asked.login
            )
        }),
        kube: None,
        door: sallyport_core::metrics::SessionDoor::Web,
    };
    let opened = match crate::session::relay::open(state.clone(), &target, None).await {
        Ok(o) => o,
        Err(r) => {
            return out
                .fail(close_code(&r, session.expires), r.to_string())
                .await;
        }
    };
    let session_id = opened.grant.session_id.clone();
    let hello = serde_json::json!({
        "type": "session", "id": session_id, "node": asked.node, "login": asked.login,
    });
    let hello = Message::Text(serde_json::to_string(&hello).unwrap_or_default().into());
    let window = Arc::new(InputWindow::new(INPUT_WINDOW));
    let door = Arc::new(TermDoor {
        out: out.clone(),
        window: window.clone(),
        exit: std::sync::Mutex::new(None),
        cert_expires: session.expires,
    });
    let activity = Arc::new(AtomicU64::new(sallyport_core::unix_now_ms()));
    // The hello goes out before the engine can send any output.
    let said_hello = out.put(hello).await;
    let commands = crate::session::start(
        state.clone(),
        &target,
        opened,
        door.clone(),
        activity.clone(),
    );
    let (end_tx, mut end_rx) = mpsc::channel(1);
    let id = crate::state::next_id();
    if !said_hello || !session.add_terminal(id, Arc::new(Ends(end_tx))) {
        out.fail(CLOSE_SIGNED_OUT, NOT_SIGNED_IN).await;
        commands.send(Command::Close);
        return;
    }
    commands.send(Command::Pty {
        term: "xterm-256color".into(),
        cols: asked.cols,
        rows: asked.rows,
        pix_width: 0,
        pix_height: 0,
        modes: vec![],
    });
    commands.send(Command::Shell);

    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let touch =
        |activity: &AtomicU64| activity.store(sallyport_core::unix_now_ms(), Ordering::Relaxed);
    loop {
        let message = tokio::select! {
            biased;
            why = end_rx.recv() => {
                if let Some(why) = why {
                    out.fail(why.code, why.message).await;
                }
                break;
            }
            () = out.finished.notified() => break,
            _ = ping.tick() => {
                if !out.put(Message::Ping(Bytes::new())).await {
                    break;
                }
                continue;
            }
            m = async {
                window.room().await;
                stream.next().await
            } => m,
        };
        match message {
            Some(Ok(Message::Binary(data))) => {
                if data.len() > MAX_FRAME {
                    out.fail(
                        CLOSE_TOO_BIG,
                        format!("a frame over {} KiB", MAX_FRAME / 1024),
                    )
                    .await;
                    break;
                }
                touch(&activity);
                session.touch();
                window.took(data.len());
                if !commands.send(Command::Data(data)) {
                    break;
                }
            }
            Some(Ok(Message::Text(text))) => {
                if text.as_str().len() > MAX_FRAME {
                    out.fail(
                        CLOSE_TOO_BIG,
                        format!("a frame over {} KiB", MAX_FRAME / 1024),
                    )
                    .await;
                    break;
                }
                match read_text(text.as_str()) {
                    TextFrame::Resize { cols, rows } => {
                        touch(&activity);
                        if !commands.send(Command::Resize { cols, rows }) {
                            break;
                        }
                    }
                    TextFrame::BadSize => {
                        let said = serde_json::json!({
                            "type": "error",
                            "message": "a resize needs cols and rows from 1 to 1000",
                        });
                        let said = serde_json::to_string(&said).unwrap_or_default();
                        if !out.put(Message::Text(said.into())).await {
                            break;
                        }
                    }
                    TextFrame::Broken(why) => {
                        out.fail(CLOSE_BAD_MESSAGE, why).await;
                        break;
                    }
                }
            }
            // Pings and pongs: the socket is alive, the person did nothing.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(Message::Close(_))) | None => break,
            Some(Err(e)) => {
                // The WebSocket layer refuses a frame past its limit before reading it.
                let inner = e.into_inner();
                let too_big = matches!(
                    inner.downcast_ref::<tokio_tungstenite::tungstenite::Error>(),
                    Some(tokio_tungstenite::tungstenite::Error::Capacity(_))
                );
                if too_big {
                    out.fail(
                        CLOSE_TOO_BIG,
                        format!("a frame over {} KiB", MAX_FRAME / 1024),
                    )
                    .await;
                }
                break;
            }
        }
    }
    // The browser left, or the session is over: the node's side ends as for a dropped SSH
    // connection.
    commands.send(Command::Close);
    session.remove_terminal(id);
    drop(counted);
}
