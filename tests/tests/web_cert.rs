//! A certificate browsers trust on the proxy's web port (`proxy_service.https_keypairs`):
//! browsers get it, Sallyport's own clients (which pin the cluster CA) keep getting the
//! cluster's on the same port, a renewal is served without a restart, a broken renewal keeps
//! the certificate served before, and a keypair that does not read stops the start with the
//! file named.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sallyport_tests::*;

/// A CA standing in for a public one, and a certificate from it for the names browsers use.
struct PublicCa {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl PublicCa {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        PublicCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// Writes a leaf for localhost and 127.0.0.1 to `cert`/`key` (key first, as a renewal
    /// tool that is not atomic might).
    fn issue(&self, cert: &Path, key: &Path) {
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        let leaf = params.signed_by(&leaf_key, &self.issuer).unwrap();
        std::fs::write(key, leaf_key.serialize_pem()).unwrap();
        std::fs::write(cert, leaf.pem()).unwrap();
    }

    fn der(&self) -> rustls::pki_types::CertificateDer<'static> {
        sallyport_core::x509::pem_to_der(&self.pem).unwrap()
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `GET /v1/webapi/ping` with `tls`: the status, or the error that stopped it.
fn ping(addr: &str, tls: rustls::ClientConfig) -> Result<u16, String> {
    rt().block_on(async {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|e| e.to_string())?;
        http.get(format!("https://{addr}/v1/webapi/ping"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| format!("{e:?}"))
    })
}

/// What a browser sends: the public CA in its roots, ALPN h2 and http/1.1 only.
fn browser(ca: &PublicCa) -> rustls::ClientConfig {
    let mut tls =
        sallyport_core::tls::client_config(sallyport_core::tls::Trust::Roots(vec![ca.der()]), None)
            .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tls
}

fn keypair_line(cert: &Path, key: &Path) -> String {
    format!(
        "https_keypairs: [{{cert_file: {}, key_file: {}}}]",
        cert.display(),
        key.display()
    )
}

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("web.crt"), dir.join("web.key"))
}

/// Waits up to 15 s (the files are checked every 5 s) for `ok`.
fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within 15 s");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn browsers_get_the_public_certificate_and_sallyport_clients_the_clusters() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = files(certs.path());
    let ca = PublicCa::new("Public Test CA");
    ca.issue(&cert, &key);
    let c = Cluster::start_with(Options {
        proxy_service: vec![keypair_line(&cert, &key)],
        ..Default::default()
    });

    // A browser trusting the public CA is served.
    assert_eq!(ping(&c.proxy, browser(&ca)), Ok(200));

    // Sallyport's clients still pin the cluster CA on the same port: sally logs in...
    c.user("alice", "access", "root");
    // ...and a client that says it is Sallyport's gets the cluster's certificate, which the
    // public CA did not sign.
    let ours =
        sallyport_core::tls::client_config(sallyport_core::tls::Trust::Roots(vec![ca.der()]), None)
            .unwrap();
    let refused = ping(&c.proxy, ours).unwrap_err();
    assert!(
        refused.contains("UnknownIssuer") || refused.contains("certificate"),
        "{refused}"
    );
    let pinned =
        sallyport_core::tls::client_config(sallyport_core::tls::Trust::Pin(c.pin.clone()), None)
            .unwrap();
    assert_eq!(ping(&c.proxy, pinned), Ok(200));

    // A browser that trusts only the cluster CA is not given it: it gets the public one.
    let mut cluster_only =
        sallyport_core::tls::client_config(sallyport_core::tls::Trust::Pin(c.pin.clone()), None)
            .unwrap();
    cluster_only.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    assert!(ping(&c.proxy, cluster_only).is_err());
}

#[test]
fn a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = files(certs.path());
    let first = PublicCa::new("First CA");
    first.issue(&cert, &key);
    let c = Cluster::start_with(Options {
        proxy_service: vec![keypair_line(&cert, &key)],
        ..Default::default()
    });
    assert_eq!(ping(&c.proxy, browser(&first)), Ok(200));

    // Renewed by another CA: new connections get it within a check or two.
    let second = PublicCa::new("Second CA");
    second.issue(&cert, &key);
    eventually("the renewed certificate served", || {
        ping(&c.proxy, browser(&second)) == Ok(200)
    });
    assert!(ping(&c.proxy, browser(&first)).is_err());

    // A key file that no longer reads: after more than a check, the certificate served before
    // is still served (the daemon's log says why).
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nnot a key\n").unwrap();
    std::thread::sleep(sallyport_core::webcert::RELOAD_EVERY + Duration::from_secs(2));
    assert_eq!(ping(&c.proxy, browser(&second)), Ok(200));
    assert!(ping(&c.proxy, browser(&first)).is_err());
}

#[test]
fn a_keypair_that_does_not_read_stops_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = files(dir.path());
    let ca = PublicCa::new("CA");
    ca.issue(&cert, &key);
    // Another key than the certificate's.
    let other = dir.path().join("other.key");
    std::fs::write(&other, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let missing = dir.path().join("missing.crt");
    for (c, k, says) in [
        (&missing, &key, format!("{}", missing.display())),
        (
            &cert,
            &other,
            format!("{} is not the key of {}", other.display(), cert.display()),
        ),
    ] {
        let cfg = dir.path().join("sallyport.yaml");
        std::fs::write(
            &cfg,
            format!(
                "version: v1\nsallyport: {{data_dir: {}}}\nauth_service: {{listen_addr: 127.0.0.1:0}}\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  ssh_listen_addr: 127.0.0.1:0\n  tunnel_listen_addr: 127.0.0.1:0\n  kube_listen_addr: 127.0.0.1:0\n  {}\nssh_service: {{enabled: false}}\n",
                dir.path().join("data").display(),
                keypair_line(c, k)
            ),
        )
        .unwrap();
        let r = run(
            Command::new(bin("sallyport"))
                .args(["start", "--config"])
                .arg(&cfg),
            "",
        );
        assert_ne!(r.code, 0, "{}", r.stderr);
        assert!(
            r.stderr.contains("proxy_service.https_keypairs") && r.stderr.contains(&says),
            "{}",
            r.stderr
        );
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
}
