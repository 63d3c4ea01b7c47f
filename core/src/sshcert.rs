//! SSH certificates: issuing user certificates with `ssh_key` (the copy russh re-exports) and
//! checking them the way OpenSSH's sshd does — and the checks russh leaves to us.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use russh::keys::ssh_key::{self, Certificate, HashAlg, PrivateKey, PublicKey, certificate};

pub const EXT_USER: &str = "sallyport-user@sallyport";
pub const EXT_ROLES: &str = "sallyport-roles@sallyport";
/// In a per-session certificate: the address and port the user's connection came from, as the
/// proxy saw it (`203.0.113.7:51234`), for the node's `SSH_CONNECTION`. An extension, not a
/// critical option, so an agentless sshd ignores it; an agent trusts it because auth signed it.
pub const EXT_CLIENT_ADDR: &str = "sallyport-client-addr@sallyport";
/// Per-session certificates: auth's host user decision for the login on that node
/// (`role::HostUser` as JSON), non-critical so sshd ignores it. The agent acts on it because
/// auth signed it.
pub const EXT_HOST_USER: &str = "sallyport-host-user@sallyport";
/// Per-session certificates for a kube agent: exactly what the session may run
/// (`kube::KubeExec` as JSON: pod, container, command, the principals to impersonate). The
/// agent runs that and nothing else, because auth signed it.
pub const EXT_KUBE_EXEC: &str = "sallyport-kube-exec@sallyport";
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
    issue(ca, req, None, None, None)
}

/// Issues a per-session certificate (auth, for the proxy's connection to a node): a user
/// certificate that also carries the user's own address (`EXT_CLIENT_ADDR`).
pub fn issue_session(
    ca: &PrivateKey,
    req: &UserCertRequest<'_>,
    client_addr: &str,
    host_user: Option<&crate::role::HostUser>,
) -> Result<Certificate, SshCertError> {
    issue(ca, req, Some(client_addr), host_user, None)
}

/// A per-session certificate for a kube agent: the user's address and the one exec or attach
/// it allows ([`EXT_KUBE_EXEC`]).
pub fn issue_kube_session(
    ca: &PrivateKey,
    req: &UserCertRequest<'_>,
    client_addr: &str,
    exec: &crate::kube::KubeExec,
) -> Result<Certificate, SshCertError> {
    issue(ca, req, Some(client_addr), None, Some(exec))
}

/// The exec a kube agent's per-session certificate allows, if it carries one that parses.
pub fn kube_exec(cert: &Certificate) -> Option<crate::kube::KubeExec> {
    serde_json::from_str(cert.extensions().get(EXT_KUBE_EXEC)?).ok()
}

/// The host user an agent may create for this session's login (`EXT_HOST_USER`), if auth
/// granted one; a value that does not parse (or names a bad group) grants nothing.
pub fn host_user(cert: &Certificate) -> Option<crate::role::HostUser> {
    serde_json::from_str(cert.extensions().get(EXT_HOST_USER)?).ok()
}

/// The user's address a per-session certificate carries, if it carries a valid one.
pub fn client_addr(cert: &Certificate) -> Option<std::net::SocketAddr> {
    cert.extensions().get(EXT_CLIENT_ADDR)?.parse().ok()
}

fn issue(
    ca: &PrivateKey,
    req: &UserCertRequest<'_>,
    client_addr: Option<&str>,
    host_user: Option<&crate::role::HostUser>,
    kube: Option<&crate::kube::KubeExec>,
) -> Result<Certificate, SshCertError> {
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
    if let Some(addr) = client_addr {
        b.extension(EXT_CLIENT_ADDR, addr)?;
    }
    if let Some(h) = host_user {
        // Serializing a struct of strings cannot fail; an empty value would grant nothing.
        b.extension(EXT_HOST_USER, serde_json::to_string(h).unwrap_or_default())?;
    }
    if let Some(k) = kube {
        b.extension(EXT_KUBE_EXEC, serde_json::to_string(k).unwrap_or_default())?;
    }
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

/// Issues a host certificate for `names` (hostname, hostname.cluster, node id).
pub fn issue_host(
    ca: &PrivateKey,
    key: &PublicKey,
    host_id: &str,
    names: &[String],
    ttl: Duration,
) -> Result<Certificate, SshCertError> {
    let now = unix_after(Duration::ZERO);
    let mut b = certificate::Builder::new_with_random_nonce(
        &mut rand::rng(),
        key.key_data().clone(),
        now.saturating_sub(60),
        now.saturating_add(ttl.as_secs()),
    )?;
    b.serial(rand::random::<u64>())?;
    b.cert_type(certificate::CertType::Host)?;
    b.key_id(host_id)?;
    for n in names {
        b.valid_principal(n.clone())?;
    }
    Ok(b.sign(ca)?)
}

/// Why a certificate was refused, in words for the audit log and the person.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertRefusal {
    #[error("not a user certificate")]
    NotUserCert,
    #[error("not a host certificate")]
    NotHostCert,
    #[error("certificate is not signed by this cluster's CA")]
    UnknownCa,
    #[error("certificate for {user} expired at {at}; run `sally login`")]
    Expired { user: String, at: String },
    #[error("certificate for {user} is not valid yet")]
    NotYetValid { user: String },
    #[error("certificate signature is invalid")]
    BadSignature,
    #[error("certificate has no principals")]
    NoPrincipals,
    #[error("certificate for {user} does not allow login {login}")]
    Principal { user: String, login: String },
    #[error("certificate carries an unknown critical option {0:?}")]
    CriticalOption(String),
    #[error("certificate has no key id")]
    NoKeyId,
}

/// Checks a certificate the way sshd would — and what russh leaves to the caller: the CA is a
/// plain key byte-equal to a trusted one, the type, the validity window, the signature, that a
/// principal equals `principal` byte for byte, and that no unknown critical option is present.
fn verify(
    cert: &Certificate,
    trusted: &[PublicKey],
    principal: &str,
    now: u64,
    kind: certificate::CertType,
) -> Result<(), CertRefusal> {
    if cert.cert_type() != kind {
        return Err(if kind == certificate::CertType::User {
            CertRefusal::NotUserCert
        } else {
            CertRefusal::NotHostCert
        });
    }
    let signer = cert.signature_key();
    if !trusted.iter().any(|k| k.key_data() == signer) {
        return Err(CertRefusal::UnknownCa);
    }
    let user = cert.key_id().to_string();
    if cert.valid_before() <= now {
        return Err(CertRefusal::Expired {
            user,
            at: crate::rfc3339(cert.valid_before().min(i64::MAX as u64) as i64),
        });
    }
    if cert.valid_after() > now {
        return Err(CertRefusal::NotYetValid { user });
    }
    // The CA (above: byte-equal to a trusted one) and the window are checked on every use; the
    // signature, a pure function of the certificate's bytes, once per certificate.
    signature_checked(cert)?;
    if cert.valid_principals().is_empty() {
        return Err(CertRefusal::NoPrincipals);
    }
    if !cert
        .valid_principals()
        .iter()
        .any(|p| p.as_bytes() == principal.as_bytes())
    {
        return Err(CertRefusal::Principal {
            user,
            login: principal.to_string(),
        });
    }
    if let Some((name, _)) = cert.critical_options().iter().next() {
        return Err(CertRefusal::CriticalOption(name.clone()));
    }
    if cert.key_id().is_empty() {
        return Err(CertRefusal::NoKeyId);
    }
    Ok(())
}

/// How many certificates [`signature_checked`] remembers; past that it forgets them all.
const SIGNATURES_KEPT: usize = 4096;

/// Certificates whose signature verified, by the SHA-256 of their encoding.
static SIGNATURES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<[u8; 32]>>> =
    std::sync::LazyLock::new(Default::default);

/// Whether the certificate's signature is good (made by the key it names as its signer: the
/// caller checks that key is a trusted CA). One login's certificate is checked at the proxy's
/// door and again at the inner connection of every session it opens, a node's host certificate
/// at every dial to it — an Ed25519 verification each time (~50 µs; with russh's own checks,
/// now left to us, a tenth of the all-in-one's CPU per session) — so a certificate that verified
/// is remembered by its bytes' digest, which nothing but the same bytes matches (user and host
/// certificates alike). The digest costs a few microseconds; a failed check is never
/// remembered.
fn signature_checked(cert: &Certificate) -> Result<(), CertRefusal> {
    let bytes = cert.to_bytes().map_err(|_| CertRefusal::BadSignature)?;
    let digest: [u8; 32] = match aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &bytes)
        .as_ref()
        .try_into()
    {
        Ok(d) => d,
        Err(_) => return Err(CertRefusal::BadSignature),
    };
    if SIGNATURES.lock().is_ok_and(|s| s.contains(&digest)) {
        return Ok(());
    }
    cert.verify_signature()
        .map_err(|_| CertRefusal::BadSignature)?;
    if let Ok(mut s) = SIGNATURES.lock() {
        if s.len() >= SIGNATURES_KEPT {
            s.clear();
        }
        s.insert(digest);
    }
    Ok(())
}

/// A user certificate for `login`; returns the Sallyport user it was issued to.
pub fn verify_user(
    cert: &Certificate,
    user_cas: &[PublicKey],
    login: &str,
    now: u64,
) -> Result<String, CertRefusal> {
    verify(cert, user_cas, login, now, certificate::CertType::User)?;
    Ok(cert.key_id().to_string())
}

/// A user certificate for any of its principals (the proxy's outer door, where the SSH user
/// name is only the first login the client tries).
pub fn verify_user_any_login(
    cert: &Certificate,
    user_cas: &[PublicKey],
    now: u64,
) -> Result<String, CertRefusal> {
    let first = cert
        .valid_principals()
        .first()
        .cloned()
        .ok_or(CertRefusal::NoPrincipals)?;
    verify(cert, user_cas, &first, now, certificate::CertType::User)?;
    Ok(cert.key_id().to_string())
}

/// A host certificate for `hostname`.
pub fn verify_host(
    cert: &Certificate,
    host_cas: &[PublicKey],
    hostname: &str,
    now: u64,
) -> Result<(), CertRefusal> {
    verify(cert, host_cas, hostname, now, certificate::CertType::Host)
}

/// Algorithm preferences for every russh endpoint here: AES-256-GCM first, which the CPU
/// accelerates, then ChaCha20-Poly1305. The client's order decides, so this matters most where
/// we are the client (proxy → node, `sally ssh`).
pub fn preferred() -> russh::Preferred {
    use russh::cipher::{AES_256_CTR, AES_256_GCM, CHACHA20_POLY1305};
    russh::Preferred {
        cipher: std::borrow::Cow::Borrowed(&[AES_256_GCM, CHACHA20_POLY1305, AES_256_CTR]),
        ..Default::default()
    }
}

/// SSH inside an agent's tunnel (proxy → agent): no cipher of its own. The tunnel is TLS,
/// mutually authenticated with certificates from the cluster's CAs, and already encrypts and
/// authenticates every byte; a second cipher would only halve throughput. Never used on a
/// transport that is not inside the tunnel (agentless nodes get [`preferred`]).
///
/// With no cipher, the key exchange only binds the session identifier the certificate
/// signatures cover; its secret encrypts nothing, so its post-quantum half would protect
/// nothing either (the tunnel's TLS is what must resist). Plain X25519 first, then: one per
/// session dialed (every SSH and kube session), where ML-KEM would cost both ends for nothing.
pub fn preferred_in_tunnel() -> russh::Preferred {
    russh::Preferred {
        kex: std::borrow::Cow::Borrowed(IN_TUNNEL_KEX),
        cipher: std::borrow::Cow::Borrowed(&[russh::cipher::NONE]),
        ..Default::default()
    }
}

/// [`preferred_in_tunnel`]'s key exchanges: X25519 (RFC 8731), the hybrid as a fallback, and
/// the extensions a client announces (`ext-info-c`, strict key exchange against Terrapin).
const IN_TUNNEL_KEX: &[russh::kex::Name] = &[
    russh::kex::CURVE25519,
    russh::kex::MLKEM768X25519_SHA256,
    russh::kex::EXTENSION_SUPPORT_AS_CLIENT,
    russh::kex::EXTENSION_OPENSSH_STRICT_KEX_AS_CLIENT,
];

/// Where an SSH server runs: open to the network, or only inside an agent's mutually
/// authenticated TLS tunnel (where `none` is offered as well, see [`preferred_in_tunnel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Open,
    InsideTunnel,
}

/// Key exchanges every SSH server here offers: OpenSSH 9.x's defaults minus what `ssh-audit`
/// fails or warns on (beyond its note that classical exchanges are not post-quantum): the NIST
/// curves (fail), the 2048-bit `diffie-hellman-group14-sha256` (warn) and group exchange (russh
/// answers it from two fixed groups, one of them 2048-bit). `sntrup761x25519` is not in russh.
const SERVER_KEX: &[russh::kex::Name] = &[
    russh::kex::MLKEM768X25519_SHA256,
    russh::kex::CURVE25519,
    russh::kex::CURVE25519_PRE_RFC_8731,
    russh::kex::DH_G16_SHA512,
    russh::kex::DH_G18_SHA512,
    russh::kex::EXTENSION_SUPPORT_AS_CLIENT,
    russh::kex::EXTENSION_SUPPORT_AS_SERVER,
    russh::kex::EXTENSION_OPENSSH_STRICT_KEX_AS_CLIENT,
    russh::kex::EXTENSION_OPENSSH_STRICT_KEX_AS_SERVER,
];

/// AES-GCM first, as everywhere here (the CPU accelerates it; the benchmarks depend on it), then
/// the rest of OpenSSH's defaults.
const SERVER_CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_256_GCM,
    russh::cipher::AES_128_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_192_CTR,
    russh::cipher::AES_128_CTR,
];

/// Encrypt-then-MAC only (the AEAD ciphers above need no MAC at all); SHA-1 never.
const SERVER_MACS: &[russh::mac::Name] =
    &[russh::mac::HMAC_SHA512_ETM, russh::mac::HMAC_SHA256_ETM];

/// Compression only after authentication (`zlib@openssh.com`), as OpenSSH since 7.4: plain
/// `zlib` would run the decompressor on what anyone sends before logging in.
const SERVER_COMPRESSION: &[russh::compression::Name] =
    &[russh::compression::NONE, russh::compression::ZLIB_LEGACY];

/// The algorithms every SSH server here offers (the proxy's door on 3023, the inner server it
/// terminates for each node, every agent): one list, so an audit of one is an audit of all.
pub fn server_preferred(transport: Transport) -> russh::Preferred {
    russh::Preferred {
        kex: std::borrow::Cow::Borrowed(SERVER_KEX),
        cipher: match transport {
            Transport::Open => std::borrow::Cow::Borrowed(SERVER_CIPHERS),
            // The same list behind `none`, inside the tunnel only (built once per agent).
            Transport::InsideTunnel => std::iter::once(russh::cipher::NONE)
                .chain(SERVER_CIPHERS.iter().copied())
                .collect(),
        },
        mac: std::borrow::Cow::Borrowed(SERVER_MACS),
        compression: std::borrow::Cow::Borrowed(SERVER_COMPRESSION),
        ..Default::default()
    }
}

/// What every SSH server here shares: certificate-backed public keys as the only method, the
/// first `none` probe answered at once (refusals after it take the caller's
/// `auth_rejection_time`), no Nagle, room between nested session loops (`crate::flow`), and
/// [`server_preferred`]'s algorithms. Each server sets its own timeouts and windows over this.
///
/// Under it russh does not check a user certificate's signature
/// (`certificate_signature_checked_by_handler`): a server built on it must accept a
/// certificate in `auth_openssh_certificate` only when [`verify_user`] or
/// [`verify_user_any_login`] accepted it, or a certificate edited after signing gets in.
pub fn server_config(
    key: PrivateKey,
    certificate: Certificate,
    transport: Transport,
) -> russh::server::Config {
    russh::server::Config {
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![key],
        certificates: vec![certificate],
        nodelay: true,
        channel_buffer_size: crate::flow::CHANNEL_BUFFER,
        preferred: server_preferred(transport),
        // Every handler here checks a certificate with `verify_user*` (signature included)
        // before it accepts; russh's own check would be the same verification again.
        certificate_signature_checked_by_handler: true,
        ..Default::default()
    }
}

/// The SSH servers Sallyport runs, each with its own settings from [`server_settings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRole {
    /// The proxy's door on 3023: people's OpenSSH clients, before and after authentication.
    ProxyDoor,
    /// The inner connection the proxy terminates as the node, inside a door channel.
    ProxyInner,
    /// A node agent's server, reached only by the proxy through the agent's mTLS tunnel.
    Agent,
}

/// The one place Sallyport's russh server settings are made: [`server_config`]'s algorithms
/// and credentials, plus what each server's peers need.
pub fn server_settings(
    role: ServerRole,
    key: PrivateKey,
    certificate: Certificate,
) -> russh::server::Config {
    match role {
        ServerRole::ProxyDoor => russh::server::Config {
            // Every refusal takes the same time, whatever the reason.
            auth_rejection_time: Duration::from_millis(300),
            inactivity_timeout: Some(Duration::from_secs(3600)),
            max_auth_attempts: 6,
            window_size: crate::flow::CLIENT_WINDOW,
            // Its channels carry inner connections: their window is given back as the inner
            // server reads them (`crate::flow`, `vendor/russh/PATCHES.md`).
            window_policy: russh::WindowPolicy::Consumed,
            ..server_config(key, certificate, Transport::Open)
        },
        ServerRole::ProxyInner => russh::server::Config {
            auth_rejection_time: Duration::from_millis(300),
            // The door's connection and the session watchdogs bound it.
            inactivity_timeout: None,
            window_size: crate::flow::CLIENT_WINDOW,
            // A channel's window is given back as the node takes its input: a slow reader on
            // the node holds the person back instead of the proxy buffering.
            window_policy: russh::WindowPolicy::Consumed,
            ..server_config(key, certificate, Transport::Open)
        },
        ServerRole::Agent => russh::server::Config {
            auth_rejection_time: Duration::from_millis(100),
            inactivity_timeout: None,
            window_size: 8 * 1024 * 1024,
            // The window is given back as the session's input reaches its command (and a
            // forward's bytes their socket): a command that reads slowly holds the proxy back
            // instead of the agent buffering for it (`crate::flow`).
            window_policy: russh::WindowPolicy::Consumed,
            event_buffer_size: 1024,
            // Only the proxy reaches this server, through the mTLS tunnel: `none` is offered.
            ..server_config(key, certificate, Transport::InsideTunnel)
        },
    }
}

/// Sallyport's SSH client settings (sally, the proxy toward nodes): host certificates are
/// Ed25519 only, no Nagle, large windows, and room between nested session loops
/// (`crate::flow`).
pub fn client_config(preferred: russh::Preferred) -> russh::client::Config {
    let mut c = russh::client::Config {
        inactivity_timeout: None,
        nodelay: true,
        window_size: 8 * 1024 * 1024,
        channel_buffer_size: crate::flow::CHANNEL_BUFFER,
        preferred,
        ..Default::default()
    };
    c.preferred.host_key_certificates =
        std::borrow::Cow::Borrowed(&[russh::keys::ssh_key::Algorithm::Ed25519]);
    c
}

pub fn now() -> u64 {
    unix_after(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_the_tunnel_the_key_exchange_every_server_offers_is_x25519_first() {
        // The proxy's first choice decides; every server here must offer it, or dials would
        // quietly fall back to the hybrid and pay for it.
        let first = preferred_in_tunnel().kex.first().copied();
        assert_eq!(first, Some(russh::kex::CURVE25519));
        assert!(
            server_preferred(Transport::InsideTunnel)
                .kex
                .contains(&russh::kex::CURVE25519)
        );
        // Outside the tunnel the client's default stays post-quantum first.
        assert_eq!(
            preferred().kex.first().copied(),
            Some(russh::kex::MLKEM768X25519_SHA256)
        );
    }

    #[test]
    fn only_ssh_inside_the_tunnel_may_go_without_a_cipher() {
        let none = russh::cipher::NONE;
        assert!(!preferred().cipher.contains(&none));
        assert_eq!(&*preferred_in_tunnel().cipher, &[none]);
        assert!(!server_preferred(Transport::Open).cipher.contains(&none));
        assert!(
            server_preferred(Transport::InsideTunnel)
                .cipher
                .contains(&none)
        );
    }

    #[test]
    fn servers_offer_nothing_ssh_audit_flags() {
        for transport in [Transport::Open, Transport::InsideTunnel] {
            let p = server_preferred(transport);
            let kex: Vec<&str> = p.kex.iter().map(|k| k.as_ref()).collect();
            for weak in [
                "diffie-hellman-group14-sha256",
                "diffie-hellman-group14-sha1",
                "diffie-hellman-group-exchange-sha256",
                "ecdh-sha2-nistp256",
            ] {
                assert!(!kex.contains(&weak), "{weak} offered");
            }
            assert!(kex.contains(&"kex-strict-s-v00@openssh.com"));
            assert!(
                p.mac
                    .iter()
                    .all(|m| m.as_ref().ends_with("-etm@openssh.com"))
            );
            let compression: Vec<&str> = p.compression.iter().map(|c| c.as_ref()).collect();
            assert_eq!(compression, ["none", "zlib@openssh.com"]);
            // AES-GCM first among real ciphers: the benchmarks depend on it.
            let real: Vec<&str> = p
                .cipher
                .iter()
                .map(|c| c.as_ref())
                .filter(|c| *c != "none")
                .collect();
            assert_eq!(real.first(), Some(&"aes256-gcm@openssh.com"));
        }
    }

    #[test]
    fn a_session_certificate_carries_the_users_address() {
        let ca = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let user = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let now = unix_after(Duration::ZERO);
        let req = UserCertRequest {
            public_key: user.public_key(),
            user: "alice",
            roles: &[],
            logins: &["root".to_string()],
            valid_after: now - 60,
            valid_before: now + 60,
            permits: Permits::default(),
        };
        let cert =
            issue_session(&ca, &req, "[2001:db8::7]:51234", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            client_addr(&cert).map(|a| a.to_string()).as_deref(),
            Some("[2001:db8::7]:51234")
        );
        // Not a critical option: an agentless sshd would refuse a certificate with one it does
        // not know.
        assert!(cert.critical_options().is_empty());
        assert_eq!(host_user(&cert), None);
        let login_cert = issue_user(&ca, &req).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(client_addr(&login_cert), None);
    }

    #[test]
    fn a_session_certificate_carries_the_host_user_decision() {
        use crate::role::{HostUser, HostUserMode};
        let ca = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let user = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let now = unix_after(Duration::ZERO);
        let req = UserCertRequest {
            public_key: user.public_key(),
            user: "alice",
            roles: &[],
            logins: &["dev1".to_string()],
            valid_after: now - 60,
            valid_before: now + 60,
            permits: Permits::default(),
        };
        let grant = HostUser {
            mode: HostUserMode::InsecureDrop,
            groups: vec![
                "adm"
                    .to_string()
                    .try_into()
                    .unwrap_or_else(|e| panic!("{e}")),
            ],
            sudoers: vec![
                "ALL=(ALL) NOPASSWD: /usr/bin/true"
                    .to_string()
                    .try_into()
                    .unwrap_or_else(|e| panic!("{e}")),
            ],
        };
        let cert = issue_session(&ca, &req, "10.0.0.1:2222", Some(&grant))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(host_user(&cert), Some(grant));
        assert!(cert.critical_options().is_empty());
    }

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
    fn verification_refuses_what_sshd_would_and_more() {
        let ca = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let other = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let user = generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let logins = vec!["root".to_string()];
        let now = now();
        let issue = |signer: &PrivateKey, after: u64, before: u64| {
            issue_user(
                signer,
                &UserCertRequest {
                    public_key: user.public_key(),
                    user: "alice",
                    roles: &[],
                    logins: &logins,
                    valid_after: after,
                    valid_before: before,
                    permits: Permits::default(),
                },
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let cas = [ca.public_key().clone()];
        let good = issue(&ca, now - 60, now + 60);
        assert_eq!(verify_user(&good, &cas, "root", now), Ok("alice".into()));
        assert_eq!(
            verify_user(&good, &cas, "Root", now)
                .err()
                .map(|e| e.to_string()),
            Some("certificate for alice does not allow login Root".into())
        );
        assert_eq!(
            verify_user(&issue(&other, now - 60, now + 60), &cas, "root", now),
            Err(CertRefusal::UnknownCa)
        );
        assert!(matches!(
            verify_user(&issue(&ca, now - 120, now - 60), &cas, "root", now),
            Err(CertRefusal::Expired { .. })
        ));
        assert!(matches!(
            verify_user(&issue(&ca, now + 60, now + 120), &cas, "root", now),
            Err(CertRefusal::NotYetValid { .. })
        ));
        let host = issue_host(
            &ca,
            user.public_key(),
            "id",
            &["root".into()],
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            verify_user(&host, &cas, "root", now),
            Err(CertRefusal::NotUserCert),
            "a host cert is never a user credential"
        );
        assert_eq!(verify_host(&host, &cas, "root", now), Ok(()));
        assert_eq!(
            verify_host(&good, &cas, "root", now),
            Err(CertRefusal::NotHostCert)
        );
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
