//! SSH certificates: issuing user certificates with `ssh_key` (the copy russh re-exports) and
//! checking them the way OpenSSH's sshd does — and the checks russh leaves to us.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use russh::keys::ssh_key::{self, Certificate, HashAlg, PrivateKey, PublicKey, certificate};

pub const EXT_USER: &str = "sallyport-user@sallyport";
pub const EXT_ROLES: &str = "sallyport-roles@sallyport";
/// A principal no login can ever equal (names cannot start with `-`): an SSH certificate with no
/// principals means "any principal" to OpenSSH, so a user without logins gets this one instead.
pub const NO_LOGIN_PREFIX: &str = "-sallyport-nologin-";

#[derive(Debug, thiserror::Error)]
pub enum SshCertError {
    #[error("ssh key: {0}")]
    Key(#[from] ssh_key::Error),
    #[error("only Ed25519, ECDSA and RSA public keys can be certified")]
    UnsupportedKey,
}

/// What a user certificate permits beyond a plain session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Permits {
    pub pty: bool,
    pub port_forwarding: bool,
    pub agent_forwarding: bool,
    pub x11_forwarding: bool,
}

/// The request for one user certificate.
pub struct UserCertRequest<'a> {
    pub public_key: &'a PublicKey,
    pub user: &'a str,
    pub roles: &'a [String],
    pub logins: &'a [String],
    pub valid_after: u64,
    pub valid_before: u64,
    pub permits: Permits,
}

/// Issues a user certificate signed by `ca`.
pub fn issue_user(ca: &PrivateKey, req: &UserCertRequest<'_>) -> Result<Certificate, SshCertError> {
    let mut b = certificate::Builder::new_with_random_nonce(
        &mut rand::rng(),
        req.public_key.key_data().clone(),
        req.valid_after,
        req.valid_before,
    )?;
    b.serial(rand::random::<u64>())?;
    b.cert_type(certificate::CertType::User)?;
    b.key_id(req.user)?;
    if req.logins.is_empty() {
        b.valid_principal(format!("{NO_LOGIN_PREFIX}{}", uuid::Uuid::new_v4()))?;
    }
    for l in req.logins {
        b.valid_principal(l.clone())?;
    }
    let p = req.permits;
    for (on, name) in [
        (p.pty, "permit-pty"),
        (p.port_forwarding, "permit-port-forwarding"),
        (p.agent_forwarding, "permit-agent-forwarding"),
        (p.x11_forwarding, "permit-X11-forwarding"),
    ] {
        if on {
            b.extension(name, "")?;
        }
    }
    b.extension(EXT_USER, req.user)?;
    b.extension(EXT_ROLES, req.roles.join(","))?;
    b.comment(req.user)?;
    Ok(b.sign(ca)?)
}

/// A new Ed25519 key pair (CAs, client keys).
pub fn generate_ed25519() -> Result<PrivateKey, SshCertError> {
    Ok(PrivateKey::random(
        &mut rand::rng(),
        ssh_key::Algorithm::Ed25519,
    )?)
}

/// `@cert-authority` known_hosts line trusting `ca` for every host of the cluster.
pub fn known_hosts_line(ca: &PublicKey, pattern: &str) -> Result<String, SshCertError> {
    let mut key = ca.clone();
    key.set_comment("");
    Ok(format!(
        "@cert-authority {pattern} {}",
        key.to_openssh()?.trim_end()
    ))
}

/// The SHA-256 fingerprint OpenSSH prints.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Unix seconds for `SystemTime::now() + d`, saturating.
pub fn unix_after(d: Duration) -> u64 {
    SystemTime::now()
        .checked_add(d)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(u64::MAX, |d| d.as_secs())
}

/// The raw 32-byte Ed25519 key behind an SSH public key, for X.509 issuance.
pub fn ed25519_bytes(key: &PublicKey) -> Result<[u8; 32], SshCertError> {
    key.key_data()
        .ed25519()
        .map(|k| k.0)
        .ok_or(SshCertError::UnsupportedKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_cert_with_principals_and_extensions() {
        let ca = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let user = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let logins = vec!["root".to_string(), "ubuntu".to_string()];
        let roles = vec!["access".to_string()];
        let now = unix_after(Duration::ZERO);
        let cert = issue_user(
            &ca,
            &UserCertRequest {
                public_key: user.public_key(),
                user: "alice",
                roles: &roles,
                logins: &logins,
                valid_after: now - 60,
                valid_before: now + 3600,
                permits: Permits {
                    pty: true,
                    ..Default::default()
                },
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cert.valid_principals(), &logins[..]);
        assert_eq!(cert.key_id(), "alice");
        assert!(cert.extensions().contains_key("permit-pty"));
        assert!(!cert.extensions().contains_key("permit-port-forwarding"));
        let fp = ca.public_key().fingerprint(HashAlg::Sha256);
        assert!(cert.validate_at(now, [&fp]).is_ok());
        let other = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let fp2 = other.public_key().fingerprint(HashAlg::Sha256);
        assert!(cert.validate_at(now, [&fp2]).is_err());
    }

    #[test]
    fn no_logins_never_means_any_principal() {
        let ca = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let user = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let cert = issue_user(
            &ca,
            &UserCertRequest {
                public_key: user.public_key(),
                user: "bob",
                roles: &[],
                logins: &[],
                valid_after: 0,
                valid_before: u64::MAX,
                permits: Permits::default(),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cert.valid_principals().len(), 1);
        assert!(cert.valid_principals()[0].starts_with(NO_LOGIN_PREFIX));
    }
}
