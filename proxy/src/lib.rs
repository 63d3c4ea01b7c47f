//! The proxy: the only door. It serves the web API on 3080 (login, sign-up, agent joining —
//! forwarded to auth over mutual TLS with its own host certificate), the users' SSH door on 3023
//! (`ssh`: accept → authenticate, then each session through the engine), and the agents' tunnel
//! door on 3024 (`tunnels`). The session engine (`session`: authorize → dial → relay → record →
//! audit, watched by `watchdog`) is every door's: the browser terminal and `kubectl exec` are
//! front ends to it, as the SSH door is. What every door shares lives in `state`.
//!
//! Architecture invariant: the proxy never reads the backend; it asks auth.

pub mod auth_client;
pub mod failed_auth;
pub mod kube;
pub mod presence;
pub mod registry;
pub mod session;
pub mod ssh;
pub mod state;
pub mod tunnels;
pub mod web;

pub use auth_client::AuthClient;

/// A service's TLS identity: its certificate chain (leaf first, then its CA) and private key,
/// plus the CAs it trusts for the cluster's other services.
#[derive(Clone)]
pub struct ServiceIdentity {
    pub chain_pem: String,
    pub key_pem: String,
    pub host_ca_pem: String,
    pub user_ca_pem: String,
}

impl std::fmt::Debug for ServiceIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceIdentity").finish_non_exhaustive()
    }
}
