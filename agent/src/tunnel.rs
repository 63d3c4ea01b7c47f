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

/// Runs forever: connect, serve, and reconnect.
pub async fn run<S: StreamServer>(id: Arc<AgentIdentity>, labels: Labels, server: Arc<S>) {
    record_expiry::<S>(&id);
    metrics().agent_tunnel(S::KIND, false);
    let mut backoff = Duration::from_millis(200);
    loop {
        let started = std::time::Instant::now();
        match connect_once(&id, &labels, &server).await {
            Ok(()) => tracing::warn!("tunnel to {} closed; reconnecting", id.tunnel_addr),
            Err(e) => {
                tracing::warn!(error = %e, "tunnel to {} failed; reconnecting", id.tunnel_addr)
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

/// `sallyport_agent_tunnel_up` is 1 while this lives.
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
    labels: &Labels,
    server: &Arc<S>,
) -> Result<(), AgentError> {
    let roots = pem_to_ders(&id.host_ca_pem).map_err(err)?;
    let chain = pem_to_ders(&id.tls_cert_pem).map_err(err)?;
    let key = private_key_from_pem(&id.tls_key_pem).map_err(err)?;
    let mut cfg = client_config(Trust::Roots(roots), Some((chain, key))).map_err(err)?;
    cfg.alpn_protocols = vec![b"sallyport-tunnel".to_vec()];
    let host = id
        .tunnel_addr
        .rsplit_once(':')
        .map_or(id.tunnel_addr.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string()).map_err(err)?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(&id.tunnel_addr),
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
    let (opener, mut inbound) = tunnel::run(tls, Side::Agent);
    let hb = opener.open().await.map_err(err)?;
    let (hb_read, mut hb_write) = tokio::io::split(hb);
    let mut hb_lines = BufReader::new(hb_read).lines();
    let mut tick = tokio::time::interval(HEARTBEAT);
    tracing::info!(node = %id.nodename, proxy = %id.tunnel_addr, "tunnel up");
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
