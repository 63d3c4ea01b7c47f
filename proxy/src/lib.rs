//! The proxy: the only door. This slice serves the web API on 3080 (login and sign-up, which it
//! forwards to auth over mutual TLS with its own host certificate). The SSH, tunnel and
//! Kubernetes doors arrive with their issues and will follow the same path:
//! accept → authenticate → authorize → route → relay → record.
//!
//! Architecture invariant: the proxy never reads the backend; it asks auth.

pub mod auth_client;
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
