//! The users' SSH door (port 3023), in the order a connection passes through it:
//!
//! 1. `accept` — the outer connection: admitted under the door's caps on unauthenticated
//!    connections and its per-address rate, and ended if it has not authenticated within
//!    `ssh_login_grace` (`sallyport_core::door`); a user certificate from the user CA
//!    (signature, type, validity, critical options) is the only credential. It serves only
//!    `direct-tcpip` to a registered node: the proxy itself offers no shell, exec or sftp.
//! 2. `inner` — each `direct-tcpip` channel carries the client's inner SSH connection, which the
//!    proxy terminates with a host certificate for the node's names; there it authenticates the
//!    user again for the login asked for and turns each session channel into a session of the
//!    engine (`crate::session`: authorize, dial, relay, record, audit, watchdog), its requests
//!    and bytes into the engine's commands; `channel` renders the engine's events as SSH
//!    messages on the person's channel (`SshDoor`, the SSH door's `session::Door`).
//! 3. `forward` — `-L`, `-D` and `-R` on an inner connection, through one forwarding
//!    connection to the node that the engine authorizes and dials.

pub mod accept;
mod channel;
pub mod forward;
pub mod inner;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use russh::keys::ssh_key::{Certificate, PrivateKey, PublicKey};
use sallyport_core::api::NodeInfo;

use crate::AuthClient;
use crate::state::ProxyState;
use crate::tunnels::Tunnels;

/// What the SSH door keeps beside the proxy's shared state (which it derefs to).
pub struct SshState {
    pub proxy: Arc<ProxyState>,
    pub user_cas: RwLock<Vec<PublicKey>>,
    /// The proxy's host certificate on 3023, replaced when it is renewed.
    proxy_cert: RwLock<Certificate>,
    node_certs: Mutex<HashMap<String, (Instant, Certificate, NodeInfo)>>,
    /// `max_jumps_per_connection`: inner connections one outer connection may carry at once.
    pub max_jumps_per_connection: usize,
}

impl SshState {
    /// The proxy's host certificate on 3023 now.
    pub fn proxy_cert(&self) -> Certificate {
        match self.proxy_cert.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// When the host certificate on 3023 ends: it changes when the certificate is renewed.
    pub fn proxy_cert_until(&self) -> u64 {
        match self.proxy_cert.read() {
            Ok(c) => c.valid_before(),
            Err(p) => p.into_inner().valid_before(),
        }
    }

    /// The renewed host certificate, for connections from now on.
    pub fn set_proxy_cert(&self, cert: Certificate) {
        match self.proxy_cert.write() {
            Ok(mut c) => *c = cert,
            Err(p) => *p.into_inner() = cert,
        }
    }
}

impl std::ops::Deref for SshState {
    type Target = ProxyState;
    fn deref(&self) -> &ProxyState {
        &self.proxy
    }
}

/// The SSH door's two servers.
#[derive(Debug, Clone, Copy)]
pub enum Door {
    /// The outer connection on 3023, with the proxy's host certificate.
    Outer,
    /// An inner connection, as the node, with a host certificate for the node's names.
    Inner,
}

/// The russh server settings for `door` (see `core::sshcert::server_settings`).
pub fn server_settings(state: &SshState, cert: Certificate, door: Door) -> russh::server::Config {
    let role = match door {
        Door::Outer => sallyport_core::sshcert::ServerRole::ProxyDoor,
        Door::Inner => sallyport_core::sshcert::ServerRole::ProxyInner,
    };
    sallyport_core::sshcert::server_settings(role, (*state.key).clone(), cert)
}

/// `max_jumps_per_connection` when the configuration does not say: OpenSSH's `MaxSessions`.
/// Each inner connection costs the proxy a key exchange, so one outer connection must not
/// carry any number of them.
pub const DEFAULT_MAX_JUMPS_PER_CONNECTION: usize = 10;

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
            proxy: Arc::new(ProxyState::new(
                auth, cluster, key, host_cas, tunnels, recordings,
            )),
            user_cas: RwLock::new(user_cas),
            proxy_cert: RwLock::new(proxy_cert),
            node_certs: Mutex::new(HashMap::new()),
            max_jumps_per_connection: DEFAULT_MAX_JUMPS_PER_CONNECTION,
        }
    }

    /// `max_recording_size` from the configuration (set before the state is shared).
    pub fn with_max_recording_size(mut self, bytes: u64) -> Self {
        if let Some(p) = Arc::get_mut(&mut self.proxy) {
            p.max_recording_size = bytes;
        }
        self
    }

    /// Uploads finished recordings to the recording store (see
    /// `session::record::Uploads::start`; set before the state is shared).
    pub fn with_uploads(mut self, uploads: Option<Arc<crate::session::record::Uploads>>) -> Self {
        if let Some(p) = Arc::get_mut(&mut self.proxy) {
            p.uploads = uploads;
        }
        self
    }

    /// `max_jumps_per_connection` from the configuration.
    pub fn with_max_jumps_per_connection(mut self, n: usize) -> Self {
        self.max_jumps_per_connection = n;
        self
    }

    /// Polls auth's locks (see [`ProxyState::watch_locks`]).
    pub async fn watch_locks(self: Arc<Self>, every: Duration) {
        self.proxy.clone().watch_locks(every).await
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
        let path = sallyport_core::routes::auth::node_proxy_host_cert(&name);
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
