//! The proxy's client for the auth API: HTTPS with mutual TLS, trusting only the cluster's host
//! CA, redirects off.

use std::time::Duration;

use sallyport_core::api::ErrorBody;
use sallyport_core::tls::{Trust, client_config, private_key_from_pem};
use sallyport_core::x509::pem_to_ders;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ServiceIdentity;

#[derive(Clone)]
pub struct AuthClient {
    http: reqwest::Client,
    base: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the auth client: {0}")]
    Setup(String),
    #[error("auth service unreachable at {addr}: {source}")]
    Unreachable {
        addr: String,
        source: reqwest::Error,
    },
    /// Auth answered with an error meant for the user.
    #[error("{message}")]
    Refused { status: u16, message: String },
}

impl AuthClient {
    pub fn new(auth_addr: &str, id: &ServiceIdentity) -> Result<Self, ClientError> {
        let setup = |e: &dyn std::fmt::Display| ClientError::Setup(e.to_string());
        let roots = pem_to_ders(&id.host_ca_pem).map_err(|e| setup(&e))?;
        let chain = pem_to_ders(&id.chain_pem).map_err(|e| setup(&e))?;
        let key = private_key_from_pem(&id.key_pem).map_err(|e| setup(&e))?;
        let tls = client_config(Trust::Roots(roots), Some((chain, key))).map_err(|e| setup(&e))?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| setup(&e))?;
        Ok(AuthClient {
            http,
            base: format!("https://{auth_addr}"),
        })
    }

    /// Sends a JSON request and returns the status and body as they came.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                addr: self.base.clone(),
                source,
            })?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|source| ClientError::Unreachable {
                addr: self.base.clone(),
                source,
            })?;
        Ok((status, body.to_vec()))
    }

    /// A typed call; an error status becomes [`ClientError::Refused`] with auth's message.
    pub async fn json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let body = body
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| ClientError::Setup(e.to_string()))?;
        let (status, bytes) = self.call(method, path, body).await?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|b| b.error)
                .unwrap_or_else(|_| format!("auth answered {status}"));
            return Err(ClientError::Refused { status, message });
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Setup(format!("unreadable answer from auth: {e}")))
    }
}
