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
    /// The agent's certificates were renewed: new connections get the new host certificate.
    fn renewed(&self, _id: &AgentIdentity) -> Result<(), AgentError> {
        Ok(())
    }

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

    fn renewed(&self, id: &AgentIdentity) -> Result<(), AgentError> {
        ssh::NodeServer::renewed(self, id)
    }

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
    #[serde(default)]
    renewed: Option<sallyport_core::api::Renewed>,
}

/// Keeps a renewed identity where the agent reads it at its next start (its identity file).
pub type Keep = Arc<dyn Fn(&AgentIdentity) -> Result<(), AgentError> + Send + Sync>;

/// The identity every tunnel of the agent presents: replaced when its certificates are renewed.
#[derive(Clone)]
struct Current {
    id: Arc<std::sync::RwLock<Arc<AgentIdentity>>>,
    keep: Keep,
    /// When a renewal was asked for and not yet answered (0: none): one at a time, through one
    /// tunnel, asked again after a minute without an answer; an answer nobody asked for is
    /// refused.
    asked: Arc<std::sync::atomic::AtomicI64>,
}

impl Current {
    fn get(&self) -> Arc<AgentIdentity> {
        match self.id.read() {
            Ok(id) => id.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// What to ask in a heartbeat: a renewal over the agent's keys once its TLS certificate is
    /// past two thirds of its life.
    fn renewal(&self) -> Option<sallyport_core::api::RenewRequest> {
        let id = self.get();
        let leaf = pem_to_ders(&id.tls_cert_pem).ok()?.into_iter().next()?;
        let (from, to) = sallyport_core::x509::validity(&leaf).ok()?;
        if !sallyport_core::x509::renewal_due(from, to, sallyport_core::unix_now()) {
            return None;
        }
        use base64::Engine;
        use rcgen::PublicKeyData;
        let tls = rcgen::KeyPair::from_pem(&id.tls_key_pem).ok()?;
        let host =
            russh::keys::ssh_key::PrivateKey::from_openssh(id.ssh_host_key.as_bytes()).ok()?;
        let now = sallyport_core::unix_now();
        let asked = self.asked.load(std::sync::atomic::Ordering::Acquire);
        if asked != 0 && now - asked < 60 {
            return None;
        }
        if self
            .asked
            .compare_exchange(
                asked,
                now,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            )
            .is_err()
        {
            return None;
        }
        Some(sallyport_core::api::RenewRequest {
            tls_spki: base64::engine::general_purpose::STANDARD
                .encode(tls.subject_public_key_info()),
            ssh_host_key: host.public_key().to_openssh().ok()?,
        })
    }

    /// Takes renewed certificates, only when it asked for them and only when they are what
    /// auth issues: the TLS certificate chains to the cluster's host CA with the same name and
    /// organization over the agent's own key, the SSH host certificate is over its own host key,
    /// signed by the CA that signed the current one, for the same names. Then kept on disk and
    /// served. A proxy cannot hand an agent certificates that would cut it off.
    fn renewed<S: StreamServer>(
        &self,
        r: sallyport_core::api::Renewed,
        server: &S,
    ) -> Result<(), AgentError> {
        if self.asked.swap(0, std::sync::atomic::Ordering::AcqRel) == 0 {
            return Err(err("renewed certificates this agent did not ask for"));
        }
        let old = self.get();
        let first = |pem: &str| -> Result<rustls::pki_types::CertificateDer<'static>, AgentError> {
            pem_to_ders(pem)
                .map_err(err)?
                .into_iter()
                .next()
                .ok_or_else(|| err("no certificate"))
        };
        let leaf = first(&r.tls_cert_pem)?;
        let old_leaf = first(&old.tls_cert_pem)?;
        let (spki, not_after) = sallyport_core::x509::spki_and_expiry(&leaf).map_err(err)?;
        let (old_spki, _) = sallyport_core::x509::spki_and_expiry(&old_leaf).map_err(err)?;
        if spki != old_spki {
            return Err(err("the renewed certificate is not for this agent's key"));
        }
        let (new_s, old_s) = (
            sallyport_core::x509::parse_subject(&leaf).map_err(err)?,
            sallyport_core::x509::parse_subject(&old_leaf).map_err(err)?,
        );
        if new_s.common_name != old_s.common_name || new_s.organizations != old_s.organizations {
            return Err(err("the renewed certificate names another node"));
        }
        let mut roots = rustls::RootCertStore::empty();
        for ca in pem_to_ders(&old.host_ca_pem).map_err(err)? {
            roots.add(ca).map_err(err)?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        )
        .build()
        .map_err(err)?;
        verifier
            .verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now())
            .map_err(|e| err(format!("the renewed certificate is not the cluster's: {e}")))?;
        use russh::keys::ssh_key::{Certificate, HashAlg, PrivateKey};
        let cert = Certificate::from_openssh(r.ssh_host_cert.trim()).map_err(err)?;
        let old_cert = Certificate::from_openssh(old.ssh_host_cert.trim()).map_err(err)?;
        let host = PrivateKey::from_openssh(old.ssh_host_key.as_bytes()).map_err(err)?;
        let ca = old_cert.signature_key().fingerprint(HashAlg::Sha256);
        if cert.public_key() != host.public_key().key_data()
            || cert.valid_principals() != old_cert.valid_principals()
        {
            return Err(err(
                "the renewed host certificate is not for this node's key and names",
            ));
        }
        cert.validate_at(sallyport_core::unix_now() as u64, [&ca])
            .map_err(|e| {
                err(format!(
                    "the renewed host certificate is not the cluster's: {e}"
                ))
            })?;
        let mut new = (*old).clone();
        new.tls_cert_pem = r.tls_cert_pem;
        new.ssh_host_cert = r.ssh_host_cert;
        (self.keep)(&new)?;
        server.renewed(&new)?;
        if let Ok(mut id) = self.id.write() {
            *id = Arc::new(new);
        }
        record_expiry::<S>(&self.get());
        tracing::info!(
            until = %sallyport_core::rfc3339(not_after),
            "this agent's certificates were renewed"
        );
        Ok(())
    }
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
pub async fn run<S: StreamServer>(
    id: Arc<AgentIdentity>,
    labels: Labels,
    server: Arc<S>,
    keep: Keep,
) {
    record_expiry::<S>(&id);
    let current = Current {
        id: Arc::new(std::sync::RwLock::new(id.clone())),
        keep,
        asked: Default::default(),
    };
    metrics().agent_runs(S::KIND);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let first = id.tunnel_addr.clone();
    let mut tasks: std::collections::HashMap<String, tokio::task::JoinHandle<()>> =
        Default::default();
    tasks.insert(
        first.clone(),
        tokio::spawn(dial(
            current.clone(),
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
                        current.clone(),
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
    id: Current,
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
    current: &Current,
    addr: &str,
    labels: &Labels,
    server: &Arc<S>,
    heard: &tokio::sync::mpsc::UnboundedSender<Heard>,
) -> Result<(), AgentError> {
    let id = current.get();
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
    let mut hb_answers = BufReader::new(hb_read);
    let mut tick = tokio::time::interval(HEARTBEAT);
    tracing::info!(node = %id.nodename, proxy = %addr, proxy_id = %proxy_id, "tunnel up");
    let _up = TunnelUp::new(S::KIND);
    // The heartbeats run beside the accepting of sessions, never in its way: waiting for an
    // answer (a presence refresh waits for the proxy's batch to auth, up to seconds) must not
    // stop this node from taking the sessions the proxy opens meanwhile.
    let heartbeats = async {
        loop {
            tick.tick().await;
            {
                let now = labels.lock().map(|l| l.clone()).unwrap_or_default();
                let line = match current.renewal() {
                    Some(renew) => {
                        format!("{}\n", serde_json::json!({ "labels": now, "renew": renew }))
                    }
                    None => format!("{}\n", serde_json::json!({ "labels": now })),
                };
                hb_write.write_all(line.as_bytes()).await?;
                match tokio::time::timeout(HEARTBEAT, answer_line(&mut hb_answers)).await {
                    Ok(Ok(Some(answer))) => {
                        // The proxy closes the tunnel after saying why (labels refused).
                        if let Some(why) = answer.strip_prefix("error: ") {
                            return Err(err(format!(
                                "the proxy refused this node's heartbeat: {why}"
                            )));
                        }
                        // `ok`, then the proxy set once the proxy knows it.
                        if let Some(set) = answer.strip_prefix("ok ")
                            && let Ok(a) = serde_json::from_str::<Answer>(set)
                        {
                            if let Some(r) = a.renewed
                                && let Err(e) = current.renewed(r, server.as_ref())
                            {
                                tracing::warn!(error = %e, "renewed certificates not taken");
                            }
                            let _ = heard.send(Heard::Proxies(a.proxies));
                        }
                    }
                    _ => return Err(err("heartbeat unanswered")),
                }
            }
        }
    };
    tokio::pin!(heartbeats);
    loop {
        tokio::select! {
            stream = inbound.recv() => {
                let Some(stream) = stream else { return Ok(()) };
                tokio::spawn(server.clone().serve(stream, local));
            }
            ended = &mut heartbeats => return ended,
        }
    }
}

/// The longest heartbeat answer read: `ok`, the proxy set and a renewal's certificates fit in a
/// small part of it; a proxy sending more (or no newline) ends the tunnel rather than the
/// agent's memory.
const MAX_ANSWER: u64 = 256 * 1024;

/// One answer line from the proxy, bounded by [`MAX_ANSWER`]; `None` at the stream's end.
async fn answer_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(MAX_ANSWER + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() as u64 > MAX_ANSWER {
        return Err(std::io::Error::other("heartbeat answer over 256 KiB"));
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;
    use sallyport_core::x509::{Subject, TlsCa};

    struct Nothing;
    impl StreamServer for Nothing {
        const KIND: TunnelKind = TunnelKind::Node;
        async fn serve(self: Arc<Self>, _: TunnelStream, _: Option<SocketAddr>) {}
    }

    fn subject(cn: &str) -> Subject {
        let now = time::OffsetDateTime::now_utc();
        Subject {
            common_name: cn.into(),
            organizations: vec!["node".into()],
            dns_names: vec![],
            server: true,
            not_before: now - time::Duration::minutes(1),
            not_after: now + time::Duration::hours(1),
        }
    }

    /// A proxy's heartbeat answer is read a line at a time, and never past 256 KiB.
    #[tokio::test]
    async fn heartbeat_answers_are_bounded() {
        let mut ok = tokio::io::BufReader::new(&b"ok {\"proxies\":[]}\r\nok\n"[..]);
        assert_eq!(
            answer_line(&mut ok).await.unwrap().as_deref(),
            Some("ok {\"proxies\":[]}")
        );
        assert_eq!(answer_line(&mut ok).await.unwrap().as_deref(), Some("ok"));
        assert_eq!(answer_line(&mut ok).await.unwrap(), None);
        let flood = vec![b'x'; 300 * 1024];
        let mut r = tokio::io::BufReader::new(&flood[..]);
        assert!(answer_line(&mut r).await.is_err());
    }

    /// An agent takes a renewal only when it asked, and only what the cluster's CAs issued for
    /// its own keys and names: a proxy cannot hand it certificates that would cut it off.
    #[test]
    fn a_renewal_is_taken_only_when_asked_and_only_from_the_clusters_cas() {
        sallyport_core::install_crypto_provider();
        let ca = TlsCa::generate("host", "test").unwrap();
        let ssh_ca = sallyport_core::sshcert::generate_ed25519().unwrap();
        let tls_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let spki = tls_key.subject_public_key_info();
        let host = sallyport_core::sshcert::generate_ed25519().unwrap();
        let names = vec!["web1".to_string(), "node-1".to_string()];
        let ssh_cert = |signer: &russh::keys::ssh_key::PrivateKey, names: &[String]| {
            sallyport_core::sshcert::issue_host(
                signer,
                host.public_key(),
                "node-1",
                names,
                std::time::Duration::from_secs(3600),
            )
            .unwrap()
            .to_openssh()
            .unwrap()
        };
        let id = AgentIdentity {
            node_id: "node-1".into(),
            nodename: "web1".into(),
            cluster_name: "test".into(),
            proxy: String::new(),
            tunnel_addr: String::new(),
            tls_key_pem: tls_key.serialize_pem(),
            tls_cert_pem: ca.sign(&spki, &subject("node-1")).unwrap(),
            host_ca_pem: ca.cert_pem.clone(),
            ssh_host_key: host
                .to_openssh(russh::keys::ssh_key::LineEnding::LF)
                .unwrap()
                .to_string(),
            ssh_host_cert: ssh_cert(&ssh_ca, &names),
            user_ca_keys: vec![],
        };
        let kept = Arc::new(std::sync::Mutex::new(0));
        let k = kept.clone();
        let current = Current {
            id: Arc::new(std::sync::RwLock::new(Arc::new(id))),
            keep: Arc::new(move |_| {
                *k.lock().unwrap() += 1;
                Ok(())
            }),
            asked: Default::default(),
        };
        let good = sallyport_core::api::Renewed {
            tls_cert_pem: ca.sign(&spki, &subject("node-1")).unwrap(),
            ssh_host_cert: ssh_cert(&ssh_ca, &names),
        };
        // Not asked: refused.
        let e = current.renewed(good.clone(), &Nothing).unwrap_err();
        assert!(e.to_string().contains("did not ask"), "{e}");
        let ask = |c: &Current| {
            c.asked.store(
                sallyport_core::unix_now(),
                std::sync::atomic::Ordering::Release,
            )
        };
        // Another CA over the same key, another node's name, another SSH CA, other names.
        let forger = TlsCa::generate("host", "test").unwrap();
        let forged = [
            (
                forger.sign(&spki, &subject("node-1")).unwrap(),
                ssh_cert(&ssh_ca, &names),
                "not the cluster's",
            ),
            (
                ca.sign(&spki, &subject("node-2")).unwrap(),
                ssh_cert(&ssh_ca, &names),
                "names another node",
            ),
            (
                ca.sign(&spki, &subject("node-1")).unwrap(),
                ssh_cert(
                    &sallyport_core::sshcert::generate_ed25519().unwrap(),
                    &names,
                ),
                "not the cluster's",
            ),
            (
                ca.sign(&spki, &subject("node-1")).unwrap(),
                ssh_cert(&ssh_ca, &["proxy".to_string()]),
                "names",
            ),
        ];
        for (tls, ssh, why) in forged {
            ask(&current);
            let r = sallyport_core::api::Renewed {
                tls_cert_pem: tls,
                ssh_host_cert: ssh,
            };
            let e = current.renewed(r, &Nothing).unwrap_err();
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
        assert_eq!(*kept.lock().unwrap(), 0, "nothing forged was kept");
        ask(&current);
        current.renewed(good, &Nothing).unwrap();
        assert_eq!(*kept.lock().unwrap(), 1);
    }
}
