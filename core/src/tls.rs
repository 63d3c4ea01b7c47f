//! rustls configurations for every Sallyport connection: servers that may ask for client
//! certificates, and clients that trust the cluster either by CA pin (first contact), by the CA
//! certificates saved at login, or — only when the user says `--insecure` — not at all.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls: {0}")]
    Verifier(String),
    #[error("malformed private key: {0}")]
    Key(String),
}

/// Parses a PEM private key (PKCS#8, SEC1 or PKCS#1).
pub fn private_key_from_pem(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Key(e.to_string()))
}

fn roots(cas: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for ca in cas {
        store.add(ca.clone())?;
    }
    Ok(store)
}

/// Whether a server asks connecting clients for a certificate.
pub enum ClientAuth {
    None,
    /// Verified against these CAs when presented, but not required.
    Optional(Vec<CertificateDer<'static>>),
    /// Required and verified against these CAs.
    Required(Vec<CertificateDer<'static>>),
}

/// A server config speaking HTTP/2 and HTTP/1.1.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_auth: ClientAuth,
) -> Result<ServerConfig, TlsError> {
    let mut cfg = server_builder(client_auth)?.with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A server config that presents `live`'s certificate as it is at each handshake: renewing
/// it ([`LiveCert::replace`]) changes what the next connection gets, without a restart.
pub fn server_config_live(
    live: Arc<LiveCert>,
    client_auth: ClientAuth,
) -> Result<ServerConfig, TlsError> {
    let mut cfg = server_builder(client_auth)?.with_cert_resolver(live);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

fn server_builder(
    client_auth: ClientAuth,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, TlsError> {
    let builder = ServerConfig::builder();
    Ok(match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional(cas) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder(Arc::new(roots(&cas)?))
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?,
        ),
        ClientAuth::Required(cas) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder(Arc::new(roots(&cas)?))
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?,
        ),
    })
}

/// A service's certificate and key, replaced in place when it is renewed: every server config
/// made over it ([`server_config_live`]) presents the current one from the next handshake on;
/// connections already open keep theirs.
#[derive(Debug)]
pub struct LiveCert(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl LiveCert {
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(LiveCert(std::sync::RwLock::new(certified(
            chain, key,
        )?))))
    }

    /// The renewed certificate, for every handshake from now on.
    pub fn replace(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), TlsError> {
        let next = certified(chain, key)?;
        match self.0.write() {
            Ok(mut c) => *c = next,
            Err(p) => *p.into_inner() = next,
        }
        Ok(())
    }

    fn current(&self) -> Arc<rustls::sign::CertifiedKey> {
        match self.0.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
    let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
        .map_err(|e| TlsError::Key(e.to_string()))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(chain, signer)))
}

impl rustls::server::ResolvesServerCert for LiveCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current())
    }
}

/// How a client decides to trust the server.
#[derive(Debug, Clone)]
pub enum Trust {
    /// The server's chain must contain a CA whose SubjectPublicKeyInfo hashes to this pin
    /// (`sha256:<hex>`), and the leaf must verify against that CA.
    Pin(String),
    /// The leaf must verify against one of these CAs.
    Roots(Vec<CertificateDer<'static>>),
    /// No verification at all (`--insecure`).
    Insecure,
    /// As the inner trust, but the certificate is checked against `name` whatever address was
    /// dialed: a cluster service reached at any address (auth through a proxy's passthrough,
    /// or at an address its certificate does not list) must still be that service.
    As(Box<Trust>, String),
}

/// A client config with an optional client certificate.
pub fn client_config(
    trust: Trust,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier(trust, &provider)?);
    let mut cfg = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    // The last one says "a Sallyport client": the proxy's web port answers it with the
    // cluster's certificate even when browsers get a public one (`crate::webcert`).
    cfg.alpn_protocols = vec![
        b"h2".to_vec(),
        b"http/1.1".to_vec(),
        crate::webcert::CLUSTER_ALPN.to_vec(),
    ];
    Ok(cfg)
}

#[derive(Debug)]
struct PinVerifier {
    pin: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut seen = Vec::new();
        for ca in intermediates {
            let pin =
                crate::x509::spki_pin(ca).map_err(|e| rustls::Error::General(e.to_string()))?;
            if crate::secrets_equal(pin.as_bytes(), self.pin.as_bytes()) {
                let mut store = RootCertStore::empty();
                store.add(ca.clone().into_owned())?;
                let verifier = WebPkiServerVerifier::builder_with_provider(
                    Arc::new(store),
                    self.provider.clone(),
                )
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
                return verifier.verify_server_cert(end_entity, &[], server_name, ocsp, now);
            }
            seen.push(pin);
        }
        Err(rustls::Error::General(format!(
            "the server's CA does not match --ca-pin {} (it presented {}); check the pin `sallyport start` printed",
            self.pin,
            if seen.is_empty() {
                "no CA".to_string()
            } else {
                seen.join(", ")
            }
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// How `trust` checks a server's certificate.
fn verifier(
    trust: Trust,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    Ok(match trust {
        Trust::Roots(cas) => {
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots(&cas)?), provider.clone())
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?
        }
        Trust::Pin(pin) => Arc::new(PinVerifier {
            pin,
            provider: provider.clone(),
        }),
        Trust::Insecure => Arc::new(NoVerifier {
            provider: provider.clone(),
        }),
        Trust::As(inner, name) => {
            if matches!(*inner, Trust::Insecure | Trust::As(..)) {
                return Err(TlsError::Verifier(
                    "a service name needs roots or a pin to check it with".into(),
                ));
            }
            let name = ServerName::try_from(name)
                .map_err(|e| TlsError::Verifier(format!("not a server name: {e}")))?;
            Arc::new(NamedVerifier {
                inner: verifier(*inner, provider)?,
                name,
            })
        }
    })
}

/// Checks a server's certificate against one fixed name, not the dialed address's.
#[derive(Debug)]
struct NamedVerifier {
    inner: Arc<dyn ServerCertVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialed: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[derive(Debug)]
struct NoVerifier {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
