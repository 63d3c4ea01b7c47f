//! The agent's side of the reverse tunnel: dial the proxy with the host certificate, keep the
//! connection, report labels on a heartbeat stream every few seconds, serve every stream the
//! proxy opens (SSH for a node agent, HTTP for a kube agent: a [`StreamServer`]), and reconnect
//! with jittered backoff whenever the connection ends.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::ServerName;
use sallyport_core::metrics::{CertificateKind, TunnelKind, metrics};
use sallyport_core::tls::{Trust, client_config, private_key_from_pem};
pub use sallyport_core::tunnel::TunnelStream;
use sallyport_core::tunnel::{self, Side};
use sallyport_core::x509::pem_to_ders;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_rustls::TlsConnector;

use crate::{AgentError, AgentIdentity, ssh};

pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// Labels as they are now: static ones plus the latest output of label commands.
pub type Labels = Arc<Mutex<BTreeMap<String, String>>>;

fn err(e: impl std::fmt::Display) -> AgentError {
    AgentError::Join(e.to_string())
}

/// What serves the streams the proxy opens in a tunnel, each on a task of its own. `local` is
/// the agent's end of the tunnel's TCP connection.
pub trait StreamServer: Send + Sync + 'static {
    /// What the tunnel serves, for the metrics (`sallyport_agent_tunnel_up`).
    const KIND: TunnelKind;

    fn serve(
        self: Arc<Self>,
        stream: TunnelStream,
        local: Option<SocketAddr>,
    ) -> impl Future<Output = ()> + Send + 'static;
}

impl StreamServer for ssh::NodeServer {
    const KIND: TunnelKind = TunnelKind::Node;

    fn serve(
        self: Arc<Self>,
        stream: TunnelStream,
        local: Option<SocketAddr>,
    ) -> impl Future<Output = ()> + Send + 'static {
        ssh::NodeServer::serve(self, stream, local)
    }
}

/// One proxy of the cluster as its heartbeat answers name it: its id (its certificate's CN)
/// and where it takes tunnels.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
struct Target {
    id: String,
    tunnel: String,
}

#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default)]
    proxies: Vec<Target>,
}

/// What the tunnels tell the supervisor: which proxy a tunnel reached, and the proxy set.
enum Heard {
    Connected { addr: String, proxy_id: String },
    Proxies(Vec<Target>),
}

/// Runs forever: a tunnel to the proxy the agent joined through (its `tunnel_addr`, which may
/// be a load balancer), and one to every other proxy the heartbeat answers name (Teleport's
/// default: a session can land on any proxy). Each reconnects with jittered backoff; a proxy
/// that leaves the set has its tunnel closed.
pub async fn run<S: StreamServer>(id: Arc<AgentIdentity>, labels: Labels, server: Arc<S>) {
    record_expiry::<S>(&id);
    metrics().agent_runs(S::KIND);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let first = id.tunnel_addr.clone();
    let mut tasks: std::collections::HashMap<String, tokio::task::JoinHandle<()>> =
        Default::default();
    tasks.insert(
        first.clone(),
        tokio::spawn(dial(
            id.clone(),
            first.clone(),
            labels.clone(),
            server.clone(),
            tx.clone(),
        )),
    );
    // Which proxy each address reached last: a proxy reached through the first address needs
    // no tunnel of its own.
    let mut reached: std::collections::HashMap<String, String> = Default::default();
    while let Some(heard) = rx.recv().await {
        match heard {
            Heard::Connected { addr, proxy_id } => {
                reached.insert(addr, proxy_id);
            }
            Heard::Proxies(set) => {
                let via_first = reached.get(&first).cloned();
                for t in &set {
                    if Some(&t.id) == via_first.as_ref() || tasks.contains_key(&t.tunnel) {
                        continue;
                    }
                    tracing::info!(proxy = %t.id, addr = %t.tunnel, "another proxy: keeping a tunnel to it too");
                    let task = dial(
                        id.clone(),
                        t.tunnel.clone(),
                        labels.clone(),
                        server.clone(),
                        tx.clone(),
                    );
                    tasks.insert(t.tunnel.clone(), tokio::spawn(task));
                }
                // Proxies no longer in the set (removed), and a second tunnel to the proxy
                // the first address reaches.
                tasks.retain(|addr, task| {
                    let keep = *addr == first
                        || set
                            .iter()
                            .any(|t| t.tunnel == *addr && Some(&t.id) != via_first.as_ref());
                    if !keep {
                        tracing::info!(addr = %addr, "that proxy left the set: closing its tunnel");
                        task.abort();
                    }
                    keep
                });
            }
        }
    }
}

/// One tunnel address, kept connected for as long as the task lives.
async fn dial<S: StreamServer>(
    id: Arc<AgentIdentity>,
    addr: String,
    labels: Labels,
    server: Arc<S>,
    heard: tokio::sync::mpsc::UnboundedSender<Heard>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let started = std::time::Instant::now();
        match connect_once(&id, &addr, &labels, &server, &heard).await {
            Ok(()) => tracing::warn!("tunnel to {addr} closed; reconnecting"),
            Err(e) => {
                tracing::warn!(error = %e, "tunnel to {addr} failed; reconnecting")
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(200);
        }
        let jitter = rand::random::<f64>() * 0.5 + 0.75;
        tokio::time::sleep(backoff.mul_f64(jitter)).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// The identity's certificates, in `sallyport_certificate_expiry_seconds`.
fn record_expiry<S: StreamServer>(id: &AgentIdentity) {
    let tls = match S::KIND {
        TunnelKind::Node => CertificateKind::AgentTls,
        TunnelKind::Kube => CertificateKind::KubeAgentTls,
    };
    if let Some(not_after) = pem_to_ders(&id.tls_cert_pem)
        .ok()
        .and_then(|c| c.into_iter().next())
        .and_then(|leaf| sallyport_core::x509::spki_and_expiry(&leaf).ok())
        .map(|(_, not_after)| not_after)
    {
        metrics().certificate_expires(tls, not_after);
    }
    if let Ok(cert) = russh::keys::ssh_key::Certificate::from_openssh(id.ssh_host_cert.trim()) {
        let not_after = i64::try_from(cert.valid_before()).unwrap_or(i64::MAX);
        metrics().certificate_expires(CertificateKind::AgentSshHost, not_after);
    }
}

/// One of `sallyport_agent_tunnel_up` while this lives.
struct TunnelUp(TunnelKind);

impl TunnelUp {
    fn new(kind: TunnelKind) -> Self {
        metrics().agent_tunnel(kind, true);
        TunnelUp(kind)
    }
}

impl Drop for TunnelUp {
    fn drop(&mut self) {
        metrics().agent_tunnel(self.0, false);
    }
}

async fn connect_once<S: StreamServer>(
    id: &AgentIdentity,
    addr: &str,
    labels: &Labels,
    server: &Arc<S>,
    heard: &tokio::sync::mpsc::UnboundedSender<Heard>,
) -> Result<(), AgentError> {
    let roots = pem_to_ders(&id.host_ca_pem).map_err(err)?;
    let chain = pem_to_ders(&id.tls_cert_pem).map_err(err)?;
    let key = private_key_from_pem(&id.tls_key_pem).map_err(err)?;
    let mut cfg = client_config(Trust::Roots(roots), Some((chain, key))).map_err(err)?;
    cfg.alpn_protocols = vec![b"sallyport-tunnel".to_vec()];
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string()).map_err(err)?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .map_err(|_| err("connect timed out"))??;
    tcp.set_nodelay(true)?;
    // The node's end of the connection sessions arrive on: the server half of SSH_CONNECTION.
    let local = tcp.local_addr().ok();
    let tls = tokio::time::timeout(
        Duration::from_secs(10),
        TlsConnector::from(Arc::new(cfg)).connect(name, tcp),
    )
    .await
    .map_err(|_| err("TLS handshake timed out"))??;
    // The proxy this address reached: its certificate's CN (verified against the host CA).
    let proxy_id = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|leaf| sallyport_core::x509::parse_subject(leaf).ok())
        .map(|s| s.common_name)
        .unwrap_or_default();
    let _ = heard.send(Heard::Connected {
        addr: addr.to_string(),
        proxy_id: proxy_id.clone(),
    });
    let (opener, mut inbound) = tunnel::run(tls, Side::Agent);
    let hb = opener.open().await.map_err(err)?;
    let (hb_read, mut hb_write) = tokio::io::split(hb);
    let mut hb_lines = BufReader::new(hb_read).lines();
    let mut tick = tokio::time::interval(HEARTBEAT);
    tracing::info!(node = %id.nodename, proxy = %addr, proxy_id = %proxy_id, "tunnel up");
    let _up = TunnelUp::new(S::KIND);
    loop {
        tokio::select! {
            stream = inbound.recv() => {
                let Some(stream) = stream else { return Ok(()) };
                tokio::spawn(server.clone().serve(stream, local));
            }
            _ = tick.tick() => {
                let current = labels.lock().map(|l| l.clone()).unwrap_or_default();
                let line = format!("{}\n", serde_json::json!({ "labels": current }));
                hb_write.write_all(line.as_bytes()).await?;
                match tokio::time::timeout(HEARTBEAT, hb_lines.next_line()).await {
                    Ok(Ok(Some(answer))) => {
                        // The proxy closes the tunnel after saying why (labels refused).
                        if let Some(why) = answer.strip_prefix("error: ") {
                            return Err(err(format!("the proxy refused this node's heartbeat: {why}")));
                        }
                        // `ok`, then the proxy set once the proxy knows it.
                        if let Some(set) = answer.strip_prefix("ok ")
                            && let Ok(a) = serde_json::from_str::<Answer>(set)
                        {
                            let _ = heard.send(Heard::Proxies(a.proxies));
                        }
                    }
                    _ => return Err(err("heartbeat unanswered")),
                }
            }
        }
    }
}

/// Keeps a label command's output current: runs it every `period`, trims the output, and sets
/// it as label `name` (an empty or failed run sets no label).
pub fn spawn_label_command(labels: Labels, name: String, command: Vec<String>, period: Duration) {
    tokio::spawn(async move {
        let Some((program, args)) = command.split_first() else {
            return;
        };
        loop {
            let out = tokio::process::Command::new(program)
                .args(args)
                .kill_on_drop(true)
                .output();
            let value = match tokio::time::timeout(Duration::from_secs(30), out).await {
                Ok(Ok(o)) if o.status.success() => {
                    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
                }
                _ => None,
            };
            // A value auth would refuse would take the whole heartbeat with it: leave it out.
            let value = value.filter(|v| {
                let one = BTreeMap::from([(name.clone(), v.clone())]);
                match sallyport_core::names::validate_labels(&one) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(label = %name, error = %e, "label command output not used");
                        false
                    }
                }
            });
            if let Ok(mut l) = labels.lock() {
                match value.filter(|v| !v.is_empty()) {
                    Some(v) => l.insert(name.clone(), v),
                    None => l.remove(&name),
                };
            }
            tokio::time::sleep(period.max(Duration::from_secs(1))).await;
        }
    });
}
