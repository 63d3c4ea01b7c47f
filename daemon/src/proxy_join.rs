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

    pub fn save(&self, dir: &Path) -> Result<()> {
        crate::start::write_secret(&Self::path(dir), serde_json::to_string(self)?.as_bytes())
    }

    pub fn ssh_key(&self) -> Result<PrivateKey> {
        PrivateKey::from_openssh(&self.ssh_host_key).context("the proxy's SSH host key")
    }

    /// Past two thirds of the certificate's life.
    fn due(&self) -> bool {
        sallyport_core::unix_now() >= self.renewal_time()
    }

    /// When the certificates are due for renewal: two thirds into the TLS certificate's own
    /// validity (now when it cannot be read).
    fn renewal_time(&self) -> i64 {
        pem_to_ders(&self.joined.tls_chain_pem)
            .ok()
            .and_then(|c| c.into_iter().next())
            .and_then(|leaf| sallyport_core::x509::validity(&leaf).ok())
            .map_or(0, |(from, to)| sallyport_core::x509::renewal_time(from, to))
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
    };
    id.save(dir)?;
    Ok(id)
}

/// The proxy's keys certified again (mutual TLS to auth, as the current certificate): the
/// same keys, so what is running can take the new certificates in place.
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
    let tls_key = KeyPair::from_pem(&id.tls_key_pem)?;
    let ssh_key = id.ssh_key()?;
    let req = ProxyJoinRequest {
        token: String::new(),
        name: name.to_string(),
        tls_spki: base64::engine::general_purpose::STANDARD
            .encode(tls_key.subject_public_key_info()),
        ssh_host_key: ssh_key.public_key().to_openssh()?,
        dns_names: dns.to_vec(),
    };
    let path = sallyport_core::routes::auth::proxy_renew(&id.joined.proxy_id);
    let joined = post(&http, auth_addrs, &path, &req).await?;
    Ok(ProxyIdentity {
        joined,
        tls_key_pem: id.tls_key_pem.clone(),
        ssh_host_key: id.ssh_host_key.clone(),
    })
}

/// Renews the proxy's certificates while it runs: at two thirds of their life (again a minute
/// after a failure), kept in `proxy-identity.json` and handed to `renewed`, which puts them in
/// place (the doors' TLS, the client to auth, the SSH door's host certificate).
pub async fn keep_renewed(
    dir: PathBuf,
    auth_addrs: Vec<String>,
    name: String,
    dns: Vec<String>,
    renewed: impl Fn(&ProxyIdentity) -> Result<()>,
) {
    loop {
        let id = match ProxyIdentity::load(&dir) {
            Ok(Some(id)) => id,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "the proxy's identity cannot be read; not renewing");
                return;
            }
        };
        let wait = (id.renewal_time() - sallyport_core::unix_now()).max(0) as u64;
        tokio::time::sleep(Duration::from_secs(wait)).await;
        let result = async {
            let new = renew(&id, &auth_addrs, &name, &dns).await?;
            new.save(&dir)?;
            renewed(&new)?;
            anyhow::Ok(new)
        }
        .await;
        match result {
            Ok(new) => tracing::info!(
                until = %sallyport_core::rfc3339(new.joined.not_after),
                "the proxy's certificates were renewed"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the proxy's certificates were not renewed; trying again in a minute");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
}
