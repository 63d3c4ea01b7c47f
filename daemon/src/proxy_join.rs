//! A proxy on its own host (`sallyport start --roles=proxy --auth-server HOST:3025 --token T
//! --ca-pin P`): it makes its own TLS and SSH host keys, joins auth once with the token (auth's
//! certificate checked against the pin), and keeps what auth certified in
//! `<data>/proxy-identity.json` (0600). Later starts reuse that file and need no token; a
//! certificate past two thirds of its life is renewed at start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use rcgen::{KeyPair, PublicKeyData};
use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_core::api::{ErrorBody, ProxyJoinRequest, ProxyJoined};
use sallyport_core::tls::{Trust, client_config, private_key_from_pem};
use sallyport_core::x509::pem_to_ders;
use serde::{Deserialize, Serialize};

pub const FILE: &str = "proxy-identity.json";

/// What a joined proxy keeps: auth's answer and the private keys it was for.
#[derive(Clone, Serialize, Deserialize)]
pub struct ProxyIdentity {
    pub joined: ProxyJoined,
    pub tls_key_pem: String,
    pub ssh_host_key: String,
    /// When the certificates were issued (Unix seconds): renewal is due at two thirds.
    pub issued: i64,
}

impl ProxyIdentity {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let p = Self::path(dir);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .with_context(|| format!("{} is damaged; remove it and join again", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    fn save(&self, dir: &Path) -> Result<()> {
        crate::start::write_secret(&Self::path(dir), serde_json::to_string(self)?.as_bytes())
    }

    pub fn ssh_key(&self) -> Result<PrivateKey> {
        PrivateKey::from_openssh(&self.ssh_host_key).context("the proxy's SSH host key")
    }

    /// Past two thirds of the certificate's life.
    fn due(&self) -> bool {
        let life = (self.joined.not_after - self.issued).max(1);
        sallyport_core::unix_now() > self.issued + life * 2 / 3
    }
}

/// Fresh keys, and the request that certifies them.
fn fresh(
    token: &str,
    name: &str,
    dns: &[String],
) -> Result<(KeyPair, PrivateKey, ProxyJoinRequest)> {
    let tls = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let ssh = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)?;
    let req = ProxyJoinRequest {
        token: token.to_string(),
        name: name.to_string(),
        tls_spki: base64::engine::general_purpose::STANDARD.encode(tls.subject_public_key_info()),
        ssh_host_key: ssh.public_key().to_openssh()?,
        dns_names: dns.to_vec(),
    };
    Ok((tls, ssh, req))
}

/// HTTPS to auth with `tls`, redirects off.
fn client(tls: rustls::ClientConfig) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()?)
}

async fn post(
    http: &reqwest::Client,
    auth_addrs: &[String],
    path: &str,
    req: &ProxyJoinRequest,
) -> Result<ProxyJoined> {
    let mut last = None;
    for addr in auth_addrs {
        let resp = match http
            .post(format!("https://{addr}{path}"))
            .json(req)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                last = Some(format!(
                    "cannot reach auth at {addr}: {}",
                    sallyport_agent::join::root_cause(&e)
                ));
                continue;
            }
        };
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|b| b.error)
                .unwrap_or_else(|_| status.to_string());
            bail!("auth at {addr} refused: {msg}");
        }
        return serde_json::from_slice(&bytes).context("unreadable answer from auth");
    }
    bail!(last.unwrap_or_else(|| "no --auth-server given".into()))
}

/// The proxy's identity: loaded (and renewed when due), or joined with the token.
pub async fn identity(
    dir: &Path,
    auth_addrs: &[String],
    token: Option<&str>,
    trust: Trust,
    name: &str,
    dns: &[String],
) -> Result<ProxyIdentity> {
    if let Some(id) = ProxyIdentity::load(dir)? {
        if !id.due() {
            return Ok(id);
        }
        // Renewed over the current certificate; a failure keeps it (it is still valid).
        match renew(&id, auth_addrs, name, dns).await {
            Ok(new) => {
                new.save(dir)?;
                tracing::info!("the proxy's certificates were renewed");
                return Ok(new);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the proxy's certificates could not be renewed; keeping the current ones");
                return Ok(id);
            }
        }
    }
    let token = token.ok_or_else(|| {
        anyhow::anyhow!(
            "first start of a proxy: give --token (from `sallyctl tokens add --type=proxy`)"
        )
    })?;
    // Auth is checked by its own name, whatever address it was given as.
    let trust = match trust {
        Trust::Insecure => Trust::Insecure,
        t => Trust::As(Box::new(t), sallyport_core::api::AUTH_SERVER_NAME.into()),
    };
    let http = client(client_config(trust, None)?)?;
    let (tls_key, ssh_key, req) = fresh(token, name, dns)?;
    let joined = post(
        &http,
        auth_addrs,
        sallyport_core::routes::auth::PROXY_JOIN,
        &req,
    )
    .await
    .context("joining failed")?;
    let id = ProxyIdentity {
        joined,
        tls_key_pem: tls_key.serialize_pem(),
        ssh_host_key: ssh_key.to_openssh(LineEnding::LF)?.to_string(),
        issued: sallyport_core::unix_now(),
    };
    id.save(dir)?;
    Ok(id)
}

/// New keys certified over the current certificate (mutual TLS to auth).
async fn renew(
    id: &ProxyIdentity,
    auth_addrs: &[String],
    name: &str,
    dns: &[String],
) -> Result<ProxyIdentity> {
    let roots = pem_to_ders(&id.joined.host_ca_pem)?;
    let chain = pem_to_ders(&id.joined.tls_chain_pem)?;
    let key = private_key_from_pem(&id.tls_key_pem)?;
    let trust = Trust::As(
        Box::new(Trust::Roots(roots)),
        sallyport_core::api::AUTH_SERVER_NAME.into(),
    );
    let http = client(client_config(trust, Some((chain, key)))?)?;
    let (tls_key, ssh_key, req) = fresh("", name, dns)?;
    let path = sallyport_core::routes::auth::proxy_renew(&id.joined.proxy_id);
    let joined = post(&http, auth_addrs, &path, &req).await?;
    Ok(ProxyIdentity {
        joined,
        tls_key_pem: tls_key.serialize_pem(),
        ssh_host_key: ssh_key.to_openssh(LineEnding::LF)?.to_string(),
        issued: sallyport_core::unix_now(),
    })
}
