//! What an agent keeps in its data dir after joining (`agent-identity.json`, 0600): its node id
//! and name, its TLS key and host certificate for the tunnel, its SSH host key and certificate,
//! and the CAs it trusts. A restart reuses it; the join token is never needed again.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::AgentError;

pub const FILE: &str = "agent-identity.json";

#[derive(Clone, Serialize, Deserialize)]
pub struct AgentIdentity {
    pub node_id: String,
    pub nodename: String,
    pub cluster_name: String,
    pub proxy: String,
    /// Where the proxy takes tunnels (its port 3024), as learned from its web API.
    pub tunnel_addr: String,
    pub tls_key_pem: String,
    pub tls_cert_pem: String,
    pub host_ca_pem: String,
    pub ssh_host_key: String,
    pub ssh_host_cert: String,
    pub user_ca_keys: Vec<String>,
}

impl std::fmt::Debug for AgentIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentIdentity")
            .field("node_id", &self.node_id)
            .field("nodename", &self.nodename)
            .finish_non_exhaustive()
    }
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

impl AgentIdentity {
    pub fn load(dir: &Path) -> Result<Option<Self>, AgentError> {
        match std::fs::read(path(dir)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                AgentError::Identity(format!("{} is unreadable: {e}", path(dir).display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(AgentError::Identity(format!(
                "cannot read {}: {e}",
                path(dir).display()
            ))),
        }
    }

    pub fn save(&self, dir: &Path) -> Result<(), AgentError> {
        let text =
            serde_json::to_vec_pretty(self).map_err(|e| AgentError::Identity(e.to_string()))?;
        sallyport_core::files::replace_private(&path(dir), &text)?;
        Ok(())
    }
}
