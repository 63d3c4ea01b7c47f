//! The node agent: joins the cluster once with a one-time token, then keeps one outbound,
//! mutually authenticated, multiplexed tunnel to the proxy and serves SSH on every stream the
//! proxy opens in it. The server opens no inbound port. A kube agent (`kube`) joins and keeps
//! its tunnel the same way, and forwards the HTTP on its streams to one Kubernetes API server.
//!
//! Architecture invariant: the agent trusts only certificates from the user CA it received at
//! join, checks them itself (CA, type, principal, validity), and runs every session as the
//! login, never as the agent's own user when that differs.

pub mod becomes;
pub mod forward;
pub mod host_user;
pub mod identity;
pub mod join;
pub mod kube;
pub mod motd;
pub mod pam;
pub mod passwd;
pub mod session_exec;
pub mod spawn;
pub mod ssh;
pub mod tunnel;
pub mod utmp;

pub use identity::AgentIdentity;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Join(String),
    #[error("agent identity: {0}")]
    Identity(String),
    #[error("{0}")]
    Kube(#[from] kube::KubeError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
