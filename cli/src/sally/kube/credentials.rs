//! `sally kube credentials`: the certificate kubectl presents to the proxy's Kubernetes door,
//! printed as an ExecCredential. kubectl runs this before every request, so a certificate is
//! fetched once and served from a per-cluster cache, with no network, until a minute before it
//! expires. Runs in parallel (kubectl's own concurrent requests, several shells) are safe: each
//! writes the cache through its own temporary file and renames it over, so a reader sees one
//! whole certificate or another, never a part.
//!
//! A kubeconfig certificate is for the key of the login's X.509 certificate (`<user>.key.pem`),
//! and auth makes it expire with that login. A new login wipes the cache with the old keys.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use sallyport_core::api::{KubeCert, KubeCertRequest, path_segment};
use sallyport_core::routes;
use serde_json::json;

use crate::profile::{self, Profile};

/// How long a cached certificate must still be good for to be served: the request kubectl is
/// about to make, and the ones it makes in the next few seconds without asking again.
pub(super) const MIN_LEFT_SECS: i64 = 60;

/// A kubeconfig certificate and its expiry (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Credential {
    pub cert_pem: String,
    pub not_after: i64,
}

/// The profile, if it is logged in to `proxy` and the login has not expired. Anything else is
/// one error naming `sally login`, which is all kubectl shows of it.
pub(super) fn logged_in_to(proxy: &str) -> Result<Profile> {
    let not_logged_in = || {
        anyhow!(
            "not logged in to {proxy} (or the login expired): run `sally login --proxy {proxy}`"
        )
    };
    let p = Profile::load()?
        .filter(|p| p.proxy == proxy)
        .ok_or_else(not_logged_in)?;
    if p.expires().is_none_or(|e| e <= sallyport_core::unix_now()) {
        return Err(not_logged_in());
    }
    Ok(p)
}

/// `keys/<proxy>/<user>-kube/<cluster>-x509.pem`: one file per cluster, beside the login's keys
/// (so `sally logout` and a new login remove it with them). The cluster name is one
/// percent-encoded segment, so no name reaches another directory.
pub(super) fn cache_path(p: &Profile, cluster: &str) -> PathBuf {
    cache_dir(p).join(format!("{}-x509.pem", path_segment(cluster)))
}

fn cache_dir(p: &Profile) -> PathBuf {
    p.paths().dir.join(format!("{}-kube", p.user))
}

/// The ExecCredential kubectl reads from `sally kube credentials`.
pub(super) fn exec_credential(c: &Credential, key_pem: &str) -> Result<serde_json::Value> {
    let expires = time::OffsetDateTime::from_unix_timestamp(c.not_after)
        .map_err(|e| anyhow!("certificate expiry out of range: {e}"))?
        .format(&time::format_description::well_known::Rfc3339)?;
    Ok(json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": c.cert_pem,
            "clientKeyData": key_pem,
            "expirationTimestamp": expires,
        },
    }))
}

/// `cluster`'s certificate: from the cache while it has more than [`MIN_LEFT_SECS`] left, else
/// from auth (which refuses a cluster the roles no longer reach), then cached.
pub(super) async fn credential(p: &Profile, cluster: &str) -> Result<Credential> {
    let paths = p.paths();
    let login_cert = std::fs::read_to_string(&paths.tls_cert).map_err(|e| {
        anyhow!(
            "cannot read {} ({e}): run `sally login --proxy {}`",
            paths.tls_cert.display(),
            p.proxy
        )
    })?;
    let key_pin = key_pin(&login_cert).context("the login's X.509 certificate")?;
    let path = cache_path(p, cluster);
    if let Some(c) = cached(&path, &key_pin, sallyport_core::unix_now()) {
        return Ok(c);
    }
    let cert: KubeCert = crate::http::user_api(p)?
        .post(
            routes::auth::KUBE_CERTS,
            &KubeCertRequest {
                cluster: cluster.into(),
            },
        )
        .await?;
    let not_after = check(&cert.cert_pem, &key_pin)
        .context("the auth service sent an unusable Kubernetes certificate")?;
    store(&path, cert.cert_pem.as_bytes())?;
    Ok(Credential {
        cert_pem: cert.cert_pem,
        not_after,
    })
}

/// The cached certificate at `path` if it is for the key `key_pin` names and has more than
/// [`MIN_LEFT_SECS`] left at `now`. Anything else (no file, a damaged one, another key's, one
/// about to expire) means asking auth again.
pub(super) fn cached(path: &Path, key_pin: &str, now: i64) -> Option<Credential> {
    let cert_pem = std::fs::read_to_string(path).ok()?;
    let not_after = check(&cert_pem, key_pin).ok()?;
    (not_after - now > MIN_LEFT_SECS).then_some(Credential {
        cert_pem,
        not_after,
    })
}

/// The pin of the public key `cert_pem` is for.
fn key_pin(cert_pem: &str) -> Result<String> {
    let der = sallyport_core::x509::pem_to_ders(cert_pem)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no certificate in the PEM"))?;
    Ok(sallyport_core::x509::spki_pin(&der)?)
}

/// `cert_pem`'s expiry, if it is a certificate for the key `key_pin` names: a certificate for
/// an earlier login's key would fail every TLS handshake until it expired.
fn check(cert_pem: &str, key_pin: &str) -> Result<i64> {
    if self::key_pin(cert_pem)? != key_pin {
        return Err(anyhow!("it is not for this login's key"));
    }
    let der = sallyport_core::x509::pem_to_der(cert_pem)?;
    Ok(sallyport_core::x509::parse_subject(&der)?.not_after)
}

/// Writes `data` over `path` (0600) through a temporary file of this run's own, so parallel
/// runs never write into each other's file (`files::replace`'s one `<path>.tmp` is for a single
/// writer).
fn store(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", path.display()))?;
    profile::ensure_private_dir(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        sallyport_core::random_hex(8)
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sallyport_core::x509::{Subject, TlsCa, ed25519_spki};
    use std::os::unix::fs::PermissionsExt;

    fn cert(ca: &TlsCa, seed: u8, not_after: i64) -> String {
        let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]);
        let at = |t| time::OffsetDateTime::from_unix_timestamp(t).unwrap_or_else(|e| panic!("{e}"));
        ca.sign(
            &ed25519_spki(&kp.public.0),
            &Subject {
                common_name: "alice".into(),
                organizations: vec!["access".into()],
                dns_names: vec![],
                server: false,
                not_before: at(not_after - 3600),
                not_after: at(not_after),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sally-kube-cred-{name}-{}-{}",
            std::process::id(),
            sallyport_core::random_hex(4)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_cached_certificate_is_served_until_a_minute_before_it_expires() {
        sallyport_core::install_crypto_provider();
        let ca = TlsCa::generate("user", "acme").unwrap_or_else(|e| panic!("{e}"));
        let now = sallyport_core::unix_now();
        let login = cert(&ca, 1, now + 8 * 3600);
        let pin = key_pin(&login).unwrap_or_else(|e| panic!("{e:#}"));
        let dir = scratch("cache");
        let path = dir.join("u-kube").join("dev-x509.pem");
        // Nothing cached yet.
        assert_eq!(cached(&path, &pin, now), None);
        for (left, served) in [
            (3600, true),
            (MIN_LEFT_SECS + 5, true),
            (MIN_LEFT_SECS, false),
            (30, false),
            (-10, false),
        ] {
            let pem = cert(&ca, 1, now + left);
            store(&path, pem.as_bytes()).unwrap_or_else(|e| panic!("{e:#}"));
            let got = cached(&path, &pin, now);
            assert_eq!(got.is_some(), served, "{left} s left");
            if let Some(c) = got {
                assert_eq!(c.cert_pem, pem);
                assert_eq!(c.not_after, now + left);
            }
        }
        // Another key's certificate (an earlier login's) is never served; nor is a damaged file.
        store(&path, cert(&ca, 2, now + 3600).as_bytes()).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(cached(&path, &pin, now), None);
        store(&path, b"-----BEGIN CERTIFICATE-----\nAAAA\n").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(cached(&path, &pin, now), None);
        // Private, and no temporary file left behind.
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o600));
        let dir_mode = std::fs::metadata(dir.join("u-kube")).map(|m| m.permissions().mode());
        assert_eq!(dir_mode.ok().map(|m| m & 0o777), Some(0o700));
        let files = std::fs::read_dir(dir.join("u-kube")).map(|d| d.count());
        assert_eq!(files.ok(), Some(1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parallel_writers_leave_one_whole_certificate() {
        let dir = scratch("parallel");
        let path = dir.join("dev-x509.pem");
        let bodies: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 64 * 1024]).collect();
        std::thread::scope(|s| {
            for body in &bodies {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..10 {
                        store(path, body).unwrap_or_else(|e| panic!("{e:#}"));
                    }
                });
            }
        });
        let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(bodies.contains(&got));
        let files = std::fs::read_dir(&dir).map(|d| d.count());
        assert_eq!(files.ok(), Some(1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn exec_credential_is_what_kubectl_reads() {
        let c = Credential {
            cert_pem: "CERT".into(),
            not_after: 1_700_000_000,
        };
        let v = exec_credential(&c, "KEY").unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(
            v,
            json!({
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {
                    "clientCertificateData": "CERT",
                    "clientKeyData": "KEY",
                    "expirationTimestamp": "2023-11-14T22:13:20Z",
                },
            })
        );
    }
}
