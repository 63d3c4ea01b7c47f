//! Joining: the agent makes its own TLS and SSH host keys, presents the one-time token to the
//! proxy's web API, and keeps the certificates auth returns. Private keys never leave it.
//! A kube agent joins the same way with a kube token (its SSH host key unused); the token's
//! kind, not the request, decides what auth registers, so the certificate's organization
//! (`node` or `kube`) is checked against what the agent is.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use rcgen::{KeyPair, PublicKeyData};
use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_core::api::{ErrorBody, JoinRequest, Joined, TokenKind};
use sallyport_core::routes;
use sallyport_core::tls::{Trust, client_config};

use crate::{AgentError, AgentIdentity};

pub struct JoinParams {
    pub proxy: String,
    pub token: String,
    /// What joins: a node agent (`Node`) or a kube agent (`Kube`).
    pub kind: TokenKind,
    /// The node's name, or for a kube agent the Kubernetes cluster's.
    pub nodename: String,
    pub labels: BTreeMap<String, String>,
    pub trust: Trust,
}

fn err(e: impl std::fmt::Display) -> AgentError {
    AgentError::Join(e.to_string())
}

/// The tunnel address the proxy's web API advertises, with the host the agent already uses.
pub async fn tunnel_addr(http: &reqwest::Client, proxy: &str) -> Result<String, AgentError> {
    let ping: serde_json::Value = http
        .get(format!("https://{proxy}{}", routes::web::PING))
        .send()
        .await
        .map_err(|e| {
            AgentError::Join(format!(
                "cannot reach the proxy at {proxy}: {}",
                root_cause(&e)
            ))
        })?
        .json()
        .await
        .map_err(err)?;
    let port = ping["tunnel_port"]
        .as_u64()
        .ok_or_else(|| err("the proxy does not serve tunnels"))?;
    let host = proxy.rsplit_once(':').map_or(proxy, |(h, _)| h);
    Ok(format!("{host}:{port}"))
}

pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

pub fn http_client(trust: Trust) -> Result<reqwest::Client, AgentError> {
    let tls = client_config(trust, None).map_err(err)?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(err)
}

/// The organization auth puts in the tunnel certificate of each kind of agent.
fn organization(kind: TokenKind) -> &'static str {
    match kind {
        TokenKind::Kube => "kube",
        _ => "node",
    }
}

/// A token of the other kind registers the other kind of agent: say so rather than keep a
/// certificate the proxy would serve as something this agent is not.
fn check_kind(tls_cert_pem: &str, p: &JoinParams) -> Result<(), AgentError> {
    let der = sallyport_core::x509::pem_to_der(tls_cert_pem).map_err(err)?;
    let subject = sallyport_core::x509::parse_subject(&der).map_err(err)?;
    if subject
        .organizations
        .iter()
        .any(|o| o == organization(p.kind))
    {
        return Ok(());
    }
    let (got, agent) = match p.kind {
        TokenKind::Kube => ("node", "a kube agent"),
        _ => ("kube", "a node agent"),
    };
    Err(AgentError::Join(format!(
        "joining failed: the token was a {got} token, so auth registered {} as a {got}, not as {agent}; remove that registration and join with a token from `sallyctl tokens add --type={}`",
        p.nodename,
        p.kind.as_str()
    )))
}

pub async fn join(p: &JoinParams) -> Result<AgentIdentity, AgentError> {
    let http = http_client(p.trust.clone())?;
    let tunnel_addr = tunnel_addr(&http, &p.proxy).await?;
    let tls_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(err)?;
    let host_key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).map_err(err)?;
    let req = JoinRequest {
        token: p.token.clone(),
        nodename: p.nodename.clone(),
        labels: p.labels.clone(),
        tls_spki: base64::engine::general_purpose::STANDARD
            .encode(tls_key.subject_public_key_info()),
        ssh_host_key: host_key.public_key().to_openssh().map_err(err)?,
        remote_addr: None,
    };
    let resp = http
        .post(format!("https://{}{}", p.proxy, routes::web::JOIN))
        .json(&req)
        .send()
        .await
        .map_err(|e| {
            AgentError::Join(format!(
                "cannot reach the proxy at {}: {}",
                p.proxy,
                root_cause(&e)
            ))
        })?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(err)?;
    if !status.is_success() {
        let mut msg = serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|b| b.error)
            .unwrap_or_else(|_| status.to_string());
        let wanted = format!("--type={}", p.kind.as_str());
        if status == reqwest::StatusCode::UNAUTHORIZED && !msg.contains(&wanted) {
            msg.push_str(&format!(
                "; this agent joins with a token from `sallyctl tokens add {wanted}`"
            ));
        }
        return Err(AgentError::Join(format!("joining failed: {msg}")));
    }
    let joined: Joined = serde_json::from_slice(&bytes).map_err(err)?;
    check_kind(&joined.tls_cert_pem, p)?;
    Ok(AgentIdentity {
        node_id: joined.node_id,
        nodename: p.nodename.clone(),
        cluster_name: joined.cluster_name,
        proxy: p.proxy.clone(),
        tunnel_addr,
        tls_key_pem: tls_key.serialize_pem(),
        tls_cert_pem: joined.tls_cert_pem,
        host_ca_pem: joined.host_ca_pem,
        ssh_host_key: host_key
            .to_openssh(LineEnding::LF)
            .map_err(err)?
            .to_string(),
        ssh_host_cert: joined.ssh_host_cert,
        user_ca_keys: joined.user_ca_keys,
    })
}
