//! The inner connection: the client's SSH session with the node, terminated here as the node
//! (host certificate for its names) so that every channel request can be authorized, relayed
//! one for one to the node, recorded and audited. One node connection per session channel, so
//! closing one channel never touches another (ControlMaster). Forwarding channels (`-L`, `-D`,
//! `-R`) share one further node connection per inner connection, opened at the first forward.
//!
//! File copies are checked against `ssh_file_copy` and audited as they pass: the SFTP packets
//! (`sftp` events per operation), legacy scp headers (`scp` events per file) and rsync (one
//! `scp` event with the bytes moved). Their bytes are not put in the terminal recording.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use russh::client::Msg as ClientMsg;
use russh::keys::ssh_key::Certificate;
use russh::server::{Auth, Handle, Msg, Session};
use russh::{
    Channel, ChannelId, ChannelMsg, ChannelOpenFailure, ChannelReadHalf, ChannelWriteHalf, Pty, Sig,
};
use sallyport_core::api::{GrantCheck, NodeInfo, SessionEnd, SessionGrant, SessionRequest};
use sallyport_core::flow::{self, Input};
use sallyport_core::scp::{Direction, FileCopy, ScpAnswers, ScpStream};
use sallyport_core::sftp::SftpAudit;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};

use super::SshState;
use super::events::EventSink;
use crate::record::{Header, Recorder};

type NodeConn = Arc<russh::client::Handle<NodeClient>>;

/// What a file copy's bytes are read for.
enum CopyAudit {
    Sftp(SftpAudit),
    Scp {
        stream: ScpStream,
        /// The other way: nothing but the receiver's answers.
        answers: ScpAnswers,
        direction: Direction,
        path: String,
    },
    Rsync {
        direction: Direction,
        path: String,
        bytes: u64,
    },
}

impl CopyAudit {
    fn new(copy: FileCopy) -> Self {
        match copy {
            FileCopy::Scp { direction, path } => CopyAudit::Scp {
                stream: ScpStream::new(),
                answers: ScpAnswers::new(),
                direction,
                path,
            },
            FileCopy::Rsync { direction, path } => CopyAudit::Rsync {
                direction,
                path,
                bytes: 0,
            },
            FileCopy::SftpServer => CopyAudit::Sftp(SftpAudit::new()),
        }
    }

    /// Reads bytes going `dir` (upload: from the person; download: from the node). Returns the
    /// events completed, or why the stream can no longer be audited.
    fn feed(
        &mut self,
        dir: Direction,
        data: &[u8],
    ) -> Result<Vec<(&'static str, serde_json::Value)>, String> {
        match self {
            CopyAudit::Sftp(a) => {
                let r = match dir {
                    Direction::Upload => a.client(data),
                    Direction::Download => a.server(data),
                };
                r.map_err(|e| e.to_string())?;
                Ok(a.take().into_iter().map(sftp_event).collect())
            }
            CopyAudit::Scp {
                stream,
                direction,
                path,
                ..
            } if *direction == dir => {
                stream.feed(data).map_err(|e| e.to_string())?;
                Ok(stream
                    .take()
                    .into_iter()
                    .map(|f| {
                        let e = json!({"tool": "scp", "path": path, "file": f.name,
                            "direction": direction.as_str(), "size": f.size});
                        ("scp", e)
                    })
                    .collect())
            }
            // A command taken for a copy runs unrecorded, so both ways must be the protocol:
            // a shell answering in its place is cut off at its first byte.
            CopyAudit::Scp { answers, .. } => {
                answers.feed(data).map_err(|e| e.to_string())?;
                Ok(vec![])
            }
            CopyAudit::Rsync {
                direction, bytes, ..
            } if *direction == dir => {
                *bytes += data.len() as u64;
                Ok(vec![])
            }
            CopyAudit::Rsync { .. } => Ok(vec![]),
        }
    }

    /// The event that says why this copy's channel was ended: its stream could no longer be
    /// audited (a protocol violation, a flood), so nothing more of it may pass unaudited.
    fn aborted(&self, why: &str) -> (&'static str, serde_json::Value) {
        match self {
            CopyAudit::Sftp(_) => copy_aborted(why),
            CopyAudit::Scp {
                direction, path, ..
            } => (
                "scp",
                json!({"tool": "scp", "path": path, "direction": direction.as_str(), "result": why}),
            ),
            CopyAudit::Rsync {
                direction, path, ..
            } => (
                "scp",
                json!({"tool": "rsync", "path": path, "direction": direction.as_str(), "result": why}),
            ),
        }
    }

    fn finish(&mut self, exit_code: Option<i64>) -> Vec<(&'static str, serde_json::Value)> {
        match self {
            CopyAudit::Sftp(a) => a.finish().into_iter().map(sftp_event).collect(),
            CopyAudit::Scp { .. } => vec![],
            CopyAudit::Rsync {
                direction,
                path,
                bytes,
            } => vec![(
                "scp",
                json!({"tool": "rsync", "path": path, "direction": direction.as_str(),
                    "size": *bytes, "exit_code": exit_code}),
            )],
        }
    }
}

fn sftp_event(op: sallyport_core::sftp::Op) -> (&'static str, serde_json::Value) {
    let mut e =
        json!({"action": op.action, "path": op.path, "bytes": op.bytes, "result": op.result});
    if let Some(t) = op.target {
        e["target"] = t.into();
    }
    if let Some(m) = op.mode {
        e["mode"] = m.into();
    }
    if let Some(x) = op.extension {
        e["extension"] = x.into();
    }
    ("sftp", e)
}

/// The event that says why an SFTP channel was ended: see [`CopyAudit::aborted`].
fn copy_aborted(why: &str) -> (&'static str, serde_json::Value) {
    (
        "sftp",
        json!({"action": "abort", "path": "", "bytes": 0, "result": why}),
    )
}

/// An agent's report of what it did for a session (`api::AGENT_EVENT_EXT`): only from an agent
/// node (only the agent writes SSH messages there; an sshd never sends these) and only the
/// events an agent may report.
async fn agent_event(grant: &SessionGrant, events: &EventSink, data: &[u8], reported: &mut bool) {
    if grant.node.kind != "agent" {
        return;
    }
    // Not taken on trust: one report per session, small, and only when the grant let the agent
    // create a login at all.
    if !agent_event_allowed(grant.host_user.is_some(), *reported, data.len()) {
        tracing::warn!(session = %grant.session_id, node = %grant.node.hostname, "ignored an agent event this session's grant does not allow");
        return;
    }
    *reported = true;
    match serde_json::from_slice::<sallyport_core::api::SessionEvent>(data) {
        Ok(e) if sallyport_core::api::AGENT_EVENTS.contains(&e.event.as_str()) => {
            events
                .send(&e.event, serde_json::Value::Object(e.fields))
                .await;
        }
        _ => {
            tracing::warn!(session = %grant.session_id, node = %grant.node.hostname, "ignored an agent event that is not one an agent may report")
        }
    }
}

/// The largest agent report taken (a `host_user.create` is a few hundred bytes).
const AGENT_EVENT_MAX: usize = 4096;

/// Whether an agent's report may be taken: the grant carries a host-user decision, none was
/// taken yet in this session, and it is at most [`AGENT_EVENT_MAX`] bytes.
fn agent_event_allowed(grant_has_host_user: bool, already: bool, len: usize) -> bool {
    grant_has_host_user && !already && len <= AGENT_EVENT_MAX
}

async fn send_all(events: &EventSink, list: Vec<(&'static str, serde_json::Value)>) {
    for (name, fields) in list {
        events.send(name, fields).await;
    }
}

const FILE_COPY_REFUSED: &str =
    "file copy (scp, sftp, rsync) is not allowed by your roles (ssh_file_copy: false)";
const PORT_FORWARDING_REFUSED: &str =
    "port forwarding is not allowed by your roles (port_forwarding)";

pub async fn serve_inner<S>(
    state: Arc<SshState>,
    stream: S,
    user: String,
    node: NodeInfo,
    cert: Certificate,
    addr: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = russh::server::Config {
        auth_rejection_time: Duration::from_millis(300),
        inactivity_timeout: None,
        window_size: sallyport_core::flow::CLIENT_WINDOW,
        ..sallyport_core::sshcert::server_config(
            (*state.key).clone(),
            cert,
            sallyport_core::sshcert::Transport::Open,
        )
    };
    let inner = Inner {
        state,
        user,
        node,
        addr,
        login: None,
        refusal: None,
        chans: HashMap::new(),
        forwarder: None,
        cert_expires: u64::MAX,
        activity: Arc::new(AtomicU64::new(now_ms())),
        remote_forwards: Arc::new(Mutex::new(HashSet::new())),
        counted: None,
        session_cap: None,
        refused_past_cap: false,
    };
    match russh::server::run_stream(Arc::new(config), stream, inner).await {
        Ok(s) => {
            let _ = s.await;
        }
        Err(e) => tracing::debug!(error = %e, "inner handshake failed"),
    }
}

type Shared<T> = Arc<Mutex<T>>;

struct Relay {
    node: Arc<ChannelWriteHalf<ClientMsg>>,
    input: flow::Sender,
    grant: SessionGrant,
    rec: Shared<Option<Recorder>>,
    pty: Option<(String, u32, u32)>,
    command: Shared<Option<(&'static str, Option<String>)>>,
    bytes_in: Arc<AtomicU64>,
    recording_started: bool,
    copy: Shared<Option<CopyAudit>>,
    events: EventSink,
    /// What the person asked for that lets the node open channels toward them.
    asked: Arc<Asked>,
    /// When data last moved either way (Unix milliseconds), for `client_idle_timeout`.
    activity: Arc<AtomicU64>,
}

/// Channels a node may open toward the person, once they asked for them and the roles agreed.
#[derive(Default)]
struct Asked {
    agent: AtomicBool,
    x11: AtomicBool,
    /// The session's grant, checked again before each agent or X11 channel the node opens
    /// (set once the session channel is open), and where such a refusal is audited.
    recheck: OnceLock<Arc<GrantRecheck>>,
    events: OnceLock<EventSink>,
}

const AGENT_FORWARDING_REFUSED: &str =
    "agent forwarding is not allowed by your roles (forward_agent)";
const X11_FORWARDING_REFUSED: &str =
    "X11 forwarding is not allowed by your roles (permit_x11_forwarding)";

/// How long a forward's grant, checked again with auth, is trusted: a user removed, locked
/// or without `port_forwarding` any more gets no new forwarded connection after this.
const GRANT_RECHECK: Duration = Duration::from_secs(2);

/// A session's grant, checked again, at most every [`GRANT_RECHECK`], before each new thing
/// it carries long after it was given: on the forwarding connection, each new connection
/// through a forward (`-L`, `-D`, `-R`) and each new `-R` bind; on a session, each agent or
/// X11 channel the node opens toward the person.
struct GrantRecheck {
    state: Arc<SshState>,
    session_id: String,
    last: tokio::sync::Mutex<Option<(std::time::Instant, Result<GrantCheck, String>)>>,
}

impl GrantRecheck {
    /// Starts from `grant`, just given.
    fn new(state: Arc<SshState>, grant: &SessionGrant) -> Self {
        let answer = GrantCheck {
            port_forwarding: grant.port_forwarding,
            forward_agent: grant.forward_agent,
            x11_forwarding: grant.x11_forwarding,
        };
        GrantRecheck {
            state,
            session_id: grant.session_id.clone(),
            last: tokio::sync::Mutex::new(Some((std::time::Instant::now(), Ok(answer)))),
        }
    }

    /// Whether the user's current roles and locks still allow a new forwarded connection.
    async fn allowed(&self) -> Result<(), String> {
        match self.current().await? {
            g if g.port_forwarding => Ok(()),
            _ => Err(PORT_FORWARDING_REFUSED.to_string()),
        }
    }

    /// Whether they still allow the node a new agent channel.
    async fn agent_allowed(&self) -> Result<(), String> {
        match self.current().await? {
            g if g.forward_agent => Ok(()),
            _ => Err(AGENT_FORWARDING_REFUSED.to_string()),
        }
    }

    /// Whether they still allow the node a new X11 channel.
    async fn x11_allowed(&self) -> Result<(), String> {
        match self.current().await? {
            g if g.x11_forwarding => Ok(()),
            _ => Err(X11_FORWARDING_REFUSED.to_string()),
        }
    }

    /// What the user's current roles and locks allow, as auth answers now (or answered less
    /// than [`GRANT_RECHECK`] ago). When auth cannot be asked the answer is an error: nothing
    /// is worth an unchecked grant.
    async fn current(&self) -> Result<GrantCheck, String> {
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = &*last
            && at.elapsed() < GRANT_RECHECK
        {
            return answer.clone();
        }
        let path = format!(
            "/v1/sessions/{}/check",
            sallyport_core::api::path_segment(&self.session_id)
        );
        let answer = match self
            .state
            .auth
            .json::<_, GrantCheck>(reqwest::Method::POST, &path, Some(&json!({})))
            .await
        {
            Ok(g) => Ok(g),
            Err(e) => Err(e.to_string()),
        };
        *last = Some((std::time::Instant::now(), answer.clone()));
        answer
    }
}

/// The node connection that carries an inner connection's forwards.
struct Forwarder {
    grant: SessionGrant,
    recheck: Arc<GrantRecheck>,
    conn: NodeConn,
    events: EventSink,
    open_failure: Shared<Option<String>>,
    bytes: Arc<(AtomicU64, AtomicU64)>,
    /// Dropped with the forwarder: ends its watchdog.
    _stop: tokio::sync::oneshot::Sender<()>,
}

struct Inner {
    state: Arc<SshState>,
    user: String,
    node: NodeInfo,
    addr: SocketAddr,
    login: Option<String>,
    /// Why sessions on this connection will be refused, when the certificate checked out but
    /// does not cover the login: said at channel open, where OpenSSH shows it to the user.
    refusal: Option<String>,
    chans: HashMap<ChannelId, Relay>,
    forwarder: Option<Forwarder>,
    /// When the inner connection's certificate expires (Unix seconds).
    cert_expires: u64,
    /// When data last moved on any channel of this connection (Unix milliseconds): idle
    /// timeouts count the whole connection, so one quiet channel is not cut while another works.
    activity: Arc<AtomicU64>,
    /// Remote forwards the person asked for and the node granted, by (address, port).
    remote_forwards: Shared<HashSet<(String, u32)>>,
    /// This connection counted among its user's open ones (`max_connections`), once
    /// authenticated.
    counted: Option<super::InnerConnection>,
    /// `max_sessions` as the last grant said it, and whether auth has refused a channel past
    /// it: from then on, channels past it are refused here without asking again, so a client
    /// opening channels in a loop costs auth nothing and adds nothing to the audit log.
    session_cap: Option<u32>,
    refused_past_cap: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The person's connection is gone without closing its sessions: close them on the
        // node, which hangs up everything they started there, as sshd's hang-up would.
        for (_, r) in self.chans.drain() {
            tokio::spawn(async move {
                let _ = r.node.close().await;
            });
        }
        if let Some(f) = self.forwarder.take() {
            let state = self.state.clone();
            tokio::spawn(async move {
                let _ = f
                    .conn
                    .disconnect(russh::Disconnect::ByApplication, "", "")
                    .await;
                let end = SessionEnd {
                    status: "complete".into(),
                    bytes_in: f.bytes.0.load(Ordering::Relaxed),
                    bytes_out: f.bytes.1.load(Ordering::Relaxed),
                    kind: Some("forward".into()),
                    ..Default::default()
                };
                Inner::end_session(state, &f.grant, end).await;
            });
        }
    }
}

/// The proxy's SSH client toward a node: checks the node's host certificate (agents) or its
/// pinned host key (agentless OpenSSH servers), and keeps the reason of a refused channel.
struct NodeClient {
    state: Arc<SshState>,
    node: NodeInfo,
    open_failure: Shared<Option<String>>,
    /// Why the node's host key was not trusted, for the person's error message.
    host_key_problem: Shared<Option<String>>,
    /// The person's inner connection, for channels the node opens toward them.
    user: Handle,
    /// Agent and X11 channels are relayed only after an allowed request for them.
    asked: Arc<Asked>,
    remote_forwards: Shared<HashSet<(String, u32)>>,
    events: Arc<OnceLock<EventSink>>,
    /// Set on the forwarding connection: its grant, checked again per remote-forwarded
    /// connection. Other node connections have none, and carry no forwards.
    recheck: Arc<OnceLock<Arc<GrantRecheck>>>,
    forward_bytes: Arc<(AtomicU64, AtomicU64)>,
    /// The inner connection's last activity (for idle timeouts).
    activity: Arc<AtomicU64>,
}

use sallyport_core::flow::splice;

impl russh::client::Handler for NodeClient {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        match key {
            russh::keys::PublicKeyOrCertificate::Certificate(cert) => {
                let ok = sallyport_core::sshcert::verify_host(
                    cert,
                    &self.state.host_cas,
                    &self.node.id,
                    sallyport_core::sshcert::now(),
                );
                if let Err(e) = &ok {
                    tracing::warn!(node = %self.node.hostname, error = %e, "node host certificate refused");
                    if let Ok(mut p) = self.host_key_problem.lock() {
                        *p = Some(format!(
                            "node {}: host certificate refused: {e}",
                            self.node.hostname
                        ));
                    }
                }
                Ok(ok.is_ok())
            }
            russh::keys::PublicKeyOrCertificate::PublicKey { key, .. }
                if self.node.kind == "agentless" =>
            {
                let text = key.to_openssh().map_err(russh::Error::from)?;
                let path = format!(
                    "/v1/nodes/{}/host-key",
                    sallyport_core::api::path_segment(&self.node.id)
                );
                let pinned: Result<serde_json::Value, _> = self
                    .state
                    .auth
                    .json(
                        reqwest::Method::POST,
                        &path,
                        Some(&serde_json::json!({"host_key": text})),
                    )
                    .await;
                let ok = pinned
                    .ok()
                    .and_then(|v| v["host_key"].as_str().map(|k| k == text))
                    .unwrap_or(false);
                if !ok {
                    tracing::warn!(node = %self.node.hostname, "agentless node presented a host key other than the pinned one");
                    if let Ok(mut p) = self.host_key_problem.lock() {
                        *p = Some(format!(
                            "node {} presented a host key other than the one pinned at its first connection; if the server was reinstalled, remove the node and add it again",
                            self.node.hostname
                        ));
                    }
                }
                Ok(ok)
            }
            _ => Ok(false),
        }
    }

    async fn channel_open_failure(
        &mut self,
        _channel: ChannelId,
        _reason: ChannelOpenFailure,
        description: &str,
        _language: &str,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        if let Ok(mut f) = self.open_failure.lock() {
            *f = Some(description.to_string());
        }
        Ok(())
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: Channel<ClientMsg>,
        connected_address: &str,
        connected_port: u32,
        originator_address: &str,
        originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        let asked = self
            .remote_forwards
            .lock()
            .map(|f| f.contains(&(connected_address.to_string(), connected_port)))
            .unwrap_or(false);
        if !asked {
            tracing::warn!(node = %self.node.hostname, connected_address, connected_port, "node opened a forward nobody asked for");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        let Some(recheck) = self.recheck.get().cloned() else {
            tracing::warn!(node = %self.node.hostname, "node opened a forward on a session connection");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let user = self.user.clone();
        let events = self.events.get().cloned();
        let bytes = self.forward_bytes.clone();
        let activity = self.activity.clone();
        let (addr, oaddr) = (
            connected_address.to_string(),
            originator_address.to_string(),
        );
        tokio::spawn(async move {
            if let Err(why) = recheck.allowed().await {
                tracing::info!(session = %recheck.session_id, %why, "remote-forwarded connection refused");
                if let Some(ev) = events {
                    ev.send(
                        "port",
                        json!({"kind": "remote", "addr": format!("{addr}:{connected_port}"),
                        "originator": format!("{oaddr}:{originator_port}"), "result": why}),
                    )
                    .await;
                }
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return;
            }
            match user
                .channel_open_forwarded_tcpip(
                    addr.clone(),
                    connected_port,
                    oaddr.clone(),
                    originator_port,
                )
                .await
            {
                Ok(uch) => {
                    reply.accept().await;
                    let (down, up) = sallyport_core::flow::splice_with(
                        channel.into_stream(),
                        uch.into_stream(),
                        Some(&activity),
                    )
                    .await;
                    bytes.0.fetch_add(up, Ordering::Relaxed);
                    bytes.1.fetch_add(down, Ordering::Relaxed);
                    if let Some(ev) = events {
                        ev.send(
                            "port",
                            json!({"kind": "remote", "addr": format!("{addr}:{connected_port}"),
                            "originator": format!("{oaddr}:{originator_port}"),
                            "bytes_in": up, "bytes_out": down}),
                        )
                        .await;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "person refused a remote-forwarded connection");
                    reply.reject(ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
        Ok(())
    }

    async fn server_channel_open_agent_forward(
        &mut self,
        channel: Channel<ClientMsg>,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        if !self.asked.agent.load(Ordering::Relaxed) {
            tracing::warn!(node = %self.node.hostname, "node opened an agent channel nobody asked for");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        let user = self.user.clone();
        let asked = self.asked.clone();
        tokio::spawn(async move {
            if let Err(why) = recheck_node_channel(&asked, "agent-forward", true).await {
                tracing::info!(%why, "agent channel refused");
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return;
            }
            match user.channel_open_agent().await {
                Ok(uch) => {
                    reply.accept().await;
                    splice(channel.into_stream(), uch.into_stream()).await;
                }
                Err(_) => reply.reject(ChannelOpenFailure::ConnectFailed).await,
            }
        });
        Ok(())
    }

    async fn server_channel_open_x11(
        &mut self,
        channel: Channel<ClientMsg>,
        originator_address: &str,
        originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        if !self.asked.x11.load(Ordering::Relaxed) {
            tracing::warn!(node = %self.node.hostname, "node opened an X11 channel nobody asked for");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        let user = self.user.clone();
        let origin = originator_address.to_string();
        let asked = self.asked.clone();
        tokio::spawn(async move {
            if let Err(why) = recheck_node_channel(&asked, "x11-forward", false).await {
                tracing::info!(%why, "X11 channel refused");
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return;
            }
            match user.channel_open_x11(origin, originator_port).await {
                Ok(uch) => {
                    reply.accept().await;
                    splice(channel.into_stream(), uch.into_stream()).await;
                }
                Err(_) => reply.reject(ChannelOpenFailure::ConnectFailed).await,
            }
        });
        Ok(())
    }

    async fn server_channel_open_session(
        &mut self,
        _channel: Channel<ClientMsg>,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        reply
            .reject(ChannelOpenFailure::AdministrativelyProhibited)
            .await;
        Ok(())
    }

    async fn server_channel_open_direct_tcpip(
        &mut self,
        _channel: Channel<ClientMsg>,
        _host_to_connect: &str,
        _port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        reply
            .reject(ChannelOpenFailure::AdministrativelyProhibited)
            .await;
        Ok(())
    }
}

/// Checks a session's grant again before an agent (`agent`) or X11 channel the node opens
/// toward the person; a refusal is audited as an `agent-forward` / `x11-forward` event
/// (`event`) with its `result`.
async fn recheck_node_channel(asked: &Asked, event: &str, agent: bool) -> Result<(), String> {
    let answer = match asked.recheck.get() {
        Some(r) if agent => r.agent_allowed().await,
        Some(r) => r.x11_allowed().await,
        None => Err("the session's grant is not known yet".to_string()),
    };
    if let (Err(why), Some(events)) = (&answer, asked.events.get()) {
        events
            .send(event, json!({"result": why, "channel": "refused"}))
            .await;
    }
    answer
}

fn refuse(reason: impl Into<String>) -> ChannelOpenFailure {
    ChannelOpenFailure::Other {
        code: 1,
        reason: reason.into(),
    }
}

impl Inner {
    /// Authorize with auth, then open a session on the node with the per-session certificate.
    async fn open_node_session(
        &self,
        user: Handle,
    ) -> Result<(SessionGrant, NodeConn, Channel<ClientMsg>, Arc<Asked>), String> {
        let asked = Arc::new(Asked::default());
        let events = Arc::new(OnceLock::new());
        let open = u32::try_from(self.chans.len()).unwrap_or(u32::MAX);
        let (grant, conn, open_failure) = self
            .connect_node(
                user,
                asked.clone(),
                events,
                Default::default(),
                Some(open),
                Default::default(),
            )
            .await?;
        match conn.channel_open_session().await {
            Ok(c) => Ok((grant, conn, c, asked)),
            Err(e) => {
                let why = sallyport_core::flow::open_failure_reason(&open_failure, e).await;
                let end = SessionEnd {
                    status: "complete".into(),
                    exit_code: Some(255),
                    ..Default::default()
                };
                Inner::end_session(self.state.clone(), &grant, end).await;
                Err(why)
            }
        }
    }

    /// The forwarding connection to the node, opened (and authorized) at the first forward.
    async fn forwarder(&mut self, user: Handle) -> Result<&Forwarder, String> {
        if self.forwarder.is_none() {
            let user_handle = user.clone();
            let events = Arc::new(OnceLock::new());
            let recheck_slot = Arc::new(OnceLock::new());
            let bytes: Arc<(AtomicU64, AtomicU64)> = Default::default();
            let (grant, conn, open_failure) = self
                .connect_node(
                    user,
                    Arc::new(Asked::default()),
                    events.clone(),
                    bytes.clone(),
                    None,
                    recheck_slot.clone(),
                )
                .await?;
            let sink = EventSink::spawn(self.state.clone(), grant.session_id.clone());
            let _ = events.set(sink.clone());
            let recheck = Arc::new(GrantRecheck::new(self.state.clone(), &grant));
            let _ = recheck_slot.set(recheck.clone());
            self.update_kind(&grant, "forward", None);
            let (stop, stopped) = tokio::sync::oneshot::channel();
            // A connection that only forwards has no session channel to watch it.
            tokio::spawn(watch_forwards(
                grant.clone(),
                self.activity.clone(),
                self.cert_expires,
                user_handle,
                stopped,
            ));
            self.forwarder = Some(Forwarder {
                grant,
                recheck,
                conn,
                events: sink,
                open_failure,
                bytes,
                _stop: stop,
            });
        }
        self.forwarder
            .as_ref()
            .ok_or_else(|| "no forwarding connection".to_string())
    }

    fn update_kind(&self, grant: &SessionGrant, kind: &str, command: Option<&str>) {
        let state = self.state.clone();
        let path = format!(
            "/v1/sessions/{}/update",
            sallyport_core::api::path_segment(&grant.session_id)
        );
        let body = SessionEnd {
            kind: Some(kind.into()),
            command: command.map(str::to_string),
            ..Default::default()
        };
        tokio::spawn(async move {
            let _ = state
                .auth
                .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(&body))
                .await;
        });
    }

    /// Authorize with auth and connect to the node with the per-session certificate.
    async fn connect_node(
        &self,
        user: Handle,
        asked: Arc<Asked>,
        events: Arc<OnceLock<EventSink>>,
        forward_bytes: Arc<(AtomicU64, AtomicU64)>,
        open_sessions: Option<u32>,
        recheck: Arc<OnceLock<Arc<GrantRecheck>>>,
    ) -> Result<(SessionGrant, NodeConn, Shared<Option<String>>), String> {
        let login = self.login.clone().ok_or("not authenticated")?;
        let older_connections = self
            .counted
            .as_ref()
            .map_or(0, |c| self.state.older_connections(c, &self.user));
        if let Some(refusal) = &self.refusal {
            // Ask auth anyway: it audits the refusal with the roles' explanation.
            let req = SessionRequest {
                user: self.user.clone(),
                login: login.clone(),
                node: self.node.id.clone(),
                public_key: self
                    .state
                    .key
                    .public_key()
                    .to_openssh()
                    .map_err(|e| e.to_string())?,
                remote_addr: self.addr.to_string(),
                open_sessions,
                older_connections,
            };
            return match self
                .state
                .auth
                .json::<_, SessionGrant>(reqwest::Method::POST, "/v1/sessions", Some(&req))
                .await
            {
                Err(e) => Err(e.to_string()),
                Ok(g) => {
                    let end = SessionEnd {
                        status: "complete".into(),
                        exit_code: Some(255),
                        ..Default::default()
                    };
                    Inner::end_session(self.state.clone(), &g, end).await;
                    Err(format!(
                        "{refusal}; run `sally login` to get a certificate with your current logins"
                    ))
                }
            };
        }
        let public_key = self
            .state
            .key
            .public_key()
            .to_openssh()
            .map_err(|e| e.to_string())?;
        let req = SessionRequest {
            user: self.user.clone(),
            login: login.clone(),
            node: self.node.id.clone(),
            public_key,
            remote_addr: self.addr.to_string(),
            open_sessions,
            older_connections,
        };
        let grant: SessionGrant = self
            .state
            .auth
            .json(reqwest::Method::POST, "/v1/sessions", Some(&req))
            .await
            .map_err(|e| e.to_string())?;
        let open_failure: Shared<Option<String>> = Arc::new(Mutex::new(None));
        let dialed = self
            .dial(
                &grant,
                &login,
                user,
                asked,
                events,
                recheck,
                forward_bytes,
                &open_failure,
            )
            .await;
        match dialed {
            Ok(handle) => Ok((grant, Arc::new(handle), open_failure)),
            Err(why) => {
                let end = SessionEnd {
                    status: "complete".into(),
                    exit_code: Some(255),
                    ..Default::default()
                };
                Inner::end_session(self.state.clone(), &grant, end).await;
                Err(why)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn dial(
        &self,
        grant: &SessionGrant,
        login: &str,
        user: Handle,
        asked: Arc<Asked>,
        events: Arc<OnceLock<EventSink>>,
        recheck: Arc<OnceLock<Arc<GrantRecheck>>>,
        forward_bytes: Arc<(AtomicU64, AtomicU64)>,
        open_failure: &Shared<Option<String>>,
    ) -> Result<russh::client::Handle<NodeClient>, String> {
        let cert = Certificate::from_openssh(grant.ssh_cert.trim()).map_err(|e| e.to_string())?;
        let host_key_problem: Shared<Option<String>> = Arc::new(Mutex::new(None));
        let client = NodeClient {
            state: self.state.clone(),
            node: grant.node.clone(),
            open_failure: open_failure.clone(),
            host_key_problem: host_key_problem.clone(),
            user,
            asked,
            remote_forwards: self.remote_forwards.clone(),
            events,
            recheck,
            forward_bytes,
            activity: self.activity.clone(),
        };
        let explain = |e: russh::Error| -> String {
            host_key_problem
                .lock()
                .ok()
                .and_then(|p| p.clone())
                .unwrap_or_else(|| format!("node {}: {e}", grant.node.hostname))
        };
        // Inside an agent's tunnel the TLS layer is the cipher; an agentless node's TCP
        // connection gets real SSH ciphers, and the window sshd itself would get from OpenSSH.
        let config = if grant.node.kind == "agent" {
            sallyport_core::sshcert::client_config(sallyport_core::sshcert::preferred_in_tunnel())
        } else {
            russh::client::Config {
                window_size: sallyport_core::flow::CLIENT_WINDOW,
                ..sallyport_core::sshcert::client_config(sallyport_core::sshcert::preferred())
            }
        };
        let config = Arc::new(config);
        let offline = || {
            format!(
                "node {} is offline: its agent is not connected to this proxy",
                grant.node.hostname
            )
        };
        let mut handle = if grant.node.kind == "agent" {
            let stream = self
                .state
                .tunnels
                .open(&grant.node.id)
                .await
                .ok_or_else(offline)?;
            russh::client::connect_stream(
                config,
                sallyport_core::flow::Decoupled::new(stream),
                client,
            )
            .await
            .map_err(explain)?
        } else {
            let addr = grant.node.addr.clone().ok_or("the node has no address")?;
            let tcp = tokio::time::timeout(
                Duration::from_secs(10),
                tokio::net::TcpStream::connect(&addr),
            )
            .await
            .map_err(|_| format!("node {} at {addr} did not answer", grant.node.hostname))?
            .map_err(|e| format!("node {} at {addr}: {e}", grant.node.hostname))?;
            let _ = tcp.set_nodelay(true);
            russh::client::connect_stream(config, sallyport_core::flow::Decoupled::new(tcp), client)
                .await
                .map_err(explain)?
        };
        let auth = handle
            .authenticate_openssh_cert(login.to_string(), self.state.key.clone(), cert)
            .await
            .map_err(|e| format!("node {}: {e}", grant.node.hostname))?;
        if !auth.success() {
            let trust = if grant.node.kind == "agentless" {
                "does its sshd trust `sallyctl auth export --type=openssh` (TrustedUserCAKeys)?"
            } else {
                "does its agent belong to this cluster?"
            };
            return Err(format!(
                "node {} refused the session certificate for login {login}; {trust}",
                grant.node.hostname
            ));
        }
        Ok(handle)
    }

    /// Refuses a channel request with a message the person sees on stderr, and closes it.
    fn refuse_request(
        &mut self,
        ch: ChannelId,
        why: &str,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        tracing::info!(user = %self.user, node = %self.node.hostname, why, "channel request refused");
        // Accepted, then ended with the message and status 1: OpenSSH clients exit at once on
        // a failed subsystem request, before printing what the channel said.
        session.channel_success(ch)?;
        session.extended_data(ch, 1, Bytes::from(format!("sallyport: {why}\r\n")))?;
        session.exit_status_request(ch, 1)?;
        session.eof(ch)?;
        if let Some(r) = self.chans.remove(&ch) {
            let node = r.node.clone();
            tokio::spawn(async move {
                let _ = node.close().await;
            });
        }
        session.close(ch)
    }

    async fn end_session(state: Arc<SshState>, grant: &SessionGrant, end: SessionEnd) {
        let path = format!(
            "/v1/sessions/{}/end",
            sallyport_core::api::path_segment(&grant.session_id)
        );
        if let Err(e) = state
            .auth
            .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(&end))
            .await
        {
            tracing::error!(session = %grant.session_id, error = %e, "session end not recorded");
        }
    }

    /// The channel starts `kind` (`shell`, `exec`, `sftp`): tells auth, and records it unless
    /// it is a file copy (audited per file instead).
    fn begin(
        &mut self,
        ch: ChannelId,
        kind: &'static str,
        command: Option<&str>,
        record: bool,
    ) -> Result<(), String> {
        let Some(r) = self.chans.get(&ch) else {
            return Ok(());
        };
        if r.recording_started {
            return Ok(());
        }
        if let Ok(mut slot) = r.command.lock() {
            *slot = Some((kind, command.map(str::to_string)));
        }
        let grant = r.grant.clone();
        self.update_kind(&grant, kind, command);
        let Some(r) = self.chans.get_mut(&ch) else {
            return Ok(());
        };
        r.recording_started = true;
        if !record {
            return Ok(());
        }
        let (term, cols, rows) = r.pty.clone().unwrap_or_else(|| ("dumb".into(), 80, 24));
        let title = format!(
            "{}@{} ({})",
            self.login.as_deref().unwrap_or("?"),
            self.node.hostname,
            self.user
        );
        let header = Header {
            width: cols,
            height: rows,
            term: &term,
            title: &title,
            command,
        };
        let limits = crate::record::Limits {
            input: r.grant.record_input,
            max_bytes: self.state.max_recording_size,
            strict: r.grant.record == "strict",
        };
        match Recorder::create(&self.state.recordings, &r.grant.session_id, &header, limits) {
            Ok(rec) => {
                if let Ok(mut slot) = r.rec.lock() {
                    *slot = Some(rec);
                }
                Ok(())
            }
            Err(e) if r.grant.record == "strict" => Err(format!(
                "this session must be recorded (record_session: strict) and the recording failed: {e}"
            )),
            Err(e) => {
                tracing::error!(session = %r.grant.session_id, error = %e, "recording failed; session continues unrecorded (best_effort)");
                Ok(())
            }
        }
    }
}

/// What a session channel's node side writes to.
struct Outputs {
    grant: SessionGrant,
    rec: Shared<Option<Recorder>>,
    command: Shared<Option<(&'static str, Option<String>)>>,
    bytes_in: Arc<AtomicU64>,
    copy: Shared<Option<CopyAudit>>,
    events: EventSink,
    activity: Arc<AtomicU64>,
    /// When the person's certificate expires (Unix seconds), for `disconnect_expired_cert`.
    cert_expires: u64,
}

use sallyport_core::unix_now_ms as now_ms;

/// Why a session must end now, if it must: idle longer than the roles allow, or (when the roles
/// say so) the person's certificate expired.
fn watchdog(grant: &SessionGrant, activity: &AtomicU64, cert_expires: u64) -> Option<String> {
    let now = now_ms();
    if let Some(idle) = grant.idle_timeout_secs {
        let quiet = now.saturating_sub(activity.load(Ordering::Relaxed)) / 1000;
        if quiet >= idle {
            return Some(format!(
                "session closed after {} idle (client_idle_timeout)",
                sallyport_core::duration::format(Duration::from_secs(idle))
            ));
        }
    }
    if grant.disconnect_expired_cert && now / 1000 >= cert_expires {
        return Some(
            "your certificate expired (disconnect_expired_cert); run `sally login` again".into(),
        );
    }
    None
}

/// Ends a connection whose forwards have gone idle past `client_idle_timeout`, or whose
/// certificate expired under `disconnect_expired_cert`, until `stopped`.
async fn watch_forwards(
    grant: SessionGrant,
    activity: Arc<AtomicU64>,
    cert_expires: u64,
    user: Handle,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    if grant.idle_timeout_secs.is_none() && !grant.disconnect_expired_cert {
        return;
    }
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if let Some(why) = watchdog(&grant, &activity, cert_expires) {
            tracing::info!(session = %grant.session_id, %why, "ending a forwarding connection");
            let _ = user
                .disconnect(russh::Disconnect::ByApplication, why, String::new())
                .await;
            return;
        }
    }
}

/// Node → user: output, exit status, replies; records output; audits file copies; ends the
/// session in auth and closes the node connection.
async fn node_to_user(
    state: Arc<SshState>,
    mut read: ChannelReadHalf,
    user: Handle,
    ch: ChannelId,
    conn: NodeConn,
    out: Outputs,
) {
    let Outputs {
        grant,
        rec,
        command,
        bytes_in,
        copy,
        events,
        activity,
        cert_expires,
    } = out;
    // Reads download bytes of a file copy; false when they can no longer be audited.
    let audit = |data: &[u8]| -> Result<Vec<(&'static str, serde_json::Value)>, String> {
        match copy.lock() {
            Ok(mut c) => match c.as_mut() {
                Some(c) => c.feed(Direction::Download, data),
                None => Ok(vec![]),
            },
            Err(_) => Err("audit state lost".into()),
        }
    };
    let mut exit_code: Option<i64> = None;
    let mut bytes_out = 0u64;
    let mut agent_reported = false;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    // How many leading bytes of `data` the recording takes: under `strict` near the limit,
    // fewer than all, and the person is shown only those before the session ends.
    let record = |data: &Bytes| -> usize {
        match rec.lock() {
            Ok(mut r) => match r.as_mut() {
                Some(r) => r.output(data.clone()),
                None => data.len(),
            },
            Err(_) => data.len(),
        }
    };
    let max_recording = state.max_recording_size;
    loop {
        // Checked before anything more reaches the person: under `strict` nothing is shown
        // that the recording no longer holds.
        if recording_full(&rec, &grant, &events, max_recording).await {
            let why = format!(
                "this session's recording reached max_recording_size ({max_recording} bytes) and it must be recorded (record_session: strict); the session ends"
            );
            let _ = user
                .extended_data(ch, 1, Bytes::from(format!("\r\nsallyport: {why}\r\n")))
                .await;
            let _ = user.exit_status_request(ch, 255).await;
            exit_code = Some(255);
            break;
        }
        let msg = tokio::select! {
            m = read.wait() => m,
            _ = tick.tick() => {
                if let Some(why) = watchdog(&grant, &activity, cert_expires) {
                    tracing::info!(session = %grant.session_id, %why, "ending a session");
                    let _ = user
                        .extended_data(ch, 1, Bytes::from(format!("\r\nsallyport: {why}\r\n")))
                        .await;
                    let _ = user
                        .disconnect(russh::Disconnect::ByApplication, why, String::new())
                        .await;
                    break;
                }
                continue;
            }
        };
        let Some(msg) = msg else { break };
        match msg {
            ChannelMsg::Data { mut data } => {
                bytes_out += data.len() as u64;
                activity.store(now_ms(), Ordering::Relaxed);
                // What the recording does not take is not shown; the loop's check then ends
                // the (`strict`) session.
                data.truncate(record(&data));
                match audit(&data) {
                    Ok(list) if list.is_empty() => {}
                    Ok(list) => send_all(&events, list).await,
                    Err(e) => {
                        tracing::warn!(session = %grant.session_id, error = %e, "closing a file copy that cannot be audited");
                        let ev = copy
                            .lock()
                            .ok()
                            .and_then(|c| c.as_ref().map(|c| c.aborted(&e)))
                            .unwrap_or_else(|| copy_aborted(&e));
                        send_all(&events, vec![ev]).await;
                        let _ = user
                            .extended_data(
                                ch,
                                1,
                                Bytes::from(format!("sallyport: {e}; closing\r\n")),
                            )
                            .await;
                        break;
                    }
                }
                if !data.is_empty() && user.data(ch, data).await.is_err() {
                    break;
                }
            }
            // The agent's own report (`host_user.create`): audited, never shown or recorded.
            ChannelMsg::ExtendedData { data, ext }
                if ext == sallyport_core::api::AGENT_EVENT_EXT =>
            {
                agent_event(&grant, &events, &data, &mut agent_reported).await;
            }
            ChannelMsg::ExtendedData { mut data, ext } => {
                bytes_out += data.len() as u64;
                activity.store(now_ms(), Ordering::Relaxed);
                data.truncate(record(&data));
                if !data.is_empty() && user.extended_data(ch, ext, data).await.is_err() {
                    break;
                }
            }
            ChannelMsg::ExitStatus { exit_status } => {
                exit_code = Some(i64::from(exit_status));
                let _ = user.exit_status_request(ch, exit_status).await;
            }
            ChannelMsg::ExitSignal {
                signal_name,
                core_dumped,
                error_message,
                lang_tag,
            } => {
                exit_code = Some(-1);
                let _ = user
                    .exit_signal_request(ch, signal_name, core_dumped, error_message, lang_tag)
                    .await;
            }
            ChannelMsg::Success => {
                let _ = user.channel_success(ch).await;
            }
            ChannelMsg::Failure => {
                let _ = user.channel_failure(ch).await;
            }
            ChannelMsg::Eof => {
                let _ = user.eof(ch).await;
            }
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    // The recording is complete on disk before the person sees the session end.
    let finished = rec.lock().ok().and_then(|mut r| r.take());
    if let Some(r) = finished
        && r.finish()
    {
        // The session ended before the loop saw the limit (the writer reached it late).
        recording_limit_reached(&grant, &events, max_recording).await;
    }
    let _ = user.close(ch).await;
    let _ = conn
        .disconnect(russh::Disconnect::ByApplication, "", "")
        .await;
    let last = copy
        .lock()
        .ok()
        .and_then(|mut c| c.as_mut().map(|c| c.finish(exit_code)))
        .unwrap_or_default();
    send_all(&events, last).await;
    let (kind, command) = command
        .lock()
        .ok()
        .and_then(|c| c.clone())
        .unwrap_or(("shell", None));
    let end = SessionEnd {
        exit_code,
        bytes_in: bytes_in.load(Ordering::Relaxed),
        bytes_out,
        status: "complete".into(),
        kind: Some(kind.into()),
        command,
    };
    Inner::end_session(state, &grant, end).await;
}

/// Whether the recording in `rec` reached `max_recording_size` and the session must end
/// (`strict`). Under `best_effort` the recording is finished where it stopped and the session
/// goes on unrecorded; both are audited (`session.recording_limit`).
async fn recording_full(
    rec: &Shared<Option<Recorder>>,
    grant: &SessionGrant,
    events: &EventSink,
    max_bytes: u64,
) -> bool {
    let full = rec.lock().ok().and_then(|mut r| r.take_if(|r| r.is_full()));
    let Some(full) = full else {
        return false;
    };
    full.finish();
    recording_limit_reached(grant, events, max_bytes).await
}

/// Audits a recording that reached `max_recording_size`; answers whether the session must end
/// (`strict`).
async fn recording_limit_reached(grant: &SessionGrant, events: &EventSink, max_bytes: u64) -> bool {
    let strict = grant.record == "strict";
    tracing::warn!(session = %grant.session_id, max_bytes, strict, "recording reached max_recording_size");
    let action = if strict {
        "session ended"
    } else {
        "recording stopped"
    };
    events
        .send(
            "session.recording_limit",
            json!({"max_recording_size": max_bytes, "record_session": grant.record, "action": action}),
        )
        .await;
    strict
}

/// User → node: data, EOF and resizes in order, without ever stalling the user's session loop.
async fn user_to_node(mut rx: flow::Receiver, node: Arc<ChannelWriteHalf<ClientMsg>>) {
    while let Some(item) = rx.recv().await {
        let ok = match item {
            Input::Data(d) => node.data_bytes(d).await.is_ok(),
            Input::Eof => node.eof().await.is_ok(),
            Input::Resize { cols, rows } => node.window_change(cols, rows, 0, 0).await.is_ok(),
        };
        if !ok {
            break;
        }
    }
}

impl russh::server::Handler for Inner {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        cert: &Certificate,
    ) -> Result<Auth, Self::Error> {
        self.login = None;
        self.refusal = None;
        let cas = self.state.user_cas();
        let now = sallyport_core::sshcert::now();
        match sallyport_core::sshcert::verify_user(cert, &cas, login, now) {
            // The inner connection must be the same person as the outer one.
            Ok(user) if user == self.user => {
                self.login = Some(login.to_string());
                self.cert_expires = cert.valid_before();
                if self.counted.is_none() {
                    self.counted = Some(self.state.open_inner(&self.user));
                }
                Ok(Auth::Accept)
            }
            // Genuine, current, this user's — but without this login: let the session be
            // refused at channel open, where the reason reaches the person.
            Err(e @ sallyport_core::sshcert::CertRefusal::Principal { .. })
                if sallyport_core::sshcert::verify_user_any_login(cert, &cas, now).as_deref()
                    == Ok(self.user.as_str()) =>
            {
                self.login = Some(login.to_string());
                self.refusal = Some(e.to_string());
                if self.counted.is_none() {
                    self.counted = Some(self.state.open_inner(&self.user));
                }
                Ok(Auth::Accept)
            }
            Ok(other) => {
                tracing::warn!(outer = %self.user, inner = %other, "inner certificate belongs to another user");
                Ok(Auth::reject())
            }
            Err(e) => {
                tracing::info!(user = %self.user, login, node = %self.node.hostname, error = %e, "certificate refused");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let id = channel.id();
        drop(channel);
        let open = u32::try_from(self.chans.len()).unwrap_or(u32::MAX);
        let past_cap = self.session_cap.is_some_and(|cap| open >= cap);
        if past_cap
            && self.refused_past_cap
            && let Some(cap) = self.session_cap
        {
            let reason = sallyport_core::api::max_sessions_refusal(open, cap);
            reply.reject(refuse(reason)).await;
            return Ok(());
        }
        match self.open_node_session(session.handle()).await {
            Ok((grant, conn, node_channel, asked)) => {
                self.session_cap = grant.max_sessions;
                let (read, write) = node_channel.split();
                let write = Arc::new(write);
                let (tx, rx) = flow::inbox();
                let relay = Relay {
                    node: write.clone(),
                    input: tx,
                    events: EventSink::spawn(self.state.clone(), grant.session_id.clone()),
                    grant,
                    rec: Arc::new(Mutex::new(None)),
                    pty: None,
                    command: Arc::new(Mutex::new(None)),
                    bytes_in: Arc::new(AtomicU64::new(0)),
                    recording_started: false,
                    copy: Arc::new(Mutex::new(None)),
                    asked,
                    activity: self.activity.clone(),
                };
                let _ = relay.asked.events.set(relay.events.clone());
                let _ = relay.asked.recheck.set(Arc::new(GrantRecheck::new(
                    self.state.clone(),
                    &relay.grant,
                )));
                tokio::spawn(user_to_node(rx, write));
                tokio::spawn(node_to_user(
                    self.state.clone(),
                    read,
                    session.handle(),
                    id,
                    conn,
                    Outputs {
                        grant: relay.grant.clone(),
                        rec: relay.rec.clone(),
                        command: relay.command.clone(),
                        bytes_in: relay.bytes_in.clone(),
                        copy: relay.copy.clone(),
                        events: relay.events.clone(),
                        activity: relay.activity.clone(),
                        cert_expires: self.cert_expires,
                    },
                ));
                self.chans.insert(id, relay);
                reply.accept().await;
            }
            Err(reason) => {
                tracing::info!(user = %self.user, node = %self.node.hostname, %reason, "session refused");
                self.refused_past_cap |= past_cap;
                reply.reject(refuse(reason)).await;
            }
        }
        Ok(())
    }

    async fn pty_request(
        &mut self,
        ch: ChannelId,
        term: &str,
        cols: u32,
        rows: u32,
        pw: u32,
        ph: u32,
        modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(r) = self.chans.get_mut(&ch) else {
            return session.channel_failure(ch);
        };
        r.pty = Some((term.to_string(), cols, rows));
        if r.node
            .request_pty(true, term, cols, rows, pw, ph, modes)
            .await
            .is_err()
        {
            session.channel_failure(ch)?;
        }
        Ok(())
    }

    async fn env_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        value: &str,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            let _ = r.node.set_env(false, name, value).await;
        }
        Ok(())
    }

    async fn shell_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Err(e) = self.begin(ch, "shell", None, true) {
            session.extended_data(ch, 1, Bytes::from(format!("sallyport: {e}\r\n")))?;
            session.channel_failure(ch)?;
            return session.close(ch);
        }
        match self.chans.get(&ch) {
            Some(r) if r.node.request_shell(true).await.is_ok() => Ok(()),
            _ => session.channel_failure(ch),
        }
    }

    async fn exec_request(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Bounded before it is parsed, audited or sent on (agentless nodes have only this check).
        if data.len() > sallyport_core::names::MAX_EXEC_COMMAND {
            let e = format!(
                "the command is {} bytes long; the limit is {}",
                data.len(),
                sallyport_core::names::MAX_EXEC_COMMAND
            );
            return self.refuse_request(ch, &e, session);
        }
        let cmd = String::from_utf8_lossy(data).into_owned();
        // An rsync to a node without the agent runs through the login's shell (sshd's way),
        // which the login can make run anything, and rsync's stream is not held to its
        // protocol as scp's and SFTP's are: there it is a recorded session. (An agent runs
        // copies itself, never through the shell.)
        let agentless = self
            .chans
            .get(&ch)
            .is_some_and(|r| r.grant.node.kind != "agent");
        let copy = sallyport_core::scp::classify(&cmd)
            .filter(|c| !(agentless && matches!(c, FileCopy::Rsync { .. })));
        // Refused when it is a copy or only wraps one: what `ssh_file_copy: false` refused
        // before stays refused, though only an exact copy goes unrecorded.
        if let Some(r) = self.chans.get(&ch)
            && !r.grant.file_copy
            && (copy.is_some() || sallyport_core::scp::mentions_copy(&cmd))
        {
            r.events
                .send("scp", json!({"command": cmd, "result": FILE_COPY_REFUSED}))
                .await;
            return self.refuse_request(ch, FILE_COPY_REFUSED, session);
        }
        if let Some(copy) = copy {
            let Some(r) = self.chans.get(&ch) else {
                return session.channel_failure(ch);
            };
            if let Ok(mut slot) = r.copy.lock() {
                *slot = Some(CopyAudit::new(copy));
            }
            if let Err(e) = self.begin(ch, "exec", Some(&cmd), false) {
                return self.refuse_request(ch, &e, session);
            }
        } else if let Err(e) = self.begin(ch, "exec", Some(&cmd), true) {
            session.extended_data(ch, 1, Bytes::from(format!("sallyport: {e}\r\n")))?;
            session.channel_failure(ch)?;
            return session.close(ch);
        }
        match self.chans.get(&ch) {
            Some(r) if r.node.exec(true, data.to_vec()).await.is_ok() => Ok(()),
            _ => session.channel_failure(ch),
        }
    }

    async fn subsystem_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(r) = self.chans.get(&ch) else {
            return session.channel_failure(ch);
        };
        if name != "sftp" {
            let msg = format!("subsystem {name:?} is not offered (only sftp)");
            return self.refuse_request(ch, &msg, session);
        }
        if !r.grant.file_copy {
            r.events
                .send(
                    "sftp",
                    json!({"action": "start", "result": FILE_COPY_REFUSED}),
                )
                .await;
            return self.refuse_request(ch, FILE_COPY_REFUSED, session);
        }
        if let Ok(mut slot) = r.copy.lock() {
            *slot = Some(CopyAudit::Sftp(SftpAudit::new()));
        }
        if let Err(e) = self.begin(ch, "sftp", None, false) {
            return self.refuse_request(ch, &e, session);
        }
        match self.chans.get(&ch) {
            Some(r) if r.node.request_subsystem(true, name).await.is_ok() => Ok(()),
            _ => session.channel_failure(ch),
        }
    }

    async fn agent_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let Some(r) = self.chans.get(&ch) else {
            return Ok(false);
        };
        if !r.grant.forward_agent {
            let msg = format!("sallyport: {AGENT_FORWARDING_REFUSED}\r\n");
            session.extended_data(ch, 1, Bytes::from(msg))?;
            return Ok(false);
        }
        r.asked.agent.store(true, Ordering::Relaxed);
        if r.node.agent_forward(false).await.is_err() {
            return Ok(false);
        }
        r.events
            .send("agent-forward", json!({"result": "ok"}))
            .await;
        Ok(true)
    }

    async fn x11_request(
        &mut self,
        ch: ChannelId,
        _single_connection: bool,
        _x11_auth_protocol: &str,
        _x11_auth_cookie: &str,
        _x11_screen_number: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(r) = self.chans.get(&ch) else {
            return session.channel_failure(ch);
        };
        if !r.grant.x11_forwarding {
            let msg = format!("sallyport: {X11_FORWARDING_REFUSED}\r\n");
            session.extended_data(ch, 1, Bytes::from(msg))?;
            return session.channel_failure(ch);
        }
        r.asked.x11.store(true, Ordering::Relaxed);
        // The node's answer reaches the person through the channel's relay.
        if r.node
            .request_x11(
                true,
                _single_connection,
                _x11_auth_protocol,
                _x11_auth_cookie,
                _x11_screen_number,
            )
            .await
            .is_err()
        {
            return session.channel_failure(ch);
        }
        r.events
            .send(
                "x11-forward",
                json!({"screen": _x11_screen_number, "result": "ok"}),
            )
            .await;
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        originator: &str,
        originator_port: u32,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let fwd = match self.forwarder(session.handle()).await {
            Ok(f) => f,
            Err(reason) => {
                reply.reject(refuse(reason)).await;
                return Ok(());
            }
        };
        if !fwd.grant.port_forwarding {
            tracing::info!(user = %self.user, node = %self.node.hostname, host, port, "port forward refused by roles");
            reply.reject(refuse(PORT_FORWARDING_REFUSED)).await;
            return Ok(());
        }
        let (conn, events, slot, bytes, recheck) = (
            fwd.conn.clone(),
            fwd.events.clone(),
            fwd.open_failure.clone(),
            fwd.bytes.clone(),
            fwd.recheck.clone(),
        );
        let activity = self.activity.clone();
        let (host, originator) = (host.to_string(), originator.to_string());
        tokio::spawn(async move {
            if let Err(why) = recheck.allowed().await {
                tracing::info!(session = %recheck.session_id, %why, "forwarded connection refused");
                events
                    .send(
                        "port",
                        json!({"kind": "local", "addr": format!("{host}:{port}"),
                            "originator": format!("{originator}:{originator_port}"),
                            "result": why}),
                    )
                    .await;
                reply.reject(refuse(why)).await;
                return;
            }
            match conn
                .channel_open_direct_tcpip(host.clone(), port, originator.clone(), originator_port)
                .await
            {
                Ok(nch) => {
                    reply.accept().await;
                    let (up, down) = sallyport_core::flow::splice_with(
                        channel.into_stream(),
                        nch.into_stream(),
                        Some(&activity),
                    )
                    .await;
                    bytes.0.fetch_add(up, Ordering::Relaxed);
                    bytes.1.fetch_add(down, Ordering::Relaxed);
                    events
                        .send(
                            "port",
                            json!({"kind": "local", "addr": format!("{host}:{port}"),
                                "originator": format!("{originator}:{originator_port}"),
                                "bytes_in": up, "bytes_out": down}),
                        )
                        .await;
                }
                Err(e) => {
                    let why = sallyport_core::flow::open_failure_reason(&slot, e).await;
                    reply.reject(refuse(why)).await;
                }
            }
        });
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let user = self.user.clone();
        let fwd = match self.forwarder(session.handle()).await {
            Ok(f) => f,
            Err(reason) => {
                tracing::info!(%user, %reason, "remote forward refused");
                return Ok(false);
            }
        };
        // A new bind asks as a new connection does: the roles may have changed since the
        // forwarding connection's grant.
        if let Err(why) = fwd.recheck.allowed().await {
            tracing::info!(%user, address, port = *port, %why, "remote forward refused");
            fwd.events
                .send(
                    "port",
                    json!({"kind": "remote", "addr": format!("{address}:{port}"),
                    "result": why}),
                )
                .await;
            return Ok(false);
        }
        match fwd.conn.tcpip_forward(address, *port).await {
            Ok(allocated) => {
                if *port == 0 {
                    *port = allocated;
                }
                if let Ok(mut f) = self.remote_forwards.lock() {
                    f.insert((address.to_string(), *port));
                }
                Ok(true)
            }
            Err(e) => {
                tracing::info!(%user, address, port = *port, error = %e, "node refused a remote forward");
                Ok(false)
            }
        }
    }

    async fn cancel_tcpip_forward(
        &mut self,
        address: &str,
        port: u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let known = self
            .remote_forwards
            .lock()
            .map(|mut f| f.remove(&(address.to_string(), port)))
            .unwrap_or(false);
        match (&self.forwarder, known) {
            (Some(f), true) => Ok(f.conn.cancel_tcpip_forward(address, port).await.is_ok()),
            _ => Ok(false),
        }
    }

    async fn data(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            r.bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
            r.activity.store(now_ms(), Ordering::Relaxed);
            let audited = match r.copy.lock() {
                Ok(mut c) => match c.as_mut() {
                    Some(c) => c.feed(Direction::Upload, data),
                    None => Ok(vec![]),
                },
                Err(_) => Err("audit state lost".to_string()),
            };
            match audited {
                Ok(list) if list.is_empty() => {}
                Ok(list) => send_all(&r.events, list).await,
                Err(e) => {
                    tracing::warn!(user = %self.user, error = %e, "closing a file copy that cannot be audited");
                    let ev = r
                        .copy
                        .lock()
                        .ok()
                        .and_then(|c| c.as_ref().map(|c| c.aborted(&e)))
                        .unwrap_or_else(|| copy_aborted(&e));
                    send_all(&r.events, vec![ev]).await;
                    _session.extended_data(
                        ch,
                        1,
                        Bytes::from(format!("sallyport: {e}; closing\r\n")),
                    )?;
                    if let Some(r) = self.chans.remove(&ch) {
                        let _ = r.node.close().await;
                    }
                    return _session.close(ch);
                }
            }
            // One copy out of russh's buffer, shared by the recorder and the relay.
            let mut chunk = Bytes::copy_from_slice(data);
            if let Ok(mut rec) = r.rec.lock()
                && let Some(rec) = rec.as_mut()
            {
                // Under `strict` (and `record_input`), input the recording cannot hold does not
                // reach the node either; the node side then ends the session.
                chunk.truncate(rec.input(chunk.clone()));
            }
            if chunk.is_empty() {
                return Ok(());
            }
            if !r.input.send(Input::Data(chunk)).await {
                tracing::warn!(user = %self.user, node = %self.node.hostname, "closing a channel the node stopped reading");
                if let Some(r) = self.chans.remove(&ch) {
                    let _ = r.node.close().await;
                }
                return _session.close(ch);
            }
        }
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            r.input.send(Input::Eof).await;
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
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            if let Ok(mut rec) = r.rec.lock()
                && let Some(rec) = rec.as_mut()
            {
                rec.resize(cols, rows);
            }
            r.input.send(Input::Resize { cols, rows }).await;
        }
        Ok(())
    }

    async fn signal(
        &mut self,
        ch: ChannelId,
        sig: Sig,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            let _ = r.node.signal(sig).await;
        }
        Ok(())
    }

    async fn channel_close(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.remove(&ch) {
            let _ = r.node.close().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod agent_event_tests {
    use super::*;

    #[test]
    fn an_agent_report_is_taken_once_small_and_only_with_a_host_user_grant() {
        assert!(agent_event_allowed(true, false, 300));
        assert!(agent_event_allowed(true, false, AGENT_EVENT_MAX));
        assert!(
            !agent_event_allowed(false, false, 300),
            "no host-user grant"
        );
        assert!(!agent_event_allowed(true, true, 300), "a second report");
        assert!(
            !agent_event_allowed(true, false, AGENT_EVENT_MAX + 1),
            "too big"
        );
    }
}
