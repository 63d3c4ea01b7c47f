//! The certificate browsers see on the proxy's web port: keypairs from files
//! (`proxy_service.https_keypairs`, as Teleport names it), chosen by the name the browser asked
//! for (SNI) and read again when the files change, so a renewed certificate (certbot, a
//! Kubernetes secret) is served without a restart.
//!
//! Sallyport's own clients (`sally`, agents joining, `sallyctl`) pin the cluster's CA and keep
//! getting the cluster's certificate on the same port: they offer the ALPN protocol
//! [`CLUSTER_ALPN`] beside HTTP's (`crate::tls::client_config`), and the listener answers those
//! with the cluster configuration (`crate::https::Certs`). A browser never offers it.
//!
//! A reload that fails (a key that does not match its certificate, a file half written) keeps
//! the certificates served before and says why in the log once per distinct error; it is tried
//! again at every check until the files read well.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Offered by Sallyport's clients, which pin the cluster's CA: the web port answers them with
/// the cluster's certificate whatever public one it has.
pub const CLUSTER_ALPN: &[u8] = b"sallyport";

/// How often the files are checked for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// One `https_keypairs` entry: a PEM certificate chain (leaf first) and its PEM private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keypair {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// The public certificates, as served now.
pub struct PublicCerts {
    files: Vec<Keypair>,
    alpn: Vec<Vec<u8>>,
    /// The names the certificates read at start are for (wildcards left out).
    names: Vec<String>,
    current: RwLock<Arc<ServerConfig>>,
    /// What the files looked like when `current` was read from them.
    seen: Mutex<Vec<Stamp>>,
    /// The last reload error logged, so a file that stays broken is reported once.
    last_error: Mutex<Option<String>>,
}

/// A file's modification time and length: a change to either is a change.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(p: &Path) -> Stamp {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl PublicCerts {
    /// Reads every keypair; `Err` names the file and what is wrong with it. `alpn` is the
    /// protocols the listener speaks (HTTP's).
    pub fn load(files: Vec<Keypair>, alpn: Vec<Vec<u8>>) -> Result<Arc<Self>, String> {
        if files.is_empty() {
            return Err("https_keypairs: at least one {cert_file, key_file}".into());
        }
        let seen = files
            .iter()
            .flat_map(|k| [stamp(&k.cert_file), stamp(&k.key_file)])
            .collect();
        let (config, names) = build(&files, &alpn)?;
        Ok(Arc::new(PublicCerts {
            files,
            alpn,
            names,
            current: RwLock::new(config),
            seen: Mutex::new(seen),
            last_error: Mutex::new(None),
        }))
    }

    /// The names (DNS or IP, no wildcards) the certificates read at start are for: the
    /// addresses browsers reach the proxy at.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The configuration to answer a browser with.
    pub fn config(&self) -> Arc<ServerConfig> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the files again if any changed since they were last read well. `Ok(true)` when
    /// new certificates are served; `Err` (the old ones still served) when they do not read.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let now: Vec<Stamp> = self
            .files
            .iter()
            .flat_map(|k| [stamp(&k.cert_file), stamp(&k.key_file)])
            .collect();
        {
            let seen = self.seen.lock().map_err(|_| "poisoned".to_string())?;
            if *seen == now {
                return Ok(false);
            }
        }
        let (config, _) = build(&self.files, &self.alpn)?;
        match self.current.write() {
            Ok(mut c) => *c = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
        if let Ok(mut seen) = self.seen.lock() {
            *seen = now;
        }
        Ok(true)
    }

    /// Checks the files every [`RELOAD_EVERY`] for as long as the task runs.
    pub async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Ok(true) => {
                    tracing::info!(files = ?self.file_names(), "https_keypairs: read again; new connections get the new certificates");
                    if let Ok(mut last) = self.last_error.lock() {
                        *last = None;
                    }
                }
                Ok(false) => {}
                Err(why) => {
                    let fresh = self
                        .last_error
                        .lock()
                        .map(|mut last| {
                            let fresh = last.as_deref() != Some(why.as_str());
                            *last = Some(why.clone());
                            fresh
                        })
                        .unwrap_or(true);
                    if fresh {
                        tracing::warn!(error = %why, "https_keypairs: the changed files do not read; the certificates served before are kept");
                    }
                }
            }
        }
    }

    fn file_names(&self) -> Vec<String> {
        self.files
            .iter()
            .map(|k| k.cert_file.display().to_string())
            .collect()
    }
}

/// A server configuration answering with the keypair whose names match the SNI, else the first.
fn build(files: &[Keypair], alpn: &[Vec<u8>]) -> Result<(Arc<ServerConfig>, Vec<String>), String> {
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let mut keys = Vec::new();
    for k in files {
        keys.push(read_keypair(k, &provider)?);
    }
    let names = keys
        .iter()
        .flat_map(|(n, _)| n.iter().filter(|n| !n.starts_with('*')).cloned())
        .collect();
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(BySni { keys }));
    config.alpn_protocols = alpn.to_vec();
    Ok((Arc::new(config), names))
}

fn read_keypair(
    k: &Keypair,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<(Vec<String>, Arc<CertifiedKey>), String> {
    let cert_name = k.cert_file.display();
    let key_name = k.key_file.display();
    let pem = std::fs::read(&k.cert_file).map_err(|e| format!("{cert_name}: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{cert_name}: not a PEM certificate chain: {e}"))?;
    let Some(leaf) = chain.first() else {
        return Err(format!("{cert_name}: no certificate in it"));
    };
    let names = dns_names(leaf).map_err(|e| format!("{cert_name}: {e}"))?;
    let key_pem = std::fs::read(&k.key_file).map_err(|e| format!("{key_name}: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("{key_name}: not a PEM private key: {e}"))?;
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("{key_name}: {e}"))?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|_| format!("{key_name} is not the key of {cert_name}"))?;
    Ok((names, Arc::new(certified)))
}

/// The DNS names and IP addresses a certificate is for (its subjectAltName), lowercase.
fn dns_names(der: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => names.push(d.to_ascii_lowercase()),
                GeneralName::IPAddress(ip) => {
                    if let Ok(a) = <[u8; 4]>::try_from(*ip) {
                        names.push(std::net::Ipv4Addr::from(a).to_string());
                    } else if let Ok(a) = <[u8; 16]>::try_from(*ip) {
                        names.push(std::net::Ipv6Addr::from(a).to_string());
                    }
                }
                _ => {}
            }
        }
    }
    Ok(names)
}

/// Whether certificate name `pattern` covers `host`: exactly, or `*.example.com` for one
/// label in its place (RFC 6125).
fn covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => host
            .split_once('.')
            .is_some_and(|(label, tail)| !label.is_empty() && tail == rest),
        None => pattern == host,
    }
}

#[derive(Debug)]
struct BySni {
    keys: Vec<(Vec<String>, Arc<CertifiedKey>)>,
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let host = hello.server_name().map(|h| h.to_ascii_lowercase());
        let chosen = host.and_then(|h| {
            self.keys
                .iter()
                .find(|(names, _)| names.iter().any(|n| covers(n, &h)))
        });
        chosen.or(self.keys.first()).map(|(_, k)| k.clone())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn keypair(dir: &Path, name: &str, sans: &[&str]) -> Keypair {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        let k = Keypair {
            cert_file: dir.join(format!("{name}.crt")),
            key_file: dir.join(format!("{name}.key")),
        };
        std::fs::write(&k.cert_file, cert.pem()).unwrap();
        std::fs::write(&k.key_file, key.serialize_pem()).unwrap();
        k
    }

    #[test]
    fn wildcards_cover_one_label() {
        assert!(covers("*.example.com", "web.example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(covers("proxy.example.com", "proxy.example.com"));
        assert!(!covers("proxy.example.com", "xproxy.example.com"));
    }

    #[test]
    fn mistakes_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = keypair(dir.path(), "a", &["a.example.com"]);
        let b = keypair(dir.path(), "b", &["b.example.com"]);
        let alpn = vec![b"http/1.1".to_vec()];

        let missing = Keypair {
            cert_file: dir.path().join("nope.crt"),
            key_file: a.key_file.clone(),
        };
        let e = PublicCerts::load(vec![missing], alpn.clone())
            .err()
            .unwrap();
        assert!(e.contains("nope.crt"), "{e}");

        let crossed = Keypair {
            cert_file: a.cert_file.clone(),
            key_file: b.key_file.clone(),
        };
        let e = PublicCerts::load(vec![crossed], alpn.clone())
            .err()
            .unwrap();
        assert!(
            e.contains("b.key is not the key of") && e.contains("a.crt"),
            "{e}"
        );

        std::fs::write(&a.key_file, "not a key").unwrap();
        let e = PublicCerts::load(vec![a], alpn).err().unwrap();
        assert!(
            e.contains("a.key") && e.contains("not a PEM private key"),
            "{e}"
        );
    }

    #[test]
    fn a_change_is_read_again_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let k = keypair(dir.path(), "web", &["one.example.com"]);
        let certs = PublicCerts::load(vec![k.clone()], vec![]).unwrap();
        assert!(!certs.reload_if_changed().unwrap(), "nothing changed");
        let before = certs.config();

        // Half a renewal: a new certificate beside the old key.
        let other = keypair(dir.path(), "other", &["two.example.com"]);
        std::fs::copy(&other.cert_file, &k.cert_file).unwrap();
        let e = certs.reload_if_changed().unwrap_err();
        assert!(e.contains("is not the key of"), "{e}");
        assert!(Arc::ptr_eq(&before, &certs.config()), "the old one is kept");

        // The renewal finished: served from now on.
        std::fs::copy(&other.key_file, &k.key_file).unwrap();
        assert!(certs.reload_if_changed().unwrap());
        assert!(!Arc::ptr_eq(&before, &certs.config()));
        assert!(!certs.reload_if_changed().unwrap());
    }
}
