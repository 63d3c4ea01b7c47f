//! A kube agent's side of `kubectl exec` and `attach`: the proxy opens each one as an SSH
//! session inside the tunnel (the session engine's dial, as for a node), with a per-session
//! certificate in which auth signed exactly which pod, container and command, as which
//! principals (`sshcert::EXT_KUBE_EXEC`). The agent runs that and nothing else: it opens the
//! exec stream with the API server with its own credentials and the signed principals, and
//! relays it as the SSH channel: stdin as data, the end of stdin as EOF, window changes as
//! resizes, stdout and stderr as data and extended data, and the API server's final Status as
//! the exit status.
//!
//! The stream is WebSocket `v5.channel.k8s.io` (kube-apiserver 1.30 and later), else SPDY/3.1
//! with `v4.channel.k8s.io` (`super::spdy`): an API server that answers the WebSocket with
//! anything but its own Status (an older one proxies it to the kubelet, which refuses v5 with
//! text; one without WebSocket support says 400) is asked again over SPDY. Both have stdin's
//! end, which WebSocket v4 lacks, so v4 is never asked for.
//!
//! An exec the API server refuses (no such pod, RBAC) is answered with a failed `exec` request,
//! and the API server's Status goes to the proxy as the channel's stderr, for kubectl.

use std::sync::Arc;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::header::{self, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use russh::keys::ssh_key::{Certificate, PublicKey};
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId, ChannelOpenFailure, ChannelWriteHalf};
use sallyport_core::kube::KubeExec;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::KubeServer;
use super::spdy::SpdyExec;
use crate::{AgentError, AgentIdentity};

const V5: &str = "v5.channel.k8s.io";
/// The stream protocol asked for over SPDY.
const V4: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// The SSH server for exec sessions; shared by every stream of the tunnel.
pub struct ExecServer {
    config: crate::ssh::HostConfig,
    user_cas: Vec<PublicKey>,
}

impl ExecServer {
    pub fn new(id: &AgentIdentity) -> Result<Self, AgentError> {
        let (config, user_cas) = crate::ssh::agent_server(id)?;
        Ok(ExecServer {
            config: crate::ssh::HostConfig::new(config),
            user_cas,
        })
    }

    /// Takes the renewed host certificate for new connections.
    pub fn renewed(&self, id: &AgentIdentity) -> Result<(), AgentError> {
        self.config.renew(id)
    }

    /// Serves one SSH connection from the proxy on `stream`.
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self: Arc<Self>,
        kube: Arc<KubeServer>,
        stream: S,
    ) {
        let (pending, login) = sallyport_core::door::Pending::new(None);
        // The API server is dialed as the proxy's SSH connection arrives, so that its TLS
        // handshake runs beside the SSH handshake, the certificate and the channel rather than
        // after them. Only the proxy opens streams in the tunnel; the connection is dropped
        // unused if no exec follows.
        let warm = Some(Warm(tokio::spawn(super::dial(kube.upstream.clone()))));
        let conn = Conn {
            srv: self.clone(),
            warm,
            kube,
            exec: None,
            login: None,
            pending,
            chan: None,
            used: false,
        };
        if let Err(e) = sallyport_core::door::serve_ssh(
            self.config.get(),
            stream,
            conn,
            login,
            sallyport_core::door::DEFAULT_LOGIN_GRACE,
            sallyport_core::flow::WRITE_QUEUE,
        )
        .await
        {
            tracing::debug!(error = %e, "kube exec connection ended");
        }
    }
}

/// The SSH channel's input, for the API server.
pub enum Input {
    Data(Stdin),
    Eof,
    Resize(u32, u32),
}

/// A piece of stdin, held framed for the WebSocket protocol (the stdin stream byte, then the
/// data): it is framed as it is copied out of the SSH channel, so the WebSocket relay sends
/// it as it is, and SPDY takes the data past the stream byte without a copy.
pub struct Stdin(Bytes);

impl Stdin {
    fn copied(data: &[u8]) -> Stdin {
        let mut b = BytesMut::with_capacity(data.len() + 1);
        b.put_u8(STDIN);
        b.extend_from_slice(data);
        Stdin(b.freeze())
    }

    /// The WebSocket message: the stream byte and the data.
    fn framed(self) -> Bytes {
        self.0
    }

    /// The data alone.
    pub fn data(self) -> Bytes {
        self.0.slice(1..)
    }

    /// How many bytes of data (what the channel's window counted).
    fn len(&self) -> usize {
        self.0.len() - 1
    }
}

struct Chan {
    id: ChannelId,
    output: Arc<ChannelWriteHalf<Msg>>,
    size: Option<(u32, u32)>,
    /// Never waited on in the session loop: a stalled API server must not stop the loop from
    /// reading the proxy's window updates and closes. Bounded by the channel's window, given
    /// back only as the relay takes the input ([`Inbox`]).
    input: Option<mpsc::UnboundedSender<Input>>,
    started: bool,
}

/// A connection to the API server being dialed ahead of the exec; aborted when dropped.
struct Warm(tokio::task::JoinHandle<std::io::Result<ApiConn>>);

impl Drop for Warm {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type ApiConn = TokioIo<super::Upstream>;

struct Conn {
    srv: Arc<ExecServer>,
    /// The connection the first exec stream is asked on (`send`).
    warm: Option<Warm>,
    kube: Arc<KubeServer>,
    /// What auth signed into the session certificate.
    exec: Option<KubeExec>,
    login: Option<String>,
    pending: sallyport_core::door::Pending,
    /// The one session channel a connection carries.
    chan: Option<Chan>,
    /// The signed exec ran already: a certificate runs it once.
    used: bool,
}

/// The exec or attach path and query for `e`, as the API server reads them.
fn exec_path(e: &KubeExec) -> String {
    let seg = sallyport_core::api::path_segment;
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for c in &e.command {
        q.append_pair("command", c);
    }
    if !e.container.is_empty() {
        q.append_pair("container", &e.container);
    }
    q.append_pair("stdin", if e.stdin { "true" } else { "false" });
    q.append_pair("stdout", "true");
    // A terminal has one output stream, as the API server insists.
    q.append_pair("stderr", if e.tty { "false" } else { "true" });
    q.append_pair("tty", if e.tty { "true" } else { "false" });
    let sub = if e.subresource == "attach" {
        "attach"
    } else {
        "exec"
    };
    format!(
        "/api/v1/namespaces/{}/pods/{}/{sub}?{}",
        seg(&e.namespace),
        seg(&e.pod),
        q.finish()
    )
}

/// Whether `body` is a `metav1.Status`: the API server's own answer, as to a refused exec.
fn is_status(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v.get("status").is_some())
}

/// What the API server said when it refused the stream: its Status, or one made of its words.
fn refusal(code: StatusCode, body: &[u8]) -> Bytes {
    if is_status(body) {
        return Bytes::copy_from_slice(body);
    }
    let text = String::from_utf8_lossy(body).trim().to_string();
    let message = if text.is_empty() {
        format!("the API server refused the stream: {code}")
    } else {
        text
    };
    Bytes::from(
        serde_json::to_vec(&sallyport_core::kube::status(
            code.as_u16(),
            sallyport_core::kube::reason_for(code.as_u16()),
            &message,
        ))
        .unwrap_or_default(),
    )
}

type Stream = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// The API server's exec stream, as it agreed to speak it.
enum Upstream {
    WebSocket(Stream),
    Spdy(SpdyExec),
}

/// Why an exec stream was not opened.
enum Refused {
    /// The exec itself: the Status to give kubectl.
    Exec(Bytes),
    /// The stream protocol, in the API server's words: another may do.
    Protocol(StatusCode, String),
}

impl Refused {
    /// The API server's answer to an upgrade it did not accept.
    async fn of(resp: hyper::Response<hyper::body::Incoming>) -> Self {
        let code = resp.status();
        // At most 64 KiB of it is read: a refusal is a Status, not a download.
        let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body = &body[..];
        if is_status(body) {
            Refused::Exec(Bytes::copy_from_slice(body))
        } else {
            Refused::Protocol(code, String::from_utf8_lossy(body).trim().to_string())
        }
    }
}

fn fail(code: StatusCode, m: &str) -> Refused {
    Refused::Exec(refusal(code, m.as_bytes()))
}

impl Conn {
    /// Opens the exec stream with the API server: WebSocket v5, else SPDY; `Err` with the
    /// Status to give kubectl.
    async fn open(&mut self, e: &KubeExec) -> Result<Upstream, Bytes> {
        let ws_said = match self.open_websocket(e).await {
            Ok(ws) => return Ok(Upstream::WebSocket(ws)),
            Err(Refused::Exec(status)) => return Err(status),
            Err(Refused::Protocol(code, said)) => (code, said),
        };
        tracing::debug!(code = %ws_said.0, said = %ws_said.1, "the API server refused the WebSocket exec stream; asking over SPDY");
        match self.open_spdy(e).await {
            Ok(x) => Ok(Upstream::Spdy(x)),
            Err(Refused::Exec(status)) => Err(status),
            Err(Refused::Protocol(code, said)) => Err(refusal(
                code,
                format!(
                    "the API server refused the exec stream over WebSocket ({}: {}) and over SPDY/3.1 ({code}: {said})",
                    ws_said.0, ws_said.1
                )
                .as_bytes(),
            )),
        }
    }

    /// A request for the exec stream of `e` with the agent's credentials and the signed
    /// principals.
    async fn request(
        &self,
        e: &KubeExec,
        method: hyper::Method,
        upgrade: &[(header::HeaderName, String)],
    ) -> Result<Request<Empty<Bytes>>, Refused> {
        let up = &self.kube.upstream;
        let uri = up
            .path(&exec_path(e))
            .map_err(|m| fail(StatusCode::BAD_REQUEST, &m.to_string()))?;
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, up.authority())
            .header(header::CONNECTION, "Upgrade");
        for (k, v) in upgrade {
            req = req.header(k, v);
        }
        req = req.header("Impersonate-User", &e.kube_user);
        for g in &e.kube_groups {
            req = req.header("Impersonate-Group", g);
        }
        let mut req = req
            .body(Empty::<Bytes>::new())
            .map_err(|m| fail(StatusCode::BAD_REQUEST, &m.to_string()))?;
        if let Some(token) = &self.kube.upstream.token
            && let Some(v) = token.header().await
        {
            req.headers_mut().insert(header::AUTHORIZATION, v);
        }
        Ok(req)
    }

    /// Asks for the upgrade on a connection of its own: the one dialed ahead (`Warm`), else a
    /// new one. A warm connection that failed before the request went out (never after: an
    /// exec must not run twice) is replaced once.
    async fn send(
        &mut self,
        req: Request<Empty<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, Refused> {
        let warm = match self.warm.take() {
            Some(mut w) => (&mut w.0).await.ok().and_then(Result::ok),
            None => None,
        };
        let resp = match warm {
            Some(io) => match round_trip(io, req).await {
                Trip::Answered(resp) => resp,
                Trip::NotSent(req, why) => {
                    tracing::debug!(error = %why, "the connection dialed ahead failed before the request; dialing again");
                    self.dial_and_send(req).await
                }
            },
            None => self.dial_and_send(req).await,
        };
        let resp = resp.map_err(|err| {
            tracing::error!(error = %err, "kube agent: the API server is unreachable");
            fail(StatusCode::SERVICE_UNAVAILABLE, super::UNREACHABLE)
        })?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(Refused::of(resp).await);
        }
        Ok(resp)
    }

    async fn dial_and_send(
        &self,
        req: Request<Empty<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let io = super::dial(self.kube.upstream.clone())
            .await
            .map_err(|e| crate::join::root_cause(&e))?;
        match round_trip(io, req).await {
            Trip::Answered(resp) => resp,
            Trip::NotSent(_, why) => Err(why),
        }
    }

    /// The exec stream over WebSocket v5.
    async fn open_websocket(&mut self, e: &KubeExec) -> Result<Stream, Refused> {
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        let upgrade = [
            (header::UPGRADE, "websocket".to_string()),
            (header::SEC_WEBSOCKET_VERSION, "13".to_string()),
            (header::SEC_WEBSOCKET_KEY, key.clone()),
            (header::SEC_WEBSOCKET_PROTOCOL, V5.to_string()),
        ];
        let req = self.request(e, hyper::Method::GET, &upgrade).await?;
        let mut resp = self.send(req).await?;
        let want = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let accepted = resp
            .headers()
            .get(header::SEC_WEBSOCKET_ACCEPT)
            .is_some_and(|v| v.as_bytes() == want.as_bytes())
            && resp
                .headers()
                .get(header::SEC_WEBSOCKET_PROTOCOL)
                .is_some_and(|p| p == HeaderValue::from_static(V5));
        if !accepted {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                "the API server's WebSocket handshake did not check out",
            ));
        }
        let upgraded = hyper::upgrade::on(&mut resp)
            .await
            .map_err(|m| fail(StatusCode::BAD_GATEWAY, &m.to_string()))?;
        Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await)
    }

    /// The exec stream over SPDY/3.1 (v4), its streams opened as kubectl opens them.
    async fn open_spdy(&mut self, e: &KubeExec) -> Result<SpdyExec, Refused> {
        let upgrade = [
            (header::UPGRADE, super::spdy::UPGRADE.to_string()),
            (
                header::HeaderName::from_static("x-stream-protocol-version"),
                V4.to_string(),
            ),
        ];
        let req = self.request(e, hyper::Method::POST, &upgrade).await?;
        let mut resp = self.send(req).await?;
        let h = resp.headers();
        let spdy = h
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case(super::spdy::UPGRADE));
        let v4 = h
            .get("x-stream-protocol-version")
            .is_some_and(|v| v.as_bytes() == V4.as_bytes());
        if !spdy || !v4 {
            return Err(fail(
                StatusCode::BAD_GATEWAY,
                "the API server's SPDY handshake did not check out",
            ));
        }
        let upgraded = hyper::upgrade::on(&mut resp)
            .await
            .map_err(|m| fail(StatusCode::BAD_GATEWAY, &m.to_string()))?;
        SpdyExec::open(TokioIo::new(upgraded), e)
            .await
            .map_err(|why| fail(StatusCode::BAD_GATEWAY, &why))
    }
}

/// How long the API server has to answer an exec upgrade (it starts the command first).
const UPGRADE_ANSWER: std::time::Duration = std::time::Duration::from_secs(60);

/// What became of a request on a connection.
enum Trip {
    /// It went out; the answer, or why there is none (never asked again: an exec must not run
    /// twice).
    Answered(Result<hyper::Response<hyper::body::Incoming>, String>),
    /// It never left: the request back, and why.
    NotSent(Request<Empty<Bytes>>, String),
}

/// One request on `io`, HTTP/1.1, its connection kept for the upgrade.
async fn round_trip(io: ApiConn, req: Request<Empty<Bytes>>) -> Trip {
    let (mut tx, conn) = match hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(io)
        .await
    {
        Ok(h) => h,
        Err(e) => return Trip::NotSent(req, crate::join::root_cause(&e)),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "kube agent: an exec stream's connection ended");
        }
    });
    if let Err(e) = tx.ready().await {
        return Trip::NotSent(req, crate::join::root_cause(&e));
    }
    match tokio::time::timeout(UPGRADE_ANSWER, tx.try_send_request(req)).await {
        Ok(Ok(resp)) => Trip::Answered(Ok(resp)),
        Ok(Err(mut e)) => {
            let why = crate::join::root_cause(e.error());
            match e.take_message() {
                Some(req) => Trip::NotSent(req, why),
                None => Trip::Answered(Err(why)),
            }
        }
        Err(_) => Trip::Answered(Err(format!(
            "no answer to the exec request in {} s",
            UPGRADE_ANSWER.as_secs()
        ))),
    }
}

fn framed(stream: u8, data: &[u8]) -> Message {
    let mut b = BytesMut::with_capacity(data.len() + 1);
    b.put_u8(stream);
    b.put_slice(data);
    Message::Binary(b.freeze())
}

fn resize_message(cols: u32, rows: u32) -> Message {
    framed(
        RESIZE,
        format!("{{\"Width\":{cols},\"Height\":{rows}}}").as_bytes(),
    )
}

/// The exit status a final Status means; `Err` with its message when it is not an exit.
pub fn exit_of(status: &[u8]) -> Result<u32, String> {
    let v: serde_json::Value = serde_json::from_slice(status)
        .map_err(|_| String::from_utf8_lossy(status).trim().to_string())?;
    if v["status"] == "Success" {
        return Ok(0);
    }
    if v["reason"] == "NonZeroExitCode"
        && let Some(code) = v["details"]["causes"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["reason"] == "ExitCode"))
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
    {
        return Ok(code);
    }
    Err(v["message"]
        .as_str()
        .unwrap_or("the exec failed")
        .to_string())
}

/// Carries the API server's WebSocket (v5) to the channel and the channel's input to it.
async fn relay(ws: Stream, out: Arc<ChannelWriteHalf<Msg>>, mut input: Inbox) {
    let (mut sink, mut stream) = ws.split();
    let writer = tokio::spawn(async move {
        while let Some(i) = input.recv().await {
            let m = match i {
                Input::Data(d) => Message::Binary(d.framed()),
                Input::Eof => framed(CLOSE, &[STDIN]),
                Input::Resize(c, r) => resize_message(c, r),
            };
            if sink.send(m).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut exit = None;
    while let Some(Ok(m)) = stream.next().await {
        let Message::Binary(b) = m else {
            if matches!(m, Message::Close(_)) {
                break;
            }
            continue;
        };
        let Some((&which, data)) = b.split_first() else {
            continue;
        };
        let data = b.slice(b.len() - data.len()..);
        let sent = match which {
            STDOUT => out.data_bytes(data).await.is_ok(),
            STDERR => out.extended_data_bytes(1, data).await.is_ok(),
            ERROR => {
                exit = Some(match exit_of(&data) {
                    Ok(code) => code,
                    Err(message) => {
                        let _ = out
                            .extended_data_bytes(1, Bytes::from(format!("{message}\r\n")))
                            .await;
                        1
                    }
                });
                true
            }
            _ => true,
        };
        if !sent {
            break;
        }
    }
    writer.abort();
    let _ = out.exit_status(exit.unwrap_or(1)).await;
    let _ = out.eof().await;
    let _ = out.close().await;
}

impl russh::server::Handler for Conn {
    type Error = russh::Error;

    async fn auth_succeeded(&mut self, _session: &mut Session) -> Result<(), Self::Error> {
        self.pending.authenticated();
        Ok(())
    }

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        cert: &Certificate,
    ) -> Result<Auth, Self::Error> {
        let verified = sallyport_core::sshcert::verify_user(
            cert,
            &self.srv.user_cas,
            login,
            sallyport_core::sshcert::now(),
        );
        let exec = sallyport_core::sshcert::kube_exec(cert);
        match (verified, exec) {
            (Ok(_), Some(e)) if e.kube_user == login => {
                self.exec = Some(e);
                self.login = Some(login.to_string());
                Ok(Auth::Accept)
            }
            (Ok(_), _) => {
                tracing::warn!(
                    login,
                    "refused a certificate that grants no exec for this login"
                );
                Ok(Auth::reject())
            }
            (Err(e), _) => {
                tracing::warn!(login, error = %e, "refused a certificate");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.chan.is_some() || self.exec.is_none() || self.used {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        reply.accept().await;
        let id = channel.id();
        let (_, write) = channel.split();
        self.chan = Some(Chan {
            id,
            output: Arc::new(write),
            size: None,
            input: None,
            started: false,
        });
        Ok(())
    }

    async fn pty_request(
        &mut self,
        ch: ChannelId,
        _term: &str,
        cols: u32,
        rows: u32,
        _pw: u32,
        _ph: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let tty = self.exec.as_ref().is_some_and(|e| e.tty);
        match self
            .chan
            .as_mut()
            .filter(|c| c.id == ch && !c.started && tty)
        {
            Some(c) => {
                c.size = Some((cols, rows));
                session.channel_success(ch)
            }
            None => session.channel_failure(ch),
        }
    }

    async fn exec_request(
        &mut self,
        ch: ChannelId,
        _data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // The command is the one auth signed, not whatever the request says.
        let (Some(exec), Some(c)) = (self.exec.clone(), self.chan.as_mut()) else {
            return session.channel_failure(ch);
        };
        if c.id != ch || c.started {
            return session.channel_failure(ch);
        }
        c.started = true;
        self.used = true;
        let size = c.size;
        let output = c.output.clone();
        match self.open(&exec).await {
            Ok(upstream) => {
                let (utx, urx) = mpsc::unbounded_channel();
                if let Some((cols, rows)) = size {
                    let _ = utx.send(Input::Resize(cols, rows));
                }
                let rx = Inbox {
                    rx: urx,
                    credit: sallyport_core::flow::server_credit(session.handle(), ch),
                };
                if let Some(c) = self.chan.as_mut() {
                    c.input = Some(utx);
                }
                session.channel_success(ch)?;
                match upstream {
                    Upstream::WebSocket(ws) => tokio::spawn(relay(ws, output, rx)),
                    Upstream::Spdy(x) => tokio::spawn(x.relay(output, rx)),
                };
            }
            Err(status) => {
                tracing::info!(login = ?self.login, pod = %exec.pod, "the API server refused an exec");
                session.channel_failure(ch)?;
                session.extended_data(ch, 1, status)?;
                session.exit_status_request(ch, 1)?;
                session.eof(ch)?;
                session.close(ch)?;
            }
        }
        Ok(())
    }

    async fn shell_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(ch)
    }

    async fn data(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let tx = self
            .chan
            .as_ref()
            .filter(|c| c.id == ch)
            .and_then(|c| c.input.clone());
        match tx {
            // Its window goes back once the relay takes it (`Inbox`).
            Some(tx) => {
                if tx.send(Input::Data(Stdin::copied(data))).is_err() {
                    return session.close(ch);
                }
                Ok(())
            }
            // Nothing runs to take it: dropped, and its window given back.
            None => session.consumed(ch, data.len()),
        }
    }

    async fn channel_eof(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(tx) = self
            .chan
            .as_ref()
            .filter(|c| c.id == ch)
            .and_then(|c| c.input.clone())
        {
            let _ = tx.send(Input::Eof);
        }
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        ch: ChannelId,
        cols: u32,
        rows: u32,
        _pw: u32,
        _ph: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let tx = self
            .chan
            .as_ref()
            .filter(|c| c.id == ch)
            .and_then(|c| c.input.clone());
        let taken = match tx {
            Some(tx) => tx.send(Input::Resize(cols, rows)).is_ok(),
            None => false,
        };
        if taken {
            session.channel_success(ch)
        } else {
            session.channel_failure(ch)
        }
    }

    async fn channel_close(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.chan.as_ref().is_some_and(|c| c.id == ch) {
            // Dropping the input ends the writer, which closes the API server's stream.
            self.chan = None;
        }
        Ok(())
    }
}

/// A stream with bytes already read from it put back in front (what told SSH from HTTP).
pub struct Prefixed<S> {
    head: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(head: Vec<u8>, inner: S) -> Self {
        Prefixed { head, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = (self.head.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The channel's input as the relay takes it, in order: the channel's window goes back for each
/// piece of data as the relay takes it, so the proxy can send no more than one window (and the
/// piece being written) ahead of the API server, and the session loop never waits.
pub struct Inbox {
    rx: mpsc::UnboundedReceiver<Input>,
    credit: sallyport_core::flow::Credit,
}

impl Inbox {
    pub async fn recv(&mut self) -> Option<Input> {
        let i = self.rx.recv().await?;
        if let Input::Data(d) = &i
            && d.len() > 0
        {
            (self.credit)(d.len());
        }
        Some(i)
    }
}
