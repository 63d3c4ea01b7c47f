//! Sallyport's shared vocabulary: identities, certificate authorities and the certificates they
//! issue, roles, audit records, durations, TLS plumbing and the API types that cross the wire.
//!
//! `core` performs no storage I/O and knows nothing about sqlx; every door (auth, proxy, agent,
//! web) and both clients speak through the types defined here.

pub mod api;
pub mod asciicast;
pub mod audit;
pub mod ca;
pub mod door;
pub mod duration;
pub mod files;
pub mod flow;
pub mod https;
pub mod identity;
pub mod kube;
pub mod metrics;
pub mod names;
pub mod oidc;
pub mod resource;
pub mod role;
pub mod routes;
pub mod scp;
pub mod sftp;
pub mod spdy;
pub mod sshcert;
pub mod terminal;
pub mod tls;
pub mod tunnel;
pub mod webcert;
pub mod x509;
pub mod yaml;

/// Installs the one crypto provider compiled into the workspace (aws-lc-rs). Safe to call more
/// than once; every `main` and test helper calls it before building a rustls config.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Seconds since the Unix epoch, from the system clock.
pub fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unix seconds as RFC 3339 (empty for a time out of range).
pub fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// SHA-256 of `data`, using the crypto provider already in the tree.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Compares two secrets in constant time.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// A fresh random secret of `n` bytes, hex encoded (tokens, nonces).
pub fn random_hex(n: usize) -> String {
    use rand::Rng;
    let mut buf = vec![0u8; n];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}
