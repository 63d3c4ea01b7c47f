//! What an agent keeps in its data dir after joining (`agent-identity.json`, 0600): its node id
//! and name, its TLS key and host certificate for the tunnel, its SSH host key and certificate,
//! and the CAs it trusts. A restart reuses it; the join token is never needed again.
//!
//! A kube agent keeps the same in its own file (`kube-agent-identity.json`, its SSH fields
//! unused), so that one data dir can hold a node agent and a kube agent.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::AgentError;

pub const FILE: &str = "agent-identity.json";

/// A kube agent's identity file, beside a node agent's.
pub const KUBE_FILE: &str = "kube-agent-identity.json";

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
    /// Empty for a kube agent, which serves no SSH.
    #[serde(default)]
    pub ssh_host_key: String,
    #[serde(default)]
    pub ssh_host_cert: String,
    #[serde(default)]
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

/// Where a kube agent's identity is kept in `dir`.
pub fn kube_path(dir: &Path) -> PathBuf {
    dir.join(KUBE_FILE)
}

impl AgentIdentity {
    /// The node agent's identity in `dir`, if it joined.
    pub fn load(dir: &Path) -> Result<Option<Self>, AgentError> {
        Self::load_from(&path(dir))
    }

    pub fn save(&self, dir: &Path) -> Result<(), AgentError> {
        self.save_to(&path(dir))
    }

    /// The kube agent's identity in `dir`, if it joined.
    pub fn load_kube(dir: &Path) -> Result<Option<Self>, AgentError> {
        Self::load_from(&kube_path(dir))
    }

    pub fn save_kube(&self, dir: &Path) -> Result<(), AgentError> {
        self.save_to(&kube_path(dir))
    }

    fn load_from(file: &Path) -> Result<Option<Self>, AgentError> {
        match std::fs::read(file) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                AgentError::Identity(format!("{} is unreadable: {e}", file.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(AgentError::Identity(format!(
                "cannot read {}: {e}",
                file.display()
            ))),
        }
    }

    fn save_to(&self, file: &Path) -> Result<(), AgentError> {
        let text =
            serde_json::to_vec_pretty(self).map_err(|e| AgentError::Identity(e.to_string()))?;
        sallyport_core::files::replace_private(file, &text)?;
        Ok(())
    }
}
