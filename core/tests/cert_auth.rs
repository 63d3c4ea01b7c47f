//! A user certificate against a real russh server under Sallyport's own settings
//! (`sshcert::server_config`), which leave the certificate's signature to the handler
//! (`certificate_signature_checked_by_handler`, `vendor/russh/PATCHES.md`): a handler that
//! checks with `sshcert::verify_user`, as every Sallyport server does, accepts the genuine
//! certificate and refuses one whose bytes were changed after signing (a login added), one
//! from another CA and an expired one — whichever was accepted before.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::AnyHostKey;
use russh::keys::ssh_key::{Certificate, PrivateKey, PublicKey};
use sallyport_core::sshcert::{self, Permits, Transport, UserCertRequest};

/// Accepts a certificate only when `verify_user` does, counting both answers.
#[derive(Clone)]
struct Verifying {
    cas: Vec<PublicKey>,
    accepted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl russh::server::Handler for Verifying {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        cert: &Certificate,
    ) -> Result<russh::server::Auth, Self::Error> {
        match sshcert::verify_user(cert, &self.cas, login, sshcert::now()) {
            Ok(_) => {
                self.accepted.fetch_add(1, Ordering::SeqCst);
                Ok(russh::server::Auth::Accept)
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::SeqCst);
                Ok(russh::server::Auth::reject())
            }
        }
    }
}

/// A client connected to a russh server under Sallyport's settings running `handler`.
async fn connect<H>(handler: H) -> russh::client::Handle<AnyHostKey>
where
    H: russh::server::Handler<Error = russh::Error> + Send + 'static,
{
    let host_ca = sshcert::generate_ed25519().unwrap();
    let host_key = sshcert::generate_ed25519().unwrap();
    let host_cert = sshcert::issue_host(
        &host_ca,
        host_key.public_key(),
        "host",
        &["host".to_string()],
        Duration::from_secs(60),
    )
    .unwrap();
    let config = sshcert::server_config(host_key, host_cert, Transport::Open);
    assert!(config.certificate_signature_checked_by_handler);
    let config = russh::server::Config {
        auth_rejection_time: Duration::ZERO,
        ..config
    };
    let (a, b) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = russh::server::run_stream(Arc::new(config), a, handler).await {
            let _ = running.await;
        }
    });
    let client_config = sshcert::client_config(sshcert::preferred());
    russh::client::connect_stream(Arc::new(client_config), b, AnyHostKey)
        .await
        .unwrap()
}

/// Logs in as `login` with `cert` (for `key`); true when accepted.
async fn login<H>(handler: H, key: &PrivateKey, cert: Certificate, login: &str) -> bool
where
    H: russh::server::Handler<Error = russh::Error> + Send + 'static,
{
    connect(handler)
        .await
        .authenticate_openssh_cert(login, Arc::new(key.clone()), cert)
        .await
        .unwrap()
        .success()
}

fn issue(ca: &PrivateKey, key: &PrivateKey, logins: &[String], before: u64) -> Certificate {
    let now = sshcert::now();
    sshcert::issue_user(
        ca,
        &UserCertRequest {
            public_key: key.public_key(),
            user: "alice",
            roles: &[],
            logins,
            valid_after: now - 60,
            valid_before: before,
            permits: Permits::default(),
        },
    )
    .unwrap()
}

/// `cert` with its login `from` changed to `to` (same length) in its encoding: the signature,
/// made over the old bytes, no longer matches.
fn tampered(cert: &Certificate, from: &str, to: &str) -> Certificate {
    assert_eq!(from.len(), to.len());
    let mut bytes = cert.to_bytes().unwrap();
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .expect("the login is in the encoding");
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
    Certificate::from_bytes(&bytes).unwrap()
}

#[tokio::test]
async fn only_certificates_the_handler_verifies_get_in_whatever_came_before() {
    let ca = sshcert::generate_ed25519().unwrap();
    let key = sshcert::generate_ed25519().unwrap();
    let server = Verifying {
        cas: vec![ca.public_key().clone()],
        accepted: Default::default(),
        refused: Default::default(),
    };
    let now = sshcert::now();
    let genuine = issue(&ca, &key, &["deploy".to_string()], now + 3600);
    assert!(login(server.clone(), &key, genuine.clone(), "deploy").await);
    // Twice: the second check is the remembered one.
    assert!(login(server.clone(), &key, genuine.clone(), "deploy").await);
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2);

    // The genuine certificate's bytes with another login: russh no longer checks the
    // signature, so only the handler's check stands between it and a shell as root.
    let forged_root = tampered(&genuine, "deploy", "rooted");
    assert!(forged_root.verify_signature().is_err());
    assert!(!login(server.clone(), &key, forged_root.clone(), "rooted").await);
    assert_eq!(
        sshcert::verify_user(&forged_root, &server.cas, "rooted", sshcert::now()),
        Err(sshcert::CertRefusal::BadSignature)
    );

    // Another CA's certificate, and an expired one of this CA, after a genuine one was let in.
    let other = sshcert::generate_ed25519().unwrap();
    let stranger = issue(&other, &key, &["deploy".to_string()], now + 3600);
    assert!(!login(server.clone(), &key, stranger, "deploy").await);
    let expired = issue(&ca, &key, &["deploy".to_string()], now - 1);
    assert!(!login(server.clone(), &key, expired, "deploy").await);
    assert_eq!(server.accepted.load(Ordering::SeqCst), 2);
    // (russh refuses an expired certificate before the handler sees it.)
    assert_eq!(server.refused.load(Ordering::SeqCst), 2);

    // A certificate remembered as well signed is refused once its CA is no longer trusted,
    // and once it expired.
    assert_eq!(
        sshcert::verify_user(&genuine, &[other.public_key().clone()], "deploy", now),
        Err(sshcert::CertRefusal::UnknownCa)
    );
    assert!(matches!(
        sshcert::verify_user(&genuine, &server.cas, "deploy", now + 7200),
        Err(sshcert::CertRefusal::Expired { .. })
    ));
}

/// Accepts every certificate russh passes on: what a handler under `server_config` must not be.
struct Trusting;

impl russh::server::Handler for Trusting {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        _: &str,
        _: &Certificate,
    ) -> Result<russh::server::Auth, Self::Error> {
        Ok(russh::server::Auth::Accept)
    }
}

/// The contract's other side: under `server_config` russh itself lets a certificate edited
/// after signing through to the handler, so the handler's check is the only one (if this
/// fails, russh checks again and the setting's documentation is out of date).
#[tokio::test]
async fn under_sallyports_settings_only_the_handler_checks_the_signature() {
    let ca = sshcert::generate_ed25519().unwrap();
    let key = sshcert::generate_ed25519().unwrap();
    let genuine = issue(&ca, &key, &["deploy".to_string()], sshcert::now() + 3600);
    let forged = tampered(&genuine, "deploy", "rooted");
    assert!(login(Trusting, &key, forged, "rooted").await);
}
