//! JSON over HTTPS to the proxy (3080) or to auth (3025), with errors a person can act on.

use std::time::Duration;

use anyhow::{Result, anyhow};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sallyport_core::api::ErrorBody;
use sallyport_core::tls::{Trust, client_config};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub struct Api {
    http: reqwest::Client,
    base: String,
    /// What to call the other side in errors: "the proxy at 127.0.0.1:3080".
    what: String,
}

impl Api {
    pub fn new(
        addr: &str,
        what: &str,
        trust: Trust,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
        alpn: Option<&[u8]>,
    ) -> Result<Self> {
        let mut tls = client_config(trust, identity)?;
        if let Some(a) = alpn {
            // Only HTTP/1.1 runs inside the passthrough; the ALPN picks the route.
            tls.alpn_protocols = vec![a.to_vec()];
        }
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()?;
        let addr = &crate::profile::reachable(addr);
        let base = format!("https://{addr}");
        Ok(Api {
            http,
            base,
            what: format!("{what} at {addr}"),
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// As [`Api::get`], with the value of the response header `header` if it was sent.
    pub async fn get_with_header<T: DeserializeOwned>(
        &self,
        path: &str,
        header: &str,
    ) -> Result<(T, Option<String>)> {
        self.send_keeping(self.http.get(format!("{}{path}", self.base)), header)
            .await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        self.send(self.http.put(format!("{}{path}", self.base)).json(body))
            .await
    }

    /// A body that is not JSON (a recording), read as it arrives rather than held whole: a
    /// recording may be as large as the proxy's `max_recording_size` (a GiB by default).
    pub async fn get_body(&self, path: &str) -> Result<Body> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            // Read while a replay plays it: no limit on the whole, one on each read (`Body`).
            .timeout(Duration::from_secs(7 * 86400))
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp.bytes().await.map_err(|e| self.transport_error(e))?;
            let msg = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|b| b.error)
                .unwrap_or_else(|_| format!("{} answered {status}", self.what));
            return Err(anyhow!(msg));
        }
        Ok(Body {
            resp,
            what: self.what.clone(),
            pending: Vec::new(),
            start: 0,
            done: false,
        })
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T> {
        Ok(self.send_keeping(req, "").await?.0)
    }

    /// Sends `req`; returns the answer and the value of its header `header` ("": none).
    async fn send_keeping<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        header: &str,
    ) -> Result<(T, Option<String>)> {
        let resp = req.send().await.map_err(|e| self.transport_error(e))?;
        let kept = (!header.is_empty())
            .then(|| resp.headers().get(header))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.transport_error(e))?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|b| b.error)
                .unwrap_or_else(|_| format!("{} answered {status}", self.what));
            return Err(anyhow!(msg));
        }
        let answer = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow!("{} sent an unreadable answer: {e}", self.what))?;
        Ok((answer, kept))
    }

    fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        // The interesting cause (a refused connection, a pin mismatch) is at the bottom.
        let mut cause: &dyn std::error::Error = &e;
        while let Some(next) = cause.source() {
            cause = next;
        }
        let text = cause.to_string();
        if text.contains("--ca-pin")
            || text.contains("certificate")
            || text.contains("UnknownIssuer")
        {
            anyhow!("cannot trust {}: {text}", self.what)
        } else if e.is_timeout() {
            anyhow!("{} did not answer in time", self.what)
        } else {
            anyhow!("cannot reach {}: {text}", self.what)
        }
    }
}

/// The auth API as the logged-in user, through the proxy's passthrough (mutual TLS end to end).
pub fn user_api(p: &crate::profile::Profile) -> Result<Api> {
    if p.expires().is_some_and(|e| e <= sallyport_core::unix_now()) {
        return Err(anyhow!(
            "your certificates expired at {}; run `sally login --proxy {} --user {}`",
            p.valid_until,
            p.proxy,
            p.user
        ));
    }
    let paths = p.paths();
    let cert = std::fs::read_to_string(&paths.tls_cert)
        .map_err(|e| anyhow!("cannot read {}: {e}", paths.tls_cert.display()))?;
    let key = std::fs::read_to_string(&paths.tls_key)
        .map_err(|e| anyhow!("cannot read {}: {e}", paths.tls_key.display()))?;
    let identity = (
        sallyport_core::x509::pem_to_ders(&cert)?,
        sallyport_core::tls::private_key_from_pem(&key)?,
    );
    let roots = sallyport_core::x509::pem_to_ders(&p.tls_host_ca_pem)?;
    // Through the passthrough it is auth's certificate that answers, whichever proxy is
    // dialed: it is checked against auth's own name.
    Api::new(
        &p.proxy,
        "the auth service via the proxy",
        Trust::As(
            Box::new(Trust::Roots(roots)),
            sallyport_core::api::AUTH_SERVER_NAME.into(),
        ),
        Some(identity),
        Some(sallyport_core::api::AUTH_ALPN),
    )
}

/// The proxy's web API, trusting the CA saved at login.
pub fn proxy_api(p: &crate::profile::Profile) -> Result<Api> {
    let roots = sallyport_core::x509::pem_to_ders(&p.tls_host_ca_pem)?;
    Api::new(&p.proxy, "the proxy", Trust::Roots(roots), None, None)
}

/// A response body read as it arrives: in chunks, or a line at a time.
pub struct Body {
    resp: reqwest::Response,
    what: String,
    /// Bytes read and not yet handed out: `pending[start..]`.
    pending: Vec<u8>,
    start: usize,
    done: bool,
}

/// How long one read of a body may wait for the server.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest line [`Body::line`] hands out: an asciicast event is at most one SSH packet,
/// escaped (a few hundred KiB); anything far longer is not a recording.
const MAX_LINE: usize = 16 << 20;

impl Body {
    async fn read(&mut self) -> Result<Option<bytes::Bytes>> {
        if self.done {
            return Ok(None);
        }
        let next = tokio::time::timeout(BODY_READ_TIMEOUT, self.resp.chunk())
            .await
            .map_err(|_| anyhow!("{} stopped sending", self.what))?
            .map_err(|e| anyhow!("reading from {}: {e}", self.what))?;
        self.done = next.is_none();
        Ok(next)
    }

    /// The next chunk as the server sent it, or `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<bytes::Bytes>> {
        if self.start < self.pending.len() {
            let rest = self.pending.split_off(self.start);
            (self.pending, self.start) = (Vec::new(), 0);
            return Ok(Some(rest.into()));
        }
        self.read().await
    }

    /// The next line (without its newline, invalid UTF-8 replaced), or `None` at the end.
    pub async fn line(&mut self) -> Result<Option<String>> {
        let mut scanned = self.start;
        loop {
            if let Some(i) = self.pending[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + i;
                let line = String::from_utf8_lossy(&self.pending[self.start..end]).into_owned();
                self.start = end + 1;
                return Ok(Some(line));
            }
            scanned = self.pending.len();
            if scanned - self.start > MAX_LINE {
                return Err(anyhow!("{} sent a line longer than 16 MiB", self.what));
            }
            // Consumed lines are dropped before reading more, so memory stays one line and
            // one chunk.
            self.pending.drain(..self.start);
            scanned -= self.start;
            self.start = 0;
            match self.read().await? {
                Some(c) => self.pending.extend_from_slice(&c),
                None if self.pending.is_empty() => return Ok(None),
                None => {
                    let line = String::from_utf8_lossy(&self.pending).into_owned();
                    self.pending.clear();
                    return Ok(Some(line));
                }
            }
        }
    }
}
