//! The users' SSH door (port 3023), in the order a connection passes through it:
//!
//! 1. `accept` — the outer connection: admitted under the door's caps on unauthenticated
//!    connections and its per-address rate, and ended if it has not authenticated within
//!    `ssh_login_grace` (`sallyport_core::door`); a user certificate from the user CA
//!    (signature, type, validity, critical options) is the only credential. It serves only
//!    `direct-tcpip` to a registered node: the proxy itself offers no shell, exec or sftp.
//! 2. `relay` — each `direct-tcpip` channel carries the client's inner SSH connection, which the
//!    proxy terminates with a host certificate for the node's names; there it authenticates the
//!    user again for the login asked for, asks auth to authorize (roles, labels, deny rules) and
//!    to mint a per-session certificate, routes to the node (agent tunnel or agentless address),
//!    and relays every channel request one for one, recording as it goes (`record`).

pub mod accept;
pub mod events;
pub mod relay;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use russh::keys::ssh_key::{Certificate, PrivateKey, PublicKey};
use sallyport_core::api::NodeInfo;

use crate::AuthClient;
use crate::tunnels::Tunnels;

/// What every SSH connection through this proxy shares.
pub struct SshState {
    pub auth: AuthClient,
    pub cluster: String,
    pub user_cas: RwLock<Vec<PublicKey>>,
    pub host_cas: Vec<PublicKey>,
    /// The proxy's SSH key: its host key on 3023, and the key auth certifies per session.
    pub key: Arc<PrivateKey>,
    pub proxy_cert: Certificate,
    pub tunnels: Tunnels,
    pub recordings: PathBuf,
    node_certs: Mutex<HashMap<String, (Instant, Certificate, NodeInfo)>>,
    /// Users under a lock, with its message (polled from auth).
    locked: RwLock<HashMap<String, String>>,
    /// Live outer connections by user, ended when the user is locked.
    live: Mutex<HashMap<u64, (String, russh::server::Handle)>>,
    /// `max_recording_size`: the largest a recording may grow.
    pub max_recording_size: u64,
    /// `max_jumps_per_connection`: inner connections one outer connection may carry at once.
    pub max_jumps_per_connection: usize,
    /// Open inner (node) connections: their user by the order they authenticated in, for the
    /// roles' `max_connections`.
    inner: Mutex<std::collections::BTreeMap<u64, String>>,
}

/// An inner connection counted in [`SshState`] while it is open.
pub struct InnerConnection {
    state: Arc<SshState>,
    seq: u64,
}

impl Drop for InnerConnection {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.state.inner.lock() {
            inner.remove(&self.seq);
        }
    }
}

/// `max_jumps_per_connection` when the configuration does not say: OpenSSH's `MaxSessions`.
/// Each inner connection costs the proxy a key exchange, so one outer connection must not
/// carry any number of them.
pub const DEFAULT_MAX_JUMPS_PER_CONNECTION: usize = 10;

static NEXT_INNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[derive(serde::Deserialize)]
struct NodeCert {
    cert: String,
    node: NodeInfo,
}

impl SshState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        auth: AuthClient,
        cluster: String,
        user_cas: Vec<PublicKey>,
        host_cas: Vec<PublicKey>,
        key: PrivateKey,
        proxy_cert: Certificate,
        tunnels: Tunnels,
        recordings: PathBuf,
    ) -> Self {
        SshState {
            auth,
            cluster,
            user_cas: RwLock::new(user_cas),
            host_cas,
            key: Arc::new(key),
            proxy_cert,
            tunnels,
            recordings,
            node_certs: Mutex::new(HashMap::new()),
            locked: RwLock::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            max_recording_size: crate::record::DEFAULT_MAX_RECORDING_SIZE,
            max_jumps_per_connection: DEFAULT_MAX_JUMPS_PER_CONNECTION,
            inner: Mutex::new(Default::default()),
        }
    }

    /// `max_recording_size` from the configuration.
    pub fn with_max_recording_size(mut self, bytes: u64) -> Self {
        self.max_recording_size = bytes;
        self
    }

    /// `max_jumps_per_connection` from the configuration.
    pub fn with_max_jumps_per_connection(mut self, n: usize) -> Self {
        self.max_jumps_per_connection = n;
        self
    }

    /// Counts an inner connection of `user` as open until the returned value is dropped.
    pub fn open_inner(self: &Arc<Self>, user: &str) -> InnerConnection {
        let seq = NEXT_INNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut inner) = self.inner.lock() {
            inner.insert(seq, user.to_string());
        }
        InnerConnection {
            state: self.clone(),
            seq,
        }
    }

    /// How many of its user's inner connections opened before `conn` are still open.
    pub fn older_connections(&self, conn: &InnerConnection, user: &str) -> u32 {
        self.inner
            .lock()
            .map(|inner| inner.range(..conn.seq).filter(|(_, u)| *u == user).count() as u32)
            .unwrap_or(0)
    }

    /// Why `user` is locked, if they are.
    pub fn lock_of(&self, user: &str) -> Option<String> {
        self.locked.read().ok().and_then(|l| l.get(user).cloned())
    }

    /// Remembers live connection `conn` of `user`, to end it if they are locked.
    pub fn track(&self, conn: u64, user: &str, handle: russh::server::Handle) {
        if let Ok(mut live) = self.live.lock() {
            live.insert(conn, (user.to_string(), handle));
        }
    }

    /// Connection `conn` ended.
    pub fn untrack(&self, conn: u64) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&conn);
        }
    }

    /// Polls auth's locks every `every`: refuses locked users at the door from then on, and ends
    /// their live connections.
    pub async fn watch_locks(self: Arc<Self>, every: Duration) {
        loop {
            match self
                .auth
                .json::<(), Vec<sallyport_core::api::LockInfo>>(
                    reqwest::Method::GET,
                    "/v1/locks",
                    None,
                )
                .await
            {
                Ok(locks) => {
                    let now: HashMap<String, String> =
                        locks.into_iter().map(|l| (l.user, l.message)).collect();
                    let doomed: Vec<(String, russh::server::Handle)> = match self.live.lock() {
                        Ok(mut live) => {
                            let ids: Vec<u64> = live
                                .iter()
                                .filter(|(_, (u, _))| now.contains_key(u))
                                .map(|(id, _)| *id)
                                .collect();
                            ids.iter().filter_map(|id| live.remove(id)).collect()
                        }
                        Err(_) => vec![],
                    };
                    for (user, handle) in doomed {
                        let why = now.get(&user).cloned().unwrap_or_default();
                        tracing::info!(%user, "ending the connection of a locked user");
                        let _ = handle
                            .disconnect(
                                russh::Disconnect::ByApplication,
                                format!("user {user} is locked: {why}"),
                                String::new(),
                            )
                            .await;
                    }
                    if let Ok(mut l) = self.locked.write() {
                        *l = now;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read locks from auth"),
            }
            tokio::time::sleep(every).await;
        }
    }

    pub fn user_cas(&self) -> Vec<PublicKey> {
        self.user_cas.read().map(|c| c.clone()).unwrap_or_default()
    }

    /// The node a client names (`web1`, `web1.<cluster>` or its id), with a host certificate
    /// for its names over the proxy's key; cached for a few minutes.
    pub async fn node_identity(&self, target: &str) -> Result<(Certificate, NodeInfo), String> {
        let name = target
            .strip_suffix(&format!(".{}", self.cluster))
            .unwrap_or(target)
            .to_string();
        // A target is a name a node could have registered under, nothing else: it goes into an
        // API path (`../oidc/callback#` once reached other routes of auth).
        if sallyport_core::names::validate("node", &name).is_err() {
            return Err(format!(
                "no node named {name:?} in cluster {}: node names are letters, digits and . _ - @ +",
                self.cluster
            ));
        }
        if let Ok(cache) = self.node_certs.lock()
            && let Some((at, cert, node)) = cache.get(&name)
            && at.elapsed() < Duration::from_secs(300)
        {
            return Ok((cert.clone(), node.clone()));
        }
        let public = self
            .key
            .public_key()
            .to_openssh()
            .map_err(|e| e.to_string())?;
        let path = format!(
            "/v1/nodes/{}/proxy-host-cert",
            sallyport_core::api::path_segment(&name)
        );
        let body = serde_json::json!({ "public_key": public });
        let nc: NodeCert = self
            .auth
            .json(reqwest::Method::POST, &path, Some(&body))
            .await
            .map_err(|e| match e {
                crate::auth_client::ClientError::Refused { status: 404, .. } => {
                    format!("node {name} is not registered in cluster {}", self.cluster)
                }
                e => e.to_string(),
            })?;
        let cert = Certificate::from_openssh(nc.cert.trim()).map_err(|e| e.to_string())?;
        if let Ok(mut cache) = self.node_certs.lock() {
            cache.insert(name, (Instant::now(), cert.clone(), nc.node.clone()));
        }
        Ok((cert, nc.node))
    }
}
