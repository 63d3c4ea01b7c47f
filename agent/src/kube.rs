//! The kube agent's forwarder: every stream the proxy opens in a kube agent's tunnel carries
//! HTTP/1.1 (the proxy is the client, keep-alive allowed), and each request goes on to the
//! Kubernetes API server with the agent's own credentials, over a pool of kept-alive HTTPS
//! connections (a TLS handshake per request would cost `kubectl exec` more than the proxy may).
//!
//! 1. [`KubeUpstream`]: where the API server is and how the agent proves itself to it, from a
//!    kubeconfig's current context or, without one, the pod's service account (as client-go's
//!    `rest.InClusterConfig()`, the token re-read as the kubelet rotates it).
//! 2. [`KubeServer::serve`]: one tunnel stream, served with hyper. A request is forwarded only
//!    with the proxy's `Impersonate-User` (and its `Impersonate-Group`s, exactly as sent); the
//!    caller's `Authorization` never goes on, the agent's own credentials do.
//! 3. Bodies stream both ways and are never buffered whole (watches do not end, `kubectl cp`
//!    uploads are large); an upgrade (WebSocket, SPDY/3.1) that the API server accepts becomes a
//!    byte pipe, one it refuses is answered as the API server answered (kubectl falls back from
//!    WebSocket to SPDY on it).
//!
//! Architecture invariant: the agent never sends a request as itself. What the API server
//! authorizes is the principal the proxy chose (`Impersonate-User`), which the agent's own
//! account may only impersonate; a request without one is refused here (403) and never leaves
//! the agent.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::tunnel::{StreamServer, TunnelStream};

/// Where a pod's service account is mounted (client-go's `rest.InClusterConfig()`).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Names another directory than [`SERVICE_ACCOUNT_DIR`] (a token projected elsewhere; tests,
/// which cannot write the real one).
pub const SERVICE_ACCOUNT_DIR_ENV: &str = "SALLYPORT_KUBE_SERVICE_ACCOUNT_DIR";

/// How long a token read from a file is used before the file is read again: client-go's
/// cached file token source re-reads at most once a minute, and the kubelet rotates projected
/// service account tokens well before they expire.
pub const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// Dialing the API server and its TLS handshake, each.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection unused this long is closed (the API server's own idle limit is longer).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// What an upgraded stream copies at once, each way: 32 MiB through `kubectl exec -i cat`
/// moves in fewer, larger writes than with tokio's 8 KiB default.
const PIPE_BUFFER: usize = 64 * 1024;

/// What the proxy (and so the person) reads when the API server cannot be reached: no address,
/// no credential; the agent's log has the rest.
pub const UNREACHABLE: &str = "the Kubernetes API server is unreachable from the kube agent";

/// A Kubernetes API server the agent cannot use, with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig is unreadable, or lacks or misstates something the agent needs.
    #[error("kubeconfig {}: {message}", file.display())]
    Kubeconfig { file: PathBuf, message: String },
    /// The pod's service account (no kubeconfig given) is missing or unusable.
    #[error("in-cluster service account: {0}")]
    InCluster(String),
}

/// The API server a kube agent forwards to, and the credentials it forwards with.
pub struct KubeUpstream {
    /// The server URL as configured, for the agent's log.
    server: String,
    /// `https://host:port`: the requests' scheme and authority (and so their `Host`).
    origin: String,
    /// The server URL's path, without a trailing `/`: forwarded paths go under it.
    prefix: String,
    /// What is dialed: the host (no brackets) and port.
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    token: Option<Token>,
}

impl std::fmt::Debug for KubeUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeUpstream")
            .field("server", &self.server)
            .field("token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl KubeUpstream {
    /// From a kubeconfig when one is given, else the pod's service account.
    pub fn load(kubeconfig: Option<&Path>) -> Result<Self, KubeError> {
        match kubeconfig {
            Some(file) => Self::from_kubeconfig(file),
            None => Self::in_cluster(),
        }
    }

    /// The API server of a kubeconfig's `current-context`, with its user's client certificate
    /// and/or token. Relative file names are relative to the kubeconfig's directory, as kubectl
    /// reads them.
    pub fn from_kubeconfig(file: &Path) -> Result<Self, KubeError> {
        let bad = |message: String| KubeError::Kubeconfig {
            file: file.to_path_buf(),
            message,
        };
        let text =
            std::fs::read_to_string(file).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let config: Kubeconfig =
            serde_saphyr::from_str(&text).map_err(|e| bad(format!("not a kubeconfig: {e}")))?;
        let base = file.parent().unwrap_or(Path::new("."));
        config.upstream(base).map_err(bad)
    }

    /// The pod's service account, found as client-go finds it: `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT`, and the CA and token under [`SERVICE_ACCOUNT_DIR`] (or
    /// [`SERVICE_ACCOUNT_DIR_ENV`]).
    pub fn in_cluster() -> Result<Self, KubeError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        match (
            var("KUBERNETES_SERVICE_HOST"),
            var("KUBERNETES_SERVICE_PORT"),
        ) {
            (Some(host), Some(port)) => {
                let dir = var(SERVICE_ACCOUNT_DIR_ENV)
                    .map_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR), PathBuf::from);
                Self::in_cluster_at(&dir, &host, &port)
            }
            _ => Err(KubeError::InCluster(
                "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set, so this is not a Kubernetes pod; give the kube agent a kubeconfig (--kubeconfig FILE or kube_service.kubeconfig_file)".into(),
            )),
        }
    }

    /// A service account mounted at `dir` (`ca.crt`, `token`) for the API server at
    /// `host:port`: [`KubeUpstream::in_cluster`] with its places given.
    pub fn in_cluster_at(dir: &Path, host: &str, port: &str) -> Result<Self, KubeError> {
        let bad = KubeError::InCluster;
        let port: u16 = port
            .parse()
            .map_err(|_| bad(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port")))?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let ca_file = dir.join("ca.crt");
        let ca = std::fs::read(&ca_file)
            .map_err(|e| bad(format!("cannot read {}: {e}", ca_file.display())))?;
        let cas = certificates(&ca).map_err(|e| bad(format!("{}: {e}", ca_file.display())))?;
        let token = Token::file(dir.join("token")).map_err(bad)?;
        Target {
            server: format!("https://{authority}"),
            tls_server_name: None,
            cas,
            identity: None,
            token: Some(token),
        }
        .upstream()
        .map_err(bad)
    }

    /// The API server's URL, for logs and the agent's start line.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// `host:port` as a request's `Host` names it.
    fn authority(&self) -> &str {
        self.origin.strip_prefix("https://").unwrap_or(&self.origin)
    }

    /// `path_and_query` under the server URL's path, in origin form (a request on a connection
    /// of its own rather than the pool's).
    fn path(&self, path_and_query: &str) -> Result<Uri, hyper::http::Error> {
        Ok(Uri::try_from(format!("{}{}", self.prefix, path_and_query))?)
    }

    /// The URI a forwarded request's path and query go to.
    fn uri(&self, path_and_query: &str) -> Result<Uri, hyper::http::Error> {
        Ok(Uri::try_from(format!(
            "{}{}{}",
            self.origin, self.prefix, path_and_query
        ))?)
    }
}

/// The parts of a kubeconfig the agent reads; anything else in it is left alone, as kubectl
/// leaves what it does not know.
#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(rename = "current-context", default)]
    current_context: String,
    #[serde(default)]
    clusters: Vec<NamedCluster>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct NamedCluster {
    name: String,
    #[serde(default)]
    cluster: Option<Cluster>,
}

#[derive(Deserialize)]
struct Cluster {
    #[serde(default)]
    server: String,
    #[serde(rename = "certificate-authority", default)]
    certificate_authority: Option<String>,
    #[serde(rename = "certificate-authority-data", default)]
    certificate_authority_data: Option<String>,
    #[serde(rename = "insecure-skip-tls-verify", default)]
    insecure_skip_tls_verify: bool,
    #[serde(rename = "tls-server-name", default)]
    tls_server_name: Option<String>,
    #[serde(rename = "proxy-url", default)]
    proxy_url: Option<String>,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    #[serde(default)]
    context: Option<ContextEntry>,
}

#[derive(Deserialize)]
struct ContextEntry {
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    user: String,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: Option<User>,
}

#[derive(Deserialize)]
struct User {
    #[serde(rename = "client-certificate", default)]
    client_certificate: Option<String>,
    #[serde(rename = "client-certificate-data", default)]
    client_certificate_data: Option<String>,
    #[serde(rename = "client-key", default)]
    client_key: Option<String>,
    #[serde(rename = "client-key-data", default)]
    client_key_data: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(rename = "tokenFile", default)]
    token_file: Option<String>,
    // What the agent cannot do with a user: present only to say so.
    #[serde(default)]
    exec: Option<serde::de::IgnoredAny>,
    #[serde(rename = "auth-provider", default)]
    auth_provider: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    username: Option<String>,
    #[serde(rename = "as", default)]
    act_as: Option<String>,
}

impl Kubeconfig {
    fn upstream(self, base: &Path) -> Result<KubeUpstream, String> {
        let name = self.current_context.as_str();
        if name.is_empty() {
            return Err(
                "it has no current-context; choose one with `kubectl config use-context NAME --kubeconfig FILE`".into(),
            );
        }
        let context = self
            .contexts
            .into_iter()
            .find(|c| c.name == name)
            .ok_or_else(|| format!("current-context {name:?} is not among its contexts"))?
            .context
            .ok_or_else(|| format!("context {name:?} is empty"))?;
        if context.cluster.is_empty() {
            return Err(format!("context {name:?} names no cluster"));
        }
        let cluster_name = context.cluster.as_str();
        let cluster = self
            .clusters
            .into_iter()
            .find(|c| c.name == cluster_name)
            .ok_or_else(|| {
                format!("cluster {cluster_name:?} (of context {name:?}) is not among its clusters")
            })?
            .cluster
            .ok_or_else(|| format!("cluster {cluster_name:?} is empty"))?;
        let at = |field: &str| format!("clusters[{cluster_name}].cluster.{field}");
        if cluster.server.is_empty() {
            return Err(format!("{} is missing", at("server")));
        }
        if cluster.insecure_skip_tls_verify {
            return Err(format!(
                "{} is true: the kube agent always verifies the API server; give certificate-authority or certificate-authority-data instead",
                at("insecure-skip-tls-verify")
            ));
        }
        if cluster.proxy_url.is_some() {
            return Err(format!(
                "{} is not supported: the kube agent dials the API server directly",
                at("proxy-url")
            ));
        }
        let ca = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            (Some(data), _) => {
                decode(data).map_err(|e| format!("{}: {e}", at("certificate-authority-data")))?
            }
            (None, Some(f)) => read_relative(base, f)
                .map_err(|e| format!("{}: {e}", at("certificate-authority")))?,
            (None, None) => {
                return Err(format!(
                    "clusters[{cluster_name}].cluster has neither certificate-authority nor certificate-authority-data: the kube agent needs the API server's CA"
                ));
            }
        };
        let cas =
            certificates(&ca).map_err(|e| format!("the CA of cluster {cluster_name:?}: {e}"))?;

        // A context without a user is kubectl's anonymous access, which the agent never uses.
        let user_name = context.user.as_str();
        if user_name.is_empty() {
            return Err(format!(
                "context {name:?} names no user: the kube agent needs credentials"
            ));
        }
        let user = self
            .users
            .into_iter()
            .find(|u| u.name == user_name)
            .ok_or_else(|| {
                format!("user {user_name:?} (of context {name:?}) is not among its users")
            })?
            .user
            .ok_or_else(|| format!("user {user_name:?} is empty"))?;
        let at = |field: &str| format!("users[{user_name}].user.{field}");
        for (present, field, why) in [
            (
                user.exec.is_some(),
                "exec",
                "credential plugins are not supported",
            ),
            (
                user.auth_provider.is_some(),
                "auth-provider",
                "auth providers are not supported",
            ),
            (
                user.username.is_some(),
                "username",
                "basic authentication is not supported",
            ),
            (
                user.act_as.is_some(),
                "as",
                "the proxy chooses whom each request impersonates",
            ),
        ] {
            if present {
                return Err(format!(
                    "{}: {why}; give the kube agent a client certificate or a token",
                    at(field)
                ));
            }
        }
        let cert = match (&user.client_certificate_data, &user.client_certificate) {
            (Some(data), _) => {
                Some(decode(data).map_err(|e| format!("{}: {e}", at("client-certificate-data")))?)
            }
            (None, Some(f)) => Some(
                read_relative(base, f).map_err(|e| format!("{}: {e}", at("client-certificate")))?,
            ),
            (None, None) => None,
        };
        let key = match (&user.client_key_data, &user.client_key) {
            (Some(data), _) => {
                Some(decode(data).map_err(|e| format!("{}: {e}", at("client-key-data")))?)
            }
            (None, Some(f)) => {
                Some(read_relative(base, f).map_err(|e| format!("{}: {e}", at("client-key")))?)
            }
            (None, None) => None,
        };
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => {
                let chain = certificates(&cert)
                    .map_err(|e| format!("the client certificate of user {user_name:?}: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                    format!("the client key of user {user_name:?} is not a PEM private key (RSA, ECDSA or Ed25519): {e}")
                })?;
                Some((chain, key))
            }
            (Some(_), None) => {
                return Err(format!(
                    "{} is missing (the client certificate needs its key)",
                    at("client-key")
                ));
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{} is missing (the client key needs its certificate)",
                    at("client-certificate")
                ));
            }
            (None, None) => None,
        };
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) => Some(Token::fixed(t).map_err(|e| format!("{}: {e}", at("token")))?),
            (None, Some(f)) => {
                Some(Token::file(base.join(f)).map_err(|e| format!("{}: {e}", at("tokenFile")))?)
            }
            (None, None) => None,
        };
        if identity.is_none() && token.is_none() {
            return Err(format!(
                "user {user_name:?} has no client certificate and no token: the kube agent needs one"
            ));
        }
        Target {
            server: cluster.server,
            tls_server_name: cluster.tls_server_name,
            cas,
            identity,
            token,
        }
        .upstream()
    }
}

/// base64 as kubeconfigs hold it (`*-data`), whitespace allowed.
fn decode(data: &str) -> Result<Vec<u8>, String> {
    let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("not base64: {e}"))
}

fn read_relative(base: &Path, file: &str) -> Result<Vec<u8>, String> {
    let path = base.join(file);
    std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in it".into());
    }
    Ok(certs)
}

/// Everything the agent needs, gathered from a kubeconfig or a service account.
struct Target {
    server: String,
    tls_server_name: Option<String>,
    cas: Vec<CertificateDer<'static>>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    token: Option<Token>,
}

impl Target {
    fn upstream(self) -> Result<KubeUpstream, String> {
        let server = self.server;
        let uri: Uri = server
            .parse()
            .map_err(|e| format!("server {server:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!(
                "server {server:?}: the kube agent speaks only HTTPS to the API server"
            ));
        }
        let (Some(authority), Some(host)) = (uri.authority(), uri.host()) else {
            return Err(format!("server {server:?} has no host"));
        };
        if uri.query().is_some() {
            return Err(format!(
                "server {server:?} has a query, which a server URL may not"
            ));
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let name = self.tls_server_name.clone().unwrap_or_else(|| host.clone());
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| format!("{name:?} is not a TLS server name: {e}"))?;
        let mut tls = sallyport_core::tls::client_config(
            sallyport_core::tls::Trust::Roots(self.cas),
            self.identity,
        )
        .map_err(|e| format!("the CA or the client certificate cannot be used: {e}"))?;
        // The pool speaks HTTP/1.1 (upgrades need it); an API server offered h2 would take it.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeUpstream {
            origin: format!("https://{authority}"),
            prefix: uri.path().trim_end_matches('/').to_string(),
            server,
            host,
            port,
            server_name,
            tls: Arc::new(tls),
            token: self.token,
        })
    }
}

/// A bearer token: written in the kubeconfig, or read from a file (`tokenFile`, the service
/// account's) again once [`TOKEN_REREAD`] has passed, so a rotated token is picked up.
enum Token {
    Fixed(HeaderValue),
    File {
        path: PathBuf,
        /// The last value read and when.
        current: Mutex<(HeaderValue, Instant)>,
    },
}

impl Token {
    fn fixed(token: &str) -> Result<Self, String> {
        bearer(token).map(Token::Fixed)
    }

    /// Reads the file once now, so a missing or empty one stops the agent at start.
    fn file(path: PathBuf) -> Result<Self, String> {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        let value = bearer(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Token::File {
            path,
            current: Mutex::new((value, Instant::now())),
        })
    }

    /// The `Authorization` value to send now.
    async fn header(&self) -> Option<HeaderValue> {
        let (path, current) = match self {
            Token::Fixed(v) => return Some(v.clone()),
            Token::File { path, current } => (path, current),
        };
        let (value, read_at) = current.lock().ok()?.clone();
        if read_at.elapsed() < TOKEN_REREAD {
            return Some(value);
        }
        let fresh = match tokio::fs::read_to_string(path).await {
            Ok(text) => bearer(&text),
            Err(e) => Err(e.to_string()),
        };
        let value = match fresh {
            Ok(v) => v,
            Err(e) => {
                // The last good token may still be valid; the file is tried again later.
                tracing::warn!(file = %path.display(), error = %e, "kube agent: token file not re-read; using the last token");
                value
            }
        };
        if let Ok(mut c) = current.lock() {
            *c = (value.clone(), Instant::now());
        }
        Some(value)
    }
}

fn bearer(token: &str) -> Result<HeaderValue, String> {
    let token = token.trim();
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    let mut v = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token has characters a header cannot carry".to_string())?;
    v.set_sensitive(true);
    Ok(v)
}

/// Dials the one API server with TLS (the kubeconfig's CA and client certificate): the pool's
/// connector. Every request goes to the same place, so the URI only names the pool's key.
#[derive(Clone)]
struct Dialer(Arc<KubeUpstream>);

impl tower::Service<Uri> for Dialer {
    type Response = TokioIo<Upstream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<Upstream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        Box::pin(dial(self.0.clone()))
    }
}

/// One TCP connection and TLS handshake with the API server, each bounded by `CONNECT_TIMEOUT`.
async fn dial(up: Arc<KubeUpstream>) -> std::io::Result<TokioIo<Upstream>> {
    let timed_out =
        |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what} timed out"));
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((up.host.as_str(), up.port)),
    )
    .await
    .map_err(|_| timed_out("connecting"))??;
    tcp.set_nodelay(true)?;
    let tls = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TlsConnector::from(up.tls.clone()).connect(up.server_name.clone(), tcp),
    )
    .await
    .map_err(|_| timed_out("the TLS handshake"))??;
    Ok(TokioIo::new(Upstream(tls)))
}

/// One TLS connection to the API server, as the pool holds it.
pub struct Upstream(TlsStream<TcpStream>);

impl Connection for Upstream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// A response to the proxy: the API server's body, streamed, or the agent's own.
pub type Body = Either<Incoming, Full<Bytes>>;

/// Serves the HTTP the proxy sends through a kube agent's tunnel; cheap to share.
pub struct KubeServer {
    upstream: Arc<KubeUpstream>,
    client: Client<Dialer, Incoming>,
    /// `kubectl exec` and `attach`: SSH sessions from the proxy (`exec`).
    exec: Option<Arc<exec::ExecServer>>,
}

impl KubeServer {
    pub fn new(upstream: KubeUpstream) -> Self {
        let upstream = Arc::new(upstream);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_timer(TokioTimer::new())
            // Header names as Go's clients write them (`Impersonate-User`), as kubectl would
            // have sent them: the API server reads them without case, its logs and tools may not.
            .http1_title_case_headers(true)
            .build(Dialer(upstream.clone()));
        KubeServer {
            upstream,
            client,
            exec: None,
        }
    }

    /// Serves exec and attach sessions too, as the agent `id` (its SSH host key and the user
    /// CAs it trusts).
    pub fn with_exec(mut self, id: &crate::AgentIdentity) -> Result<Self, crate::AgentError> {
        self.exec = Some(Arc::new(exec::ExecServer::new(id)?));
        Ok(self)
    }

    /// Serves one stream: HTTP/1.1 requests, one after another, until the proxy closes it or
    /// an upgrade turns it into a byte pipe.
    pub async fn serve<S>(self: Arc<Self>, mut stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // An SSH session (exec, attach) starts with the proxy's `SSH-` identification; HTTP
        // with a method.
        let mut first = [0u8; 4];
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncReadExt::read_exact(&mut stream, &mut first),
        )
        .await;
        if !matches!(read, Ok(Ok(_))) {
            return;
        }
        let stream = exec::Prefixed::new(first.to_vec(), stream);
        if &first == b"SSH-" {
            match self.exec.clone() {
                Some(e) => e.serve(self, stream).await,
                None => {
                    tracing::warn!("kube agent: an exec session arrived, but exec is not served")
                }
            }
            return;
        }
        let service = hyper::service::service_fn(move |req| {
            let this = self.clone();
            async move { Ok::<_, Infallible>(this.forward(req).await) }
        });
        // No header timeout: only the proxy, through the mutually authenticated tunnel, reaches
        // this server, and a kept-alive stream may well wait between requests.
        if let Err(e) = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await
        {
            tracing::debug!(error = %e, "kube agent: a stream from the proxy ended");
        }
    }

    /// One request, forwarded to the API server or refused.
    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        let upgrade = wants_upgrade(req.headers());
        strip_hop_by_hop(req.headers_mut(), upgrade);
        if let Err(why) = check_impersonation(req.headers()) {
            tracing::warn!(method = %req.method(), path = %req.uri().path(), "kube agent refused a request: {why}");
            return status_response(StatusCode::FORBIDDEN, &why);
        }
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let uri = match self.upstream.uri(&path) {
            Ok(u) => u,
            Err(e) => {
                return status_response(
                    StatusCode::BAD_REQUEST,
                    &format!("the path {path:?} cannot be forwarded: {e}"),
                );
            }
        };
        let down_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        parts.uri = uri;
        let h = &mut parts.headers;
        // Never the caller's credentials, and the Host is the API server's (the pool sets it
        // from the URI).
        h.remove(header::AUTHORIZATION);
        h.remove(header::PROXY_AUTHORIZATION);
        h.remove(header::HOST);
        // Front-proxy identity headers, which an API server with request-header authentication
        // would believe (the door removes them too).
        let front: Vec<HeaderName> = h
            .keys()
            .filter(|k| k.as_str().starts_with("x-remote-"))
            .cloned()
            .collect();
        for k in front {
            h.remove(k);
        }
        // The proxy already answered any `Expect: 100-continue`; the body follows at once.
        h.remove(header::EXPECT);
        if let Some(token) = &self.upstream.token
            && let Some(v) = token.header().await
        {
            h.insert(header::AUTHORIZATION, v);
        }
        let method = parts.method.clone();
        let mut resp = match self.client.request(Request::from_parts(parts, body)).await {
            Ok(r) => r,
            Err(e) => {
                let cause = crate::join::root_cause(&e);
                tracing::error!(server = %self.upstream.server, %method, %path, error = %cause, "kube agent: the API server is unreachable");
                return status_response(StatusCode::SERVICE_UNAVAILABLE, UNREACHABLE);
            }
        };
        if let Some(down) = down_upgrade
            && resp.status() == StatusCode::SWITCHING_PROTOCOLS
        {
            let up = hyper::upgrade::on(&mut resp);
            let (parts, _) = resp.into_parts();
            tokio::spawn(pipe(down, up, path));
            return Response::from_parts(parts, Either::Right(Full::default()));
        }
        // Refused upgrades too go back as the API server said them: kubectl falls back from
        // WebSocket to SPDY on that answer.
        strip_hop_by_hop(resp.headers_mut(), false);
        resp.map(Either::Left)
    }
}

impl StreamServer for KubeServer {
    const KIND: sallyport_core::metrics::TunnelKind = sallyport_core::metrics::TunnelKind::Kube;

    fn serve(
        self: Arc<Self>,
        stream: TunnelStream,
        _local: Option<SocketAddr>,
    ) -> impl Future<Output = ()> + Send + 'static {
        KubeServer::serve(self, stream)
    }
}

/// Copies bytes both ways between the proxy's upgraded stream and the API server's, until both
/// directions end (an end of one is passed on as a half-close).
async fn pipe(down: hyper::upgrade::OnUpgrade, up: hyper::upgrade::OnUpgrade, path: String) {
    let (down, up) = tokio::join!(down, up);
    let (down, up) = match (down, up) {
        (Ok(d), Ok(u)) => (d, u),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(%path, error = %e, "kube agent: an upgrade did not complete");
            return;
        }
    };
    let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
    match tokio::io::copy_bidirectional_with_sizes(&mut down, &mut up, PIPE_BUFFER, PIPE_BUFFER)
        .await
    {
        Ok((sent, received)) => {
            tracing::debug!(%path, sent, received, "kube agent: an upgraded stream ended")
        }
        Err(e) => tracing::debug!(%path, error = %e, "kube agent: an upgraded stream broke"),
    }
}

/// Whether a request asks to become a WebSocket or SPDY/3.1 stream (exec, attach,
/// port-forward): `Connection: Upgrade` and one of those in `Upgrade`.
fn wants_upgrade(h: &HeaderMap) -> bool {
    let connection_upgrade = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let protocol = h
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            let p = p.trim();
            p.eq_ignore_ascii_case("websocket") || p.eq_ignore_ascii_case("SPDY/3.1")
        });
    connection_upgrade && protocol
}

/// Removes what belongs to one hop (RFC 9110 §7.6.1): the headers `Connection` names, and the
/// standard ones. An upgrade keeps `Upgrade`, with `Connection: Upgrade` only.
fn strip_hop_by_hop(h: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(upgrade && name == header::UPGRADE) {
            h.remove(name);
        }
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        if !(upgrade && name == header::UPGRADE) {
            h.remove(name);
        }
    }
    if upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
}

/// The proxy's impersonation, which the agent requires: one non-empty `Impersonate-User`, and
/// nothing the proxy never sends (`Impersonate-Uid`, `Impersonate-Extra-*`).
fn check_impersonation(h: &HeaderMap) -> Result<(), String> {
    for name in h.keys() {
        let n = name.as_str();
        if n == "impersonate-uid" || n.starts_with("impersonate-extra-") {
            return Err(format!(
                "the kube agent does not forward {n}: the proxy never sends it"
            ));
        }
    }
    let users: Vec<&HeaderValue> = h
        .get_all("impersonate-user")
        .iter()
        .filter(|v| !v.is_empty())
        .collect();
    match users.len() {
        1 => Ok(()),
        0 => Err(
            "the kube agent forwards only requests the proxy impersonates, and this one has no Impersonate-User"
                .into(),
        ),
        _ => Err("the kube agent forwards one Impersonate-User, not several".into()),
    }
}

/// An answer of the agent's own: a `metav1.Status`, which kubectl prints.
fn status_response(code: StatusCode, message: &str) -> Response<Body> {
    let status = sallyport_core::kube::status(
        code.as_u16(),
        sallyport_core::kube::reason_for(code.as_u16()),
        message,
    );
    let body = serde_json::to_vec(&status).unwrap_or_default();
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub mod exec;
pub mod spdy;

#[cfg(test)]
mod tests;
