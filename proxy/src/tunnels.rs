//! The agents' door (port 3024): TLS with a host certificate from this cluster's host CA is the
//! only way in, and the certificate's CN is the node id — an agent cannot register as another
//! node. Each accepted connection becomes a multiplexed tunnel the proxy opens sessions through.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sallyport_core::api::Presence;
use sallyport_core::metrics::{TunnelKind, metrics};
use sallyport_core::names::MAX_HEARTBEAT_LINE;
use sallyport_core::tunnel::{self, Opener, Side, TunnelStream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::AuthClient;
use crate::auth_client::ClientError;
use crate::presence::Outcome;

/// What an agent's tunnel serves, as its certificate's O says (`node` or `kube`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentKind {
    /// SSH on every stream.
    Node,
    /// HTTP to its Kubernetes API server on every stream.
    Kube,
}

impl AgentKind {
    fn label(self) -> TunnelKind {
        match self {
            AgentKind::Node => TunnelKind::Node,
            AgentKind::Kube => TunnelKind::Kube,
        }
    }
}

/// A live tunnel: the generation that registered it, its opener, and what it serves.
type Entry = (u64, Opener, AgentKind);

/// Live tunnels by node id, newest last: sessions take the newest that is still open. An agent
/// normally holds one tunnel to each proxy; a second one to the same proxy (a reconnect that
/// raced the old one's end, a load balancer sending it back here) is kept until it closes.
#[derive(Clone, Default)]
pub struct Tunnels {
    inner: Arc<Mutex<HashMap<String, Vec<Entry>>>>,
    set: crate::registry::ProxySet,
    /// This proxy's id, for batched presence refreshes (none: each reported on its own).
    proxy_id: Option<String>,
}

impl Tunnels {
    /// A node agent's tunnel (never a kube agent's: SSH cannot reach one).
    pub fn get(&self, node_id: &str) -> Option<Opener> {
        self.get_kind(node_id, AgentKind::Node)
    }

    /// A kube agent's tunnel.
    pub fn get_kube(&self, cluster_id: &str) -> Option<Opener> {
        self.get_kind(cluster_id, AgentKind::Kube)
    }

    fn get_kind(&self, id: &str, kind: AgentKind) -> Option<Opener> {
        self.inner
            .lock()
            .ok()?
            .get(id)?
            .iter()
            .rev()
            .filter(|(_, o, k)| *k == kind && !o.is_closed())
            .map(|(_, o, _)| o.clone())
            .next()
    }

    /// The cluster's proxy set, as this proxy's agents hear it.
    pub fn with_proxy_set(mut self, set: crate::registry::ProxySet) -> Self {
        self.set = set;
        self
    }

    /// Refreshes of its agents' presence go to auth in one request a second, as proxy `id`.
    pub fn with_proxy_id(mut self, id: String) -> Self {
        self.proxy_id = Some(id);
        self
    }

    /// How many agents have a tunnel here now.
    pub fn count(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
    }

    fn insert(&self, node_id: &str, opener: Opener, kind: AgentKind) -> u64 {
        let generation = rand::random::<u64>();
        if let Ok(mut m) = self.inner.lock() {
            m.entry(node_id.to_string())
                .or_default()
                .push((generation, opener, kind));
            metrics().tunnel_connected(kind.label(), None);
        }
        generation
    }

    /// Removes the tunnel registered under `generation`; true when it was the node's last here.
    fn remove(&self, node_id: &str, generation: u64) -> bool {
        let Ok(mut m) = self.inner.lock() else {
            return false;
        };
        let Some(list) = m.get_mut(node_id) else {
            return false;
        };
        let Some(i) = list.iter().position(|(g, _, _)| *g == generation) else {
            return false;
        };
        let (_, _, kind) = list.remove(i);
        metrics().tunnel_disconnected(kind.label());
        if list.is_empty() {
            m.remove(node_id);
            true
        } else {
            false
        }
    }
}

/// The heartbeat an agent sends on its own stream.
#[derive(serde::Deserialize)]
struct Heartbeat {
    labels: Option<BTreeMap<String, String>>,
    /// Its certificates are past two thirds of their life: renew them over these keys.
    #[serde(default)]
    renew: Option<sallyport_core::api::RenewRequest>,
}

/// How often an unchanged heartbeat is reported to auth as presence. Agents beat every 10 s;
/// auth counts a node online for 45 s after its last report (`PRESENCE_TTL`), so reporting
/// every third beat (the first at least this long after the last report) keeps a live node
/// online with a beat and a margin to spare, and a tunnel's end is reported at once anyway.
/// Each report is a request to auth and a database write: with 10,000 idle agents, one a beat
/// was 1,000 a second, most of the proxy's and auth's work at rest. The refreshes themselves go
/// to auth in one request a second for all agents ([`crate::presence::Batch`]).
const PRESENCE_REFRESH: Duration = Duration::from_secs(25);

/// Reads an agent's heartbeats until its stream ends or goes quiet, reporting them to auth as
/// presence (the first, any whose labels changed, and one at least every [`PRESENCE_REFRESH`]),
/// and answering each `ok`. A line over [`MAX_HEARTBEAT_LINE`], one that is not a heartbeat,
/// or labels auth refuses (built-in or oversized) is answered `error: <why>` and ends the
/// tunnel: the agent logs why, and is not online under labels it was refused.
async fn heartbeats(
    hb: TunnelStream,
    node_id: &str,
    auth: &AuthClient,
    set: &crate::registry::ProxySet,
    batch: Option<&crate::presence::Batch>,
) {
    let (r, mut w) = tokio::io::split(hb);
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    // When presence was last recorded, and with which labels.
    let mut reported: Option<(std::time::Instant, Option<BTreeMap<String, String>>)> = None;
    loop {
        line.clear();
        // Bounded: `lines()` would buffer whatever an agent sends before a newline.
        let mut bounded = (&mut r).take(MAX_HEARTBEAT_LINE as u64 + 1);
        let read = bounded.read_until(b'\n', &mut line);
        match tokio::time::timeout(Duration::from_secs(35), read).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
        let mut renewed = None;
        let refusal = if line.len() > MAX_HEARTBEAT_LINE {
            Some(format!(
                "heartbeat line over {MAX_HEARTBEAT_LINE} bytes; fewer or shorter labels"
            ))
        } else {
            match serde_json::from_slice::<Heartbeat>(line.trim_ascii_end()) {
                Err(e) => Some(format!("heartbeat is not JSON: {e}")),
                Ok(h) => {
                    if let Some(req) = &h.renew {
                        // For the node the tunnel's certificate proved, never another.
                        let path = sallyport_core::routes::auth::node_renew(node_id);
                        match auth
                            .json::<_, sallyport_core::api::Renewed>(
                                reqwest::Method::POST,
                                &path,
                                Some(req),
                            )
                            .await
                        {
                            Ok(r) => renewed = Some(r),
                            // Removed: its tunnel ends now.
                            Err(ClientError::Refused {
                                status: 404,
                                message,
                                ..
                            }) => return refuse(&mut w, node_id, message).await,
                            Err(e) => {
                                tracing::warn!(node = %node_id, error = %e, "an agent's certificates were not renewed")
                            }
                        }
                    }
                    let fresh = reported.as_ref().is_some_and(|(at, labels)| {
                        at.elapsed() < PRESENCE_REFRESH && *labels == h.labels
                    });
                    // Unchanged labels, reported before: refreshed with the next batch.
                    let refresh =
                        batch.filter(|_| reported.as_ref().is_some_and(|(_, l)| *l == h.labels));
                    if fresh {
                        None
                    } else {
                        let outcome = match refresh {
                            Some(batch) => batch.refresh(node_id).await,
                            None => {
                                let p = Presence {
                                    online: true,
                                    labels: h.labels.clone(),
                                };
                                crate::presence::report(auth, node_id, &p).await
                            }
                        };
                        match outcome {
                            Outcome::Recorded => {
                                reported = Some((std::time::Instant::now(), h.labels));
                                None
                            }
                            // Labels refused, or the node removed: its tunnel ends now.
                            Outcome::Refused(message) => Some(message),
                            // Auth being away is not the agent's fault: keep the tunnel.
                            Outcome::NotRecorded(e) => {
                                tracing::warn!(node = %node_id, error = %e, "presence not recorded");
                                None
                            }
                        }
                    }
                }
            }
        };
        if let Some(why) = refusal {
            return refuse(&mut w, node_id, why).await;
        }
        let answer = set.answer(renewed);
        if w.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Tells the agent why its tunnel ends (one line, control characters dropped).
async fn refuse<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, node_id: &str, why: String) {
    tracing::warn!(node = %node_id, error = %why, "refused an agent's heartbeat; closing its tunnel");
    let why: String = why.chars().filter(|c| !c.is_control()).collect();
    let _ = w.write_all(format!("error: {why}\n").as_bytes()).await;
    let _ = w.flush().await;
}

pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    tunnels: Tunnels,
    auth: AuthClient,
    limits: sallyport_core::door::Limits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let door = sallyport_core::door::Door::new("tunnel", limits);
    let batch = tunnels
        .proxy_id
        .clone()
        .map(|id| crate::presence::Batch::start(auth.clone(), id));
    loop {
        let Ok((tcp, addr)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        // Until its handshake proves a node certificate, a connection counts against the caps;
        // beyond them it is closed before the handshake (agents retry with backoff).
        let counted = match door.admit(addr.ip()) {
            Ok(c) => c,
            // Logged by the door, as a count.
            Err(_) => continue,
        };
        let (acceptor, tunnels, auth) = (acceptor.clone(), tunnels.clone(), auth.clone());
        let batch = batch.clone();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %addr, error = %e, "tunnel handshake failed");
                        // TLS refused it (no certificate, a wrong CA, ...); a bare TCP probe
                        // that hung up is not an authentication attempt.
                        if e.kind() == std::io::ErrorKind::InvalidData {
                            crate::failed_auth::tunnel_refused(
                                &auth,
                                addr,
                                format!("TLS handshake refused: {e}"),
                                Default::default(),
                            );
                        }
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(peer = %addr, "tunnel handshake timed out");
                        return;
                    }
                };
            let Some(leaf) = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first().cloned())
            else {
                return;
            };
            let Ok(subject) = sallyport_core::x509::parse_subject(&leaf) else {
                return;
            };
            let kind = match subject.organizations.as_slice() {
                [o] if o == "node" => Some(AgentKind::Node),
                [o] if o == "kube" => Some(AgentKind::Kube),
                _ => None,
            };
            let Some(kind) =
                kind.filter(|_| subject.issuer_common_name == sallyport_core::ca::TLS_HOST_CA_CN)
            else {
                tracing::warn!(peer = %addr, cn = %subject.common_name, "refused a tunnel from a certificate that is not a node's");
                crate::failed_auth::tunnel_refused(
                    &auth,
                    addr,
                    "not a node or kube agent certificate from this cluster's host CA".into(),
                    [
                        ("cert_subject_cn".to_string(), subject.common_name.clone()),
                        (
                            "cert_issuer_cn".to_string(),
                            subject.issuer_common_name.clone(),
                        ),
                        (
                            "cert_organizations".to_string(),
                            subject.organizations.join(","),
                        ),
                    ]
                    .into(),
                );
                return;
            };
            counted.authenticated();
            let node_id = subject.common_name;
            let (opener, mut inbound) = tunnel::run(tls, Side::Proxy);
            let generation = tunnels.insert(&node_id, opener, kind);
            tracing::info!(node = %node_id, peer = %addr, "agent tunnel up");
            // The agent's first stream is its heartbeat: labels in, "ok" out.
            if let Some(hb) = inbound.recv().await {
                // No other stream from an agent is taken: one it opens is let go of at once
                // rather than parked, counted by yamux against the tunnel's streams.
                drop(inbound);
                heartbeats(hb, &node_id, &auth, &tunnels.set, batch.as_ref()).await;
            }
            if tunnels.remove(&node_id, generation) {
                let p = Presence {
                    online: false,
                    labels: None,
                };
                let _ = auth
                    .json::<_, serde_json::Value>(
                        reqwest::Method::POST,
                        &sallyport_core::routes::auth::node_presence(&node_id),
                        Some(&p),
                    )
                    .await;
            }
            tracing::info!(node = %node_id, "agent tunnel down");
        });
    }
}
