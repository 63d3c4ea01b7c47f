//! The node end of a session: through the node's agent tunnel (SSH inside mutually
//! authenticated TLS, the `none` cipher) or to its agentless address (real ciphers, the host key
//! pinned at first contact), the node's host certificate checked against the cluster's host CA,
//! and the per-session certificate auth minted presented for exactly the granted login.
//!
//! Channels the node opens toward the person (`forwarded-tcpip` for `-R`, agent, X11) are
//! relayed only through a door that has them ([`Toward`], the SSH door's), only when the person
//! asked and the roles allowed it, and only after the grant is checked again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use russh::client::Msg as ClientMsg;
use russh::keys::ssh_key::Certificate;
use russh::{Channel, ChannelId, ChannelOpenFailure};
use sallyport_core::api::{NodeInfo, NodeKind, SessionGrant};
use sallyport_core::audit::EventType;
use sallyport_core::tunnel::OpenError;
use serde_json::json;

use super::Refusal;
use super::audit::Audit;
use super::authorize::GrantRecheck;
use crate::state::ProxyState;

pub type Shared<T> = Arc<Mutex<T>>;
pub type NodeConn = Arc<russh::client::Handle<NodeClient>>;

/// Channels a node may open toward the person, once they asked for them and the roles agreed.
#[derive(Default)]
pub struct Asked {
    pub agent: AtomicBool,
    pub x11: AtomicBool,
    /// The session's grant, checked again before each agent or X11 channel the node opens
    /// (set once the session channel is open), and where such a refusal is audited.
    pub recheck: OnceLock<Arc<GrantRecheck>>,
    pub audit: OnceLock<Audit>,
}

/// The person's side for channels the node opens toward them (the SSH door's connection).
#[derive(Clone)]
pub struct Toward {
    pub user: russh::server::Handle,
    pub asked: Arc<Asked>,
    /// Remote forwards the person asked for and the node granted, by (address, port).
    pub remote_forwards: Shared<HashSet<(String, u32)>>,
    pub audit: Arc<OnceLock<Audit>>,
    /// Set on the forwarding connection: its grant, checked again per remote-forwarded
    /// connection. Other node connections have none, and carry no forwards.
    pub recheck: Arc<OnceLock<Arc<GrantRecheck>>>,
    pub forward_bytes: Arc<(AtomicU64, AtomicU64)>,
    /// The person's connection's last activity (for idle timeouts).
    pub activity: Arc<AtomicU64>,
}

/// A node connection, with the node's reason for the last channel it refused.
pub struct Dialed {
    pub conn: NodeConn,
    pub open_failure: Shared<Option<String>>,
}

/// Connects to `grant`'s node and authenticates as `login` with the per-session certificate.
pub async fn dial(
    state: Arc<ProxyState>,
    grant: &SessionGrant,
    login: &str,
    toward: Option<Toward>,
) -> Result<Dialed, Refusal> {
    let connected = connect(state, &grant.node, toward).await?;
    connected.authenticate(grant, login).await
}

/// Whether a session to `node` may be dialed while auth is still deciding it
/// ([`connect`] beside the grant, then [`Connected::authenticate`]): only inside an agent's
/// tunnel, where the key exchange is all that happens before the certificate and the agent is
/// ours. An agentless node's sshd would log every refused session as a connection closed
/// before authentication, so it is dialed only once granted.
pub fn dials_ahead(node: &NodeInfo) -> bool {
    through_tunnel(node)
}

/// Whether `node` is reached through its agent's tunnel (a node agent or a kube agent), not at
/// an agentless address.
fn through_tunnel(node: &NodeInfo) -> bool {
    matches!(node.kind, NodeKind::Agent | NodeKind::Kube)
}

/// A node connection whose key exchange is done and whose host certificate (or pinned key) was
/// accepted, not yet authenticated: nothing can be asked of the node on it.
pub struct Connected {
    handle: russh::client::Handle<NodeClient>,
    state: Arc<ProxyState>,
    node: NodeInfo,
    this_conn: ConnSlot,
    open_failure: Shared<Option<String>>,
}

/// Connects to `node` (its tunnel, or its address) and checks its host key, as far as an SSH
/// connection goes before authentication.
pub async fn connect(
    state: Arc<ProxyState>,
    node: &NodeInfo,
    toward: Option<Toward>,
) -> Result<Connected, Refusal> {
    let host_key_problem: Shared<Option<String>> = Arc::new(Mutex::new(None));
    let open_failure: Shared<Option<String>> = Arc::new(Mutex::new(None));
    let this_conn: ConnSlot = Arc::new(OnceLock::new());
    let client = NodeClient {
        conn: this_conn.clone(),
        state: state.clone(),
        node: node.clone(),
        open_failure: open_failure.clone(),
        host_key_problem: host_key_problem.clone(),
        toward,
    };
    let explain = |e: russh::Error| -> Refusal {
        match host_key_problem.lock().ok().and_then(|p| p.clone()) {
            Some(p) => Refusal::HostKey(p),
            None => Refusal::Failed(format!("node {}: {e}", node.hostname)),
        }
    };
    // Inside an agent's tunnel the TLS layer is the cipher; an agentless node's TCP
    // connection gets real SSH ciphers, and the window sshd itself would get from OpenSSH.
    // A kube agent is dialed as a node agent is: SSH inside its tunnel.
    let agent = through_tunnel(node);
    let mut config = if agent {
        sallyport_core::sshcert::client_config(sallyport_core::sshcert::preferred_in_tunnel())
    } else {
        russh::client::Config {
            window_size: sallyport_core::flow::CLIENT_WINDOW,
            ..sallyport_core::sshcert::client_config(sallyport_core::sshcert::preferred())
        }
    };
    // The node's window is given back only as what it sent is handed on to the person
    // (`relay::output`, and the channels below): a slow reader holds the node back instead of
    // the proxy buffering (`sallyport_core::flow`, `vendor/russh/PATCHES.md`).
    config.window_policy = russh::WindowPolicy::Consumed;
    let config = Arc::new(config);
    let handle = if agent {
        let opener = match node.kind {
            NodeKind::Kube => state.tunnels.get_kube(&node.id),
            _ => state.tunnels.get(&node.id),
        };
        let offline = || {
            Refusal::Offline(format!(
                "node {} is offline: its agent is not connected to this proxy",
                node.hostname
            ))
        };
        let stream = match opener {
            Some(o) => o.open().await.map_err(|e| match e {
                OpenError::Full(_) => Refusal::Limit(format!(
                    "node {} is busy: {e}; try again when some end",
                    node.hostname
                )),
                OpenError::Closed => offline(),
            })?,
            None => return Err(offline()),
        };
        russh::client::connect_stream(config, sallyport_core::flow::Decoupled::new(stream), client)
            .await
            .map_err(explain)?
    } else {
        let addr = node
            .addr
            .clone()
            .ok_or_else(|| Refusal::Failed("the node has no address".into()))?;
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(&addr),
        )
        .await
        .map_err(|_| Refusal::Offline(format!("node {} at {addr} did not answer", node.hostname)))?
        .map_err(|e| Refusal::Offline(format!("node {} at {addr}: {e}", node.hostname)))?;
        let _ = tcp.set_nodelay(true);
        russh::client::connect_stream(config, sallyport_core::flow::Decoupled::new(tcp), client)
            .await
            .map_err(explain)?
    };
    Ok(Connected {
        handle,
        state,
        node: node.clone(),
        this_conn,
        open_failure,
    })
}

impl Connected {
    /// Authenticates as `login` with `grant`'s per-session certificate: the connection must be
    /// to the node auth granted.
    pub async fn authenticate(
        mut self,
        grant: &SessionGrant,
        login: &str,
    ) -> Result<Dialed, Refusal> {
        let node = &self.node;
        if grant.node.id != node.id || grant.node.kind != node.kind {
            return Err(Refusal::Failed(format!(
                "node {}: the session was granted for another node",
                node.hostname
            )));
        }
        let cert = Certificate::from_openssh(grant.ssh_cert.trim()).map_err(|e| e.to_string())?;
        let auth = self
            .handle
            .authenticate_openssh_cert(login.to_string(), self.state.key.clone(), cert)
            .await
            .map_err(|e| format!("node {}: {e}", node.hostname))?;
        if !auth.success() {
            let (tunnel, host) = (through_tunnel(node), &node.hostname);
            // russh answers a connection lost mid-authentication as a failure with no methods
            // left: not the node's refusal of the certificate.
            return Err(match (self.handle.is_closed(), tunnel) {
                (true, true) => Refusal::Offline(format!(
                    "node {host}: the connection closed before it answered the session \
                     certificate (its agent restarted or is overloaded?)"
                )),
                (true, false) => Refusal::Offline(format!(
                    "node {host}: the connection closed before it answered the session \
                     certificate (its sshd restarted, is overloaded, or closes after a refusal?)"
                )),
                (false, true) => Refusal::Failed(format!(
                    "node {host} refused the session certificate for login {login}; does its \
                     agent belong to this cluster?"
                )),
                (false, false) => Refusal::Failed(format!(
                    "node {host} refused the session certificate for login {login}; does its sshd \
                     trust `sallyctl auth export --type=openssh` (TrustedUserCAKeys)?"
                )),
            });
        }
        let conn = Arc::new(self.handle);
        let _ = self.this_conn.set(Arc::downgrade(&conn));
        Ok(Dialed {
            conn,
            open_failure: self.open_failure,
        })
    }
}

/// The proxy's SSH client toward a node: checks the node's host certificate (agents) or its
/// pinned host key (agentless OpenSSH servers), and keeps the reason of a refused channel.
/// The node connection a [`NodeClient`] belongs to, once it is made: what gives window back for
/// the channels the node opens.
type ConnSlot = Arc<OnceLock<std::sync::Weak<russh::client::Handle<NodeClient>>>>;

/// Both ends of a channel the node opened toward the person, as streams that give each peer its
/// window back as what is read from it is written on to the other (both connections run
/// `WindowPolicy::Consumed`).
fn credited_pair(
    conn: &ConnSlot,
    node: Channel<ClientMsg>,
    user: &russh::server::Handle,
    person: Channel<russh::server::Msg>,
) -> (
    sallyport_core::flow::Credited<russh::ChannelStream<ClientMsg>>,
    sallyport_core::flow::Credited<russh::ChannelStream<russh::server::Msg>>,
) {
    let (slot, id) = (conn.clone(), node.id());
    let node_credit: sallyport_core::flow::Credit = Arc::new(move |n| {
        if let Some(conn) = slot.get().and_then(std::sync::Weak::upgrade) {
            let _ = conn.consumed(id, n);
        }
    });
    let user_credit = sallyport_core::flow::server_credit(user.clone(), person.id());
    (
        sallyport_core::flow::Credited::new(node.into_stream(), node_credit),
        sallyport_core::flow::Credited::new(person.into_stream(), user_credit),
    )
}

pub struct NodeClient {
    conn: ConnSlot,
    state: Arc<ProxyState>,
    node: NodeInfo,
    open_failure: Shared<Option<String>>,
    /// Why the node's host key was not trusted, for the person's error message.
    host_key_problem: Shared<Option<String>>,
    /// Channels the node may open toward the person: only through a door that has them.
    toward: Option<Toward>,
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
                if self.node.kind == NodeKind::Agentless =>
            {
                let text = key.to_openssh().map_err(russh::Error::from)?;
                let path = sallyport_core::routes::auth::node_host_key(&self.node.id);
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
        let Some(t) = &self.toward else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let asked = t
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
        let Some(recheck) = t.recheck.get().cloned() else {
            tracing::warn!(node = %self.node.hostname, "node opened a forward on a session connection");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let (user, conn) = (t.user.clone(), self.conn.clone());
        let events = t.audit.get().cloned();
        let bytes = t.forward_bytes.clone();
        let activity = t.activity.clone();
        let (addr, oaddr) = (
            connected_address.to_string(),
            originator_address.to_string(),
        );
        tokio::spawn(async move {
            if let Err(why) = recheck.allowed().await {
                tracing::info!(session = %recheck.session_id, %why, "remote-forwarded connection refused");
                if let Some(ev) = events {
                    ev.event(
                        EventType::Port,
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
                    let (node, person) = credited_pair(&conn, channel, &user, uch);
                    let (down, up) =
                        sallyport_core::flow::splice_with(node, person, Some(&activity)).await;
                    bytes.0.fetch_add(up, Ordering::Relaxed);
                    bytes.1.fetch_add(down, Ordering::Relaxed);
                    if let Some(ev) = events {
                        ev.event(
                            EventType::Port,
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
        let Some(t) = self
            .toward
            .as_ref()
            .filter(|t| t.asked.agent.load(Ordering::Relaxed))
        else {
            tracing::warn!(node = %self.node.hostname, "node opened an agent channel nobody asked for");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let (user, conn) = (t.user.clone(), self.conn.clone());
        let asked = t.asked.clone();
        tokio::spawn(async move {
            if let Err(why) = recheck_node_channel(&asked, EventType::AgentForward, true).await {
                tracing::info!(%why, "agent channel refused");
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return;
            }
            match user.channel_open_agent().await {
                Ok(uch) => {
                    reply.accept().await;
                    let (node, person) = credited_pair(&conn, channel, &user, uch);
                    splice(node, person).await;
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
        let Some(t) = self
            .toward
            .as_ref()
            .filter(|t| t.asked.x11.load(Ordering::Relaxed))
        else {
            tracing::warn!(node = %self.node.hostname, "node opened an X11 channel nobody asked for");
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let (user, conn) = (t.user.clone(), self.conn.clone());
        let origin = originator_address.to_string();
        let asked = t.asked.clone();
        tokio::spawn(async move {
            if let Err(why) = recheck_node_channel(&asked, EventType::X11Forward, false).await {
                tracing::info!(%why, "X11 channel refused");
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return;
            }
            match user.channel_open_x11(origin, originator_port).await {
                Ok(uch) => {
                    reply.accept().await;
                    let (node, person) = credited_pair(&conn, channel, &user, uch);
                    splice(node, person).await;
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
async fn recheck_node_channel(asked: &Asked, event: EventType, agent: bool) -> Result<(), String> {
    let answer = match asked.recheck.get() {
        Some(r) if agent => r.agent_allowed().await,
        Some(r) => r.x11_allowed().await,
        None => Err("the session's grant is not known yet".to_string()),
    };
    if let (Err(why), Some(events)) = (&answer, asked.audit.get()) {
        events
            .event(event, json!({"result": why, "channel": "refused"}))
            .await;
    }
    answer
}
