//! The five certificate authorities and how each is exported.

use serde::{Deserialize, Serialize};

/// Which authority. Each is trusted for exactly one purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaKind {
    /// Signs user SSH certificates.
    User,
    /// Signs host SSH certificates.
    Host,
    /// Signs X.509 client certificates for users (kubectl, the admin API).
    TlsUser,
    /// Signs X.509 certificates of the services (auth, proxy, agents).
    TlsHost,
    /// Signs the per-session certificates the proxy presents to agentless nodes, and nothing
    /// else. An agentless `sshd` trusts this CA (`TrustedUserCAKeys`), not the user CA: a
    /// person's own login certificate must not open it directly, past roles, locks,
    /// recording and audit.
    #[serde(rename = "openssh")]
    OpenSsh,
}

impl CaKind {
    pub const ALL: [CaKind; 5] = [
        CaKind::User,
        CaKind::Host,
        CaKind::TlsUser,
        CaKind::TlsHost,
        CaKind::OpenSsh,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CaKind::User => "user",
            CaKind::Host => "host",
            CaKind::TlsUser => "tls-user",
            CaKind::TlsHost => "tls-host",
            CaKind::OpenSsh => "openssh",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn is_ssh(self) -> bool {
        matches!(self, CaKind::User | CaKind::Host | CaKind::OpenSsh)
    }
}

/// The CN of each TLS CA's certificate; used to tell which CA issued a verified client cert.
pub const TLS_USER_CA_CN: &str = "Sallyport user CA";
pub const TLS_HOST_CA_CN: &str = "Sallyport host CA";
