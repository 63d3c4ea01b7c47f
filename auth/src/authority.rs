//! The five certificate authorities. Each can hold several keys: the active one signs, all are
//! trusted, so rotation can add a key, switch, then retire the old one.
//!
//! Each signs one kind of thing: the user SSH CA people's login certificates (and the
//! per-session certificates agents check), the OpenSSH CA only the proxy's per-session
//! certificates for agentless nodes, the host SSH CA host certificates, and the two TLS CAs
//! user and service X.509 certificates.
//!
//! Private keys live in the backend and in this process's memory only; nothing here logs them.

use russh::keys::ssh_key::{LineEnding, PrivateKey, PublicKey};
use sallyport_core::ca::{CaKind, TLS_HOST_CA_CN, TLS_USER_CA_CN};
use sallyport_core::x509::TlsCa;
use sqlx::Row;

use crate::{AuthError, Backend};

/// One SSH CA key.
#[derive(Clone)]
pub struct SshCa {
    pub id: String,
    pub key: PrivateKey,
    pub active: bool,
}

/// One TLS CA key and certificate.
#[derive(Clone)]
pub struct TlsCaKey {
    pub id: String,
    pub ca: TlsCa,
    pub active: bool,
}

/// All keys of all five authorities.
#[derive(Clone)]
pub struct Authorities {
    pub user: Vec<SshCa>,
    pub host: Vec<SshCa>,
    /// What agentless nodes trust: the proxy's per-session certificates only.
    pub openssh: Vec<SshCa>,
    pub tls_user: Vec<TlsCaKey>,
    pub tls_host: Vec<TlsCaKey>,
}

fn internal(e: impl std::fmt::Display) -> AuthError {
    AuthError::Internal(e.to_string())
}

impl Authorities {
    /// Loads every CA key, creating the first key of any CA that has none (a database from
    /// before the OpenSSH CA gets it at its next start). Creation inserts a fixed id with
    /// `ON CONFLICT DO NOTHING`, so auth instances starting together on one PostgreSQL agree
    /// on a single key.
    pub async fn load_or_create(backend: &Backend, cluster: &str) -> Result<Self, AuthError> {
        for kind in CaKind::ALL {
            let (private, public) = if kind.is_ssh() {
                let key = sallyport_core::sshcert::generate_ed25519().map_err(internal)?;
                let private = key
                    .to_openssh(LineEnding::LF)
                    .map_err(internal)?
                    .to_string();
                (private, key.public_key().to_openssh().map_err(internal)?)
            } else {
                let purpose = if kind == CaKind::TlsUser {
                    "user"
                } else {
                    "host"
                };
                let ca = TlsCa::generate(purpose, cluster).map_err(internal)?;
                (ca.key_pem, ca.cert_pem)
            };
            sqlx::query(
                "INSERT INTO cert_authorities (id, kind, private_key, public_key, active, created)
                 VALUES ($1, $2, $3, $4, 1, $5) ON CONFLICT (id) DO NOTHING",
            )
            .bind(format!("{}-1", kind.as_str()))
            .bind(kind.as_str())
            .bind(private)
            .bind(public)
            .bind(sallyport_core::unix_now())
            .execute(&backend.pool)
            .await?;
        }
        let rows = sqlx::query("SELECT id, kind, private_key, public_key, active FROM cert_authorities ORDER BY active DESC, created DESC, id")
            .fetch_all(&backend.pool)
            .await?;
        let mut a = Authorities {
            user: vec![],
            host: vec![],
            openssh: vec![],
            tls_user: vec![],
            tls_host: vec![],
        };
        for r in rows {
            let id: String = r.try_get(0)?;
            let kind: String = r.try_get(1)?;
            let private: String = r.try_get(2)?;
            let public: String = r.try_get(3)?;
            let active = r.try_get::<i64, _>(4)? != 0;
            let corrupt = |e: &dyn std::fmt::Display| {
                AuthError::Storage(format!("CA key {id} is unreadable: {e}"))
            };
            match CaKind::parse(&kind) {
                Some(k @ (CaKind::User | CaKind::Host | CaKind::OpenSsh)) => {
                    let key =
                        PrivateKey::from_openssh(private.as_bytes()).map_err(|e| corrupt(&e))?;
                    let ca = SshCa { id, key, active };
                    match k {
                        CaKind::User => a.user.push(ca),
                        CaKind::Host => a.host.push(ca),
                        _ => a.openssh.push(ca),
                    }
                }
                Some(k @ (CaKind::TlsUser | CaKind::TlsHost)) => {
                    let ca = TlsCaKey {
                        id,
                        ca: TlsCa {
                            cert_pem: public,
                            key_pem: private,
                        },
                        active,
                    };
                    if k == CaKind::TlsUser {
                        a.tls_user.push(ca)
                    } else {
                        a.tls_host.push(ca)
                    }
                }
                None => return Err(corrupt(&format!("unknown kind {kind}"))),
            }
        }
        if a.user.is_empty()
            || a.host.is_empty()
            || a.openssh.is_empty()
            || a.tls_user.is_empty()
            || a.tls_host.is_empty()
        {
            return Err(AuthError::Storage(
                "a certificate authority has no key".into(),
            ));
        }
        // The CN is how a verified client certificate is attributed to its CA.
        for (cas, cn) in [(&a.tls_user, TLS_USER_CA_CN), (&a.tls_host, TLS_HOST_CA_CN)] {
            for c in cas {
                let der = c.ca.cert_der().map_err(internal)?;
                let s = sallyport_core::x509::parse_subject(&der).map_err(internal)?;
                if s.common_name != cn {
                    return Err(AuthError::Storage(format!(
                        "CA {} has subject {:?}, expected {cn:?}",
                        c.id, s.common_name
                    )));
                }
            }
        }
        Ok(a)
    }

    pub fn user_signer(&self) -> &SshCa {
        &self.user[0]
    }

    pub fn host_signer(&self) -> &SshCa {
        &self.host[0]
    }

    /// Signs the proxy's per-session certificates for agentless nodes, nothing else.
    pub fn openssh_signer(&self) -> &SshCa {
        &self.openssh[0]
    }

    pub fn tls_user_signer(&self) -> &TlsCa {
        &self.tls_user[0].ca
    }

    pub fn tls_host_signer(&self) -> &TlsCa {
        &self.tls_host[0].ca
    }

    pub fn ssh_public_keys(&self, kind: CaKind) -> Vec<PublicKey> {
        let keys = match kind {
            CaKind::User => &self.user,
            CaKind::OpenSsh => &self.openssh,
            _ => &self.host,
        };
        keys.iter().map(|k| k.key.public_key().clone()).collect()
    }

    /// PEM of every trusted key of a TLS CA, concatenated.
    pub fn tls_pem(&self, kind: CaKind) -> String {
        let keys = if kind == CaKind::TlsUser {
            &self.tls_user
        } else {
            &self.tls_host
        };
        keys.iter().map(|k| k.ca.cert_pem.clone()).collect()
    }

    /// `sha256:<hex>` pins of the host TLS CA keys, active first.
    pub fn pins(&self) -> Result<Vec<String>, AuthError> {
        self.tls_host
            .iter()
            .map(|k| {
                let der = k.ca.cert_der().map_err(internal)?;
                sallyport_core::x509::spki_pin(&der).map_err(internal)
            })
            .collect()
    }

    /// The host CA's `@cert-authority` lines for `cluster`'s hosts.
    pub fn known_hosts(&self, cluster: &str) -> Result<Vec<String>, AuthError> {
        let pattern = format!("*.{cluster},*");
        self.host
            .iter()
            .map(|k| {
                sallyport_core::sshcert::known_hosts_line(k.key.public_key(), &pattern)
                    .map_err(internal)
            })
            .collect()
    }

    /// What `sallyctl auth export --type=KIND` prints.
    pub fn export(&self, kind: CaKind, cluster: &str) -> Result<String, AuthError> {
        Ok(match kind {
            // `TrustedUserCAKeys` lines; agentless nodes take the OpenSSH CA's.
            CaKind::User | CaKind::OpenSsh => self
                .ssh_public_keys(kind)
                .iter()
                .map(|k| {
                    let mut k = k.clone();
                    k.set_comment(format!("sallyport {} CA {cluster}", kind.as_str()));
                    k.to_openssh().map(|s| s + "\n").map_err(internal)
                })
                .collect::<Result<String, _>>()?,
            CaKind::Host => self
                .known_hosts(cluster)?
                .into_iter()
                .map(|l| l + "\n")
                .collect(),
            CaKind::TlsUser | CaKind::TlsHost => self.tls_pem(kind),
        })
    }
}
