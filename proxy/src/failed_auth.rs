//! What the proxy's doors saw of clients that did not authenticate, reported to auth for its
//! `auth.fail` audit (door, address, the identity presented, reason). Reports go through
//! [`AuthClient::report_failure`]'s bounded queue: a refusal never waits on its audit, and auth
//! aggregates a flood into one event a minute per (door, address, reason).
//!
//! An SSH connection is reported once, when it ends without authenticating, with its most
//! telling failure (a refused certificate over a plain key over nothing at all): a client that
//! offers a plain key before its good certificate did not fail.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use russh::keys::ssh_key::{Certificate, HashAlg, PublicKey};
use sallyport_core::api::AuthFailure;

use crate::AuthClient;

/// One SSH connection's authentication attempts.
pub struct SshAttempts {
    addr: SocketAddr,
    /// The client asked to authenticate at least once.
    attempted: bool,
    authenticated: bool,
    certificate: Option<AuthFailure>,
    plain_key: Option<AuthFailure>,
}

impl SshAttempts {
    pub fn new(addr: SocketAddr) -> Self {
        SshAttempts {
            addr,
            attempted: false,
            authenticated: false,
            certificate: None,
            plain_key: None,
        }
    }

    /// The SSH user name is the login asked for on the node, not a Sallyport user: it goes with
    /// what was presented, so `audit search --user` never confuses the two.
    fn failure(
        &self,
        login: &str,
        reason: String,
        mut presented: BTreeMap<String, String>,
    ) -> AuthFailure {
        presented.insert("login".into(), login.to_string());
        AuthFailure {
            door: "ssh".into(),
            remote_addr: self.addr.to_string(),
            reason,
            user: None,
            presented,
            count: None,
        }
    }

    /// Any authentication request (OpenSSH starts with `none`).
    pub fn attempted(&mut self) {
        self.attempted = true;
    }

    pub fn certificate_refused(&mut self, login: &str, cert: &Certificate, reason: &str) {
        self.attempted = true;
        let presented = BTreeMap::from([
            (
                "key_fingerprint".to_string(),
                cert.public_key().fingerprint(HashAlg::Sha256).to_string(),
            ),
            ("cert_key_id".to_string(), cert.key_id().to_string()),
            (
                "ca_fingerprint".to_string(),
                cert.signature_key()
                    .fingerprint(HashAlg::Sha256)
                    .to_string(),
            ),
            (
                "cert_type".to_string(),
                if cert.cert_type().is_host() {
                    "host"
                } else {
                    "user"
                }
                .to_string(),
            ),
            ("cert_serial".to_string(), cert.serial().to_string()),
        ]);
        self.certificate =
            Some(self.failure(login, format!("certificate refused: {reason}"), presented));
    }

    /// A key whose signature verified but that is not a certificate: never enough here.
    pub fn plain_key(&mut self, login: &str, key: &PublicKey) {
        self.attempted = true;
        let presented = BTreeMap::from([(
            "key_fingerprint".to_string(),
            key.fingerprint(HashAlg::Sha256).to_string(),
        )]);
        self.plain_key = Some(self.failure(
            login,
            "a plain key, not a certificate from this cluster".into(),
            presented,
        ));
    }

    pub fn authenticated(&mut self) {
        self.authenticated = true;
    }

    /// The connection ended: reports it if it tried and never authenticated.
    pub fn finish(&mut self, auth: &AuthClient) {
        if self.authenticated || !self.attempted {
            return;
        }
        let failure = self
            .certificate
            .take()
            .or_else(|| self.plain_key.take())
            .unwrap_or_else(|| AuthFailure {
                door: "ssh".into(),
                remote_addr: self.addr.to_string(),
                // russh refuses these before the handler sees the certificate.
                reason: "no acceptable credential (none offered, or a certificate that is expired, not yet valid or badly signed)".into(),
                user: None,
                presented: BTreeMap::new(),
                count: None,
            });
        auth.report_failure(failure);
    }
}

/// A refused agent at the tunnel door.
pub fn tunnel_refused(
    auth: &AuthClient,
    addr: SocketAddr,
    reason: String,
    presented: BTreeMap<String, String>,
) {
    auth.report_failure(AuthFailure {
        door: "tunnel".into(),
        remote_addr: addr.to_string(),
        reason,
        user: None,
        presented,
        count: None,
    });
}
