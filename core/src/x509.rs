//! X.509 for Sallyport: the TLS certificate authorities, the client certificates that carry a
//! user's identity (CN = user, O = roles), server certificates for the services, and the CA pin.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SubjectPublicKeyInfo,
};
use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

#[derive(Debug, thiserror::Error)]
pub enum X509Error {
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("malformed certificate: {0}")]
    Parse(String),
    #[error("malformed PEM: {0}")]
    Pem(String),
}

/// A TLS CA: its certificate and key, both PEM.
#[derive(Debug, Clone)]
pub struct TlsCa {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TlsCa {
    /// A new self-signed ECDSA P-256 CA named after its purpose and cluster.
    pub fn generate(purpose: &str, cluster: &str) -> Result<Self, X509Error> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Sallyport {purpose} CA"));
        params
            .distinguished_name
            .push(DnType::OrganizationName, cluster);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(3650);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Ok(TlsCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    pub fn cert_der(&self) -> Result<CertificateDer<'static>, X509Error> {
        pem_to_der(&self.cert_pem)
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, X509Error> {
        let key = KeyPair::from_pem(&self.key_pem)?;
        Ok(Issuer::from_ca_cert_pem(&self.cert_pem, key)?)
    }

    /// Signs a certificate for `subject` over the given public key (SubjectPublicKeyInfo DER).
    pub fn sign(&self, spki_der: &[u8], subject: &Subject) -> Result<String, X509Error> {
        self.sign_with(spki_der, subject, None)
    }

    /// [`Self::sign`], with the kubeconfig extension naming one cluster (non-critical).
    pub fn sign_with(
        &self,
        spki_der: &[u8],
        subject: &Subject,
        kube: Option<&crate::kube::KubeCertExt>,
    ) -> Result<String, X509Error> {
        let public = SubjectPublicKeyInfo::from_der(spki_der)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, subject.common_name.as_str());
        // rcgen keeps one value per attribute type; role names cannot contain commas, so the
        // roles travel as one comma-joined O.
        if !subject.organizations.is_empty() {
            params
                .distinguished_name
                .push(DnType::OrganizationName, subject.organizations.join(","));
        }
        for name in &subject.dns_names {
            params
                .subject_alt_names
                .push(match name.parse::<std::net::IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => SanType::DnsName(name.clone().try_into()?),
                });
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = if subject.server {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        } else {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        };
        params.not_before = subject.not_before;
        params.not_after = subject.not_after;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        if let Some(k) = kube {
            params
                .custom_extensions
                .push(rcgen::CustomExtension::from_oid_content(
                    crate::kube::CERT_EXTENSION_OID,
                    k.to_der(),
                ));
        }
        Ok(params.signed_by(&public, &self.issuer()?)?.pem())
    }
}

/// Who a certificate is for.
#[derive(Debug, Clone)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub server: bool,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

fn random_serial() -> rcgen::SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    rcgen::SerialNumber::from_slice(&bytes)
}

/// SubjectPublicKeyInfo DER of a raw Ed25519 public key.
pub fn ed25519_spki(raw: &[u8; 32]) -> Vec<u8> {
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend_from_slice(raw);
    der
}

/// PKCS#8 DER of an Ed25519 private key seed (what rustls and kubectl read).
pub fn ed25519_pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(seed);
    der
}

/// The Ed25519 seed in a PKCS#8 PEM of the shape [`ed25519_pkcs8`] makes; none for anything
/// else.
pub fn ed25519_seed_from_pkcs8_pem(pem: &str) -> Option<[u8; 32]> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).ok()?;
    let der = der.secret_pkcs8_der();
    let header = ed25519_pkcs8(&[0; 32]);
    if der.len() != header.len() || der[..16] != header[..16] {
        return None;
    }
    der[16..].try_into().ok()
}

/// PEM-armours DER bytes.
pub fn to_pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The first certificate in a PEM string.
pub fn pem_to_der(pem: &str) -> Result<CertificateDer<'static>, X509Error> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| X509Error::Pem(e.to_string()))
}

/// Every certificate in a PEM string.
pub fn pem_to_ders(pem: &str) -> Result<Vec<CertificateDer<'static>>, X509Error> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| X509Error::Pem(e.to_string()))
}

/// `sha256:<hex>` of a certificate's SubjectPublicKeyInfo: the CA pin clients pass.
pub fn spki_pin(cert_der: &[u8]) -> Result<String, X509Error> {
    let (_, cert) =
        X509Certificate::from_der(cert_der).map_err(|e| X509Error::Parse(e.to_string()))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(crate::sha256(cert.tbs_certificate.subject_pki.raw))
    ))
}

/// The identity fields of a verified certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSubject {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub issuer_common_name: String,
    pub not_after: i64,
}

/// A certificate's SubjectPublicKeyInfo (DER) and expiry (Unix seconds): what a certificate
/// for the same key, expiring no later, is made from.
pub fn spki_and_expiry(cert_der: &[u8]) -> Result<(Vec<u8>, i64), X509Error> {
    let (_, cert) =
        X509Certificate::from_der(cert_der).map_err(|e| X509Error::Parse(e.to_string()))?;
    Ok((
        cert.public_key().raw.to_vec(),
        cert.validity().not_after.timestamp(),
    ))
}

/// A certificate's validity: (not before, not after), Unix seconds.
pub fn validity(cert_der: &[u8]) -> Result<(i64, i64), X509Error> {
    let (_, cert) =
        X509Certificate::from_der(cert_der).map_err(|e| X509Error::Parse(e.to_string()))?;
    Ok((
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    ))
}

/// Whether a certificate valid from `not_before` to `not_after` is past two thirds of its
/// life at `now`: when services and agents renew theirs.
pub fn renewal_due(not_before: i64, not_after: i64, now: i64) -> bool {
    now >= renewal_time(not_before, not_after)
}

/// When a certificate valid from `not_before` to `not_after` is due for renewal (Unix seconds).
pub fn renewal_time(not_before: i64, not_after: i64) -> i64 {
    let life = (not_after - not_before).max(1);
    not_before + life * 2 / 3
}

pub fn parse_subject(cert_der: &[u8]) -> Result<CertSubject, X509Error> {
    let (_, cert) =
        X509Certificate::from_der(cert_der).map_err(|e| X509Error::Parse(e.to_string()))?;
    let attr = |name: &x509_parser::x509::X509Name<'_>, cn: bool| -> Vec<String> {
        let iter: Vec<_> = if cn {
            name.iter_common_name().collect()
        } else {
            name.iter_organization().collect()
        };
        iter.into_iter()
            .filter_map(|a| a.as_str().ok().map(str::to_string))
            .collect()
    };
    let subject = cert.subject();
    Ok(CertSubject {
        common_name: attr(subject, true).into_iter().next().unwrap_or_default(),
        organizations: attr(subject, false)
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|o| !o.is_empty())
            .map(str::to_string)
            .collect(),
        issuer_common_name: attr(cert.issuer(), true)
            .into_iter()
            .next()
            .unwrap_or_default(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_signs_client_cert_with_identity() {
        crate::install_crypto_provider();
        let ca = TlsCa::generate("user", "example").unwrap_or_else(|e| panic!("{e}"));
        let seed = [7u8; 32];
        let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&seed);
        let spki = ed25519_spki(&kp.public.0);
        let now = OffsetDateTime::now_utc();
        let pem = ca
            .sign(
                &spki,
                &Subject {
                    common_name: "alice".into(),
                    organizations: vec!["access".into(), "editor".into()],
                    dns_names: vec![],
                    server: false,
                    not_before: now,
                    not_after: now + time::Duration::hours(1),
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let der = pem_to_der(&pem).unwrap_or_else(|e| panic!("{e}"));
        let s = parse_subject(&der).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.common_name, "alice");
        assert_eq!(s.organizations, vec!["access", "editor"]);
        assert_eq!(s.issuer_common_name, "Sallyport user CA");
        let ca_der = ca.cert_der().unwrap_or_else(|e| panic!("{e}"));
        let pin = spki_pin(&ca_der).unwrap_or_else(|e| panic!("{e}"));
        assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64);
    }
}
