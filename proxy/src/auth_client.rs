//! The proxy's client for the auth API: HTTPS with mutual TLS, trusting only the cluster's host
//! CA, redirects off. In the all-in-one, where auth runs in the same process, whole requests
//! skip the network ([`AuthClient::in_process`]): the same request goes to auth's router with
//! the proxy's certificate chain as the TLS handshake would have presented it, so auth decides
//! exactly as it does over HTTPS, minus the TLS, TCP and HTTP framing. Failed authentications
//! at the proxy's doors go to auth through a bounded queue ([`AuthClient::report_failure`]), so
//! a door never waits on the audit of a refusal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sallyport_core::api::{AuthFailure, ErrorBody, RefusalCode};
use sallyport_core::https::{PeerCertificates, RemoteAddr};
use sallyport_core::metrics::{AuditQueue, RouteLabel, StatusClass, metrics};
use sallyport_core::routes;
use sallyport_core::tls::{Trust, client_config, private_key_from_pem};
use sallyport_core::x509::pem_to_ders;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ServiceIdentity;

/// HTTPS clients over one certificate: for whole requests, and for answers read as they arrive;
/// and auth in this process, if it is, called as that certificate.
struct Clients {
    http: reqwest::Client,
    streaming: reqwest::Client,
    local: Option<InProcess>,
}

impl Clients {
    fn new(host_ca_pem: &str, chain_pem: &str, key_pem: &str) -> Result<Self, ClientError> {
        Ok(Clients {
            http: mtls_client(host_ca_pem, chain_pem, key_pem, Timeouts::Whole)?,
            streaming: mtls_client(host_ca_pem, chain_pem, key_pem, Timeouts::Stream)?,
            local: None,
        })
    }
}

/// Auth's API in this process: its router, and the certificate chain a request to it comes
/// with (the proxy's own, as its TLS handshake would have presented it: auth verifies it and
/// decides by it exactly as for a request that came over the network).
#[derive(Clone)]
struct InProcess {
    router: axum::Router,
    peer: PeerCertificates,
    /// Requests in flight at most ([`IN_FLIGHT`]), as one HTTP/2 connection to auth would
    /// carry: a stalled database holds callers back here rather than piling up handlers.
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Whole requests to auth in this process in flight at once (hyper's default for the streams
/// of one HTTP/2 connection).
const IN_FLIGHT: usize = 200;

impl InProcess {
    fn new(
        router: axum::Router,
        chain_pem: &str,
        in_flight: Arc<tokio::sync::Semaphore>,
    ) -> Result<Self, ClientError> {
        let chain = pem_to_ders(chain_pem).map_err(|e| ClientError::Setup(e.to_string()))?;
        Ok(InProcess {
            router,
            peer: PeerCertificates(Arc::new(chain)),
            in_flight,
        })
    }

    /// One whole request, answered within the HTTPS client's bound ([`WHOLE_TIMEOUT`]). It runs
    /// on a task of its own, as it would on auth's side of a connection: a caller that gives up
    /// does not cut auth's handler short halfway through its writes.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), ClientError> {
        use tower::ServiceExt;
        let setup = |e: &dyn std::fmt::Display| ClientError::Setup(e.to_string());
        let mut req = axum::http::Request::builder().method(method).uri(path);
        let bytes = match body {
            Some(b) => {
                req = req.header(
                    axum::http::header::CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("application/json"),
                );
                serde_json::to_vec(b).map_err(|e| setup(&e))?
            }
            None => Vec::new(),
        };
        let mut req = req
            .body(axum::body::Body::from(bytes))
            .map_err(|e| setup(&e))?;
        req.extensions_mut().insert(self.peer.clone());
        req.extensions_mut()
            .insert(RemoteAddr(std::net::SocketAddr::from(([127, 0, 0, 1], 0))));
        let (router, in_flight) = (self.router.clone(), self.in_flight.clone());
        let answered = async move {
            let place = in_flight.acquire_owned().await.map_err(|e| e.to_string());
            tokio::spawn(async move {
                let _place = place?;
                let resp = router.oneshot(req).await.map_err(|e| e.to_string())?;
                let (parts, body) = resp.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((parts.status.as_u16(), parts.headers, body.to_vec()))
            })
            .await
        };
        match tokio::time::timeout(WHOLE_TIMEOUT, answered).await {
            Ok(Ok(Ok(answer))) => Ok(answer),
            Ok(Ok(Err(e))) => Err(ClientError::Local(format!("auth failed to answer: {e}"))),
            Ok(Err(e)) => Err(ClientError::Local(format!("auth failed to answer: {e}"))),
            Err(_) => Err(ClientError::Local(format!(
                "auth did not answer within {} s",
                WHOLE_TIMEOUT.as_secs()
            ))),
        }
    }
}

#[derive(Clone)]
pub struct AuthClient {
    /// The whole-request and the streaming clients, made over the service's certificate;
    /// replaced (with new connection pools) when it is renewed ([`AuthClient::renewed`]).
    clients: Arc<std::sync::RwLock<Clients>>,
    /// For answers read as they arrive ([`AuthClient::stream`]): no whole-request timeout.
    /// Auth's addresses (`https://HOST:PORT`): the one that answered last is tried first, the
    /// others when it cannot be reached (auth instances share one database, so any will do).
    bases: Arc<Bases>,
    /// The host CA auth's certificate must come from, for clients made as someone else
    /// ([`AuthClient::as_identity`]).
    host_ca_pem: Arc<String>,
    failures: Arc<FailureQueue>,
}

/// Failures waiting to be reported; when full, new ones are dropped and counted per door (a
/// flood must not stall a handshake), and the counts are reported to auth with the next batch
/// as failures of their own, so the audit log says how many went unrecorded.
#[derive(Default)]
struct FailureQueue {
    tx: OnceLock<tokio::sync::mpsc::Sender<AuthFailure>>,
    /// Dropped at the `ssh` door and at the `tunnel` door.
    dropped: [AtomicU64; 2],
}

const DOORS: [&str; 2] = ["ssh", "tunnel"];

impl FailureQueue {
    fn count_dropped(&self, door: &str) {
        let i = usize::from(door == DOORS[1]);
        self.dropped[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A report per door of the failures dropped since the last call (auth's reason
    /// `AUTH_FAILURES_DROPPED`, with their `count`).
    fn take_dropped(&self) -> Vec<AuthFailure> {
        DOORS
            .iter()
            .zip(&self.dropped)
            .filter_map(|(door, n)| {
                let n = n.swap(0, Ordering::Relaxed);
                (n > 0).then(|| AuthFailure {
                    door: door.to_string(),
                    // From many addresses, none recorded.
                    remote_addr: "*".into(),
                    reason: sallyport_core::api::AUTH_FAILURES_DROPPED.into(),
                    user: None,
                    presented: Default::default(),
                    count: Some(n),
                })
            })
            .collect()
    }
}

/// Failures queued before new ones are dropped, and sent in one report.
const FAILURE_QUEUE: usize = 1024;
const FAILURE_BATCH: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the auth client: {0}")]
    Setup(String),
    #[error("auth service unreachable at {addr}: {source}")]
    Unreachable {
        addr: String,
        source: reqwest::Error,
    },
    /// Auth in this process failed to answer (its handler panicked, or took longer than a
    /// request over the network may).
    #[error("{0}")]
    Local(String),
    /// Auth answered with an error meant for the user; a refusal says its kind.
    #[error("{message}")]
    Refused {
        status: u16,
        message: String,
        code: Option<RefusalCode>,
    },
}

/// Several auth instances, and which one to try first.
struct Bases {
    urls: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
}

impl Bases {
    /// Every base once, starting with the current one.
    fn order(&self) -> impl Iterator<Item = (usize, &str)> {
        let n = self.urls.len();
        let first = self.current.load(Ordering::Relaxed) % n.max(1);
        (0..n).map(move |i| {
            let k = (first + i) % n;
            (k, self.urls[k].as_str())
        })
    }
}

/// Whether a request that failed this way never reached auth (so another instance may be
/// asked the same without doing it twice).
fn not_sent(e: &reqwest::Error) -> bool {
    e.is_connect()
}

impl AuthClient {
    /// `auth_addr`: one `HOST:PORT`, or several separated by commas.
    pub fn new(auth_addr: &str, id: &ServiceIdentity) -> Result<Self, ClientError> {
        let urls: Vec<String> = auth_addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| format!("https://{a}"))
            .collect();
        if urls.is_empty() {
            return Err(ClientError::Setup("no auth address".into()));
        }
        Ok(AuthClient {
            clients: Arc::new(std::sync::RwLock::new(Clients::new(
                &id.host_ca_pem,
                &id.chain_pem,
                &id.key_pem,
            )?)),
            bases: Arc::new(Bases {
                urls,
                current: Default::default(),
            }),
            host_ca_pem: Arc::new(id.host_ca_pem.clone()),
            failures: Arc::default(),
        })
    }

    /// A client of the same auth that presents another certificate: a browser's web session
    /// calls auth as its own user certificate (`chain_pem`, over `key_pem`), so auth decides
    /// with that user's current roles and locks, from what the TLS handshake proved. Always over
    /// HTTPS, even when auth is in this process: the user's own key proves the certificate.
    pub fn as_identity(&self, chain_pem: &str, key_pem: &str) -> Result<Self, ClientError> {
        Ok(AuthClient {
            clients: Arc::new(std::sync::RwLock::new(Clients::new(
                &self.host_ca_pem,
                chain_pem,
                key_pem,
            )?)),
            bases: self.bases.clone(),
            host_ca_pem: self.host_ca_pem.clone(),
            failures: Arc::default(),
        })
    }

    /// Whole requests go to `router`, auth's API in this process, instead of over HTTPS, as
    /// `id`'s certificate: the one this client was made with (the all-in-one, whose proxy talks
    /// to no other auth). Streamed answers ([`AuthClient::stream`]) still come over HTTPS.
    pub fn in_process(
        self,
        router: axum::Router,
        id: &ServiceIdentity,
    ) -> Result<Self, ClientError> {
        let in_flight = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let local = InProcess::new(router, &id.chain_pem, in_flight)?;
        self.write_clients().local = Some(local);
        Ok(self)
    }

    /// The service's certificate was renewed: requests from now on present the new one, on new
    /// connections (auth checks a caller's certificate on every request, so connections made
    /// over the old one must not outlive it). Every clone of this client takes it.
    pub fn renewed(&self, id: &ServiceIdentity) -> Result<(), ClientError> {
        let mut next = Clients::new(&id.host_ca_pem, &id.chain_pem, &id.key_pem)?;
        next.local = self
            .local()
            .map(|l| InProcess::new(l.router, &id.chain_pem, l.in_flight))
            .transpose()?;
        *self.write_clients() = next;
        Ok(())
    }

    fn write_clients(&self) -> std::sync::RwLockWriteGuard<'_, Clients> {
        match self.clients.write() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        }
    }

    fn local(&self) -> Option<InProcess> {
        match self.clients.read() {
            Ok(c) => c.local.clone(),
            Err(p) => p.into_inner().local.clone(),
        }
    }

    fn http(&self) -> reqwest::Client {
        match self.clients.read() {
            Ok(c) => c.http.clone(),
            Err(p) => p.into_inner().http.clone(),
        }
    }

    fn streaming(&self) -> reqwest::Client {
        match self.clients.read() {
            Ok(c) => c.streaming.clone(),
            Err(p) => p.into_inner().streaming.clone(),
        }
    }

    /// Queues a failed authentication for auth to audit (`auth.fail`); never waits.
    pub fn report_failure(&self, failure: AuthFailure) {
        let tx = self.failures.tx.get_or_init(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(FAILURE_QUEUE);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(self.clone().send_failures(rx));
                }
                Err(_) => tracing::warn!("no runtime: failed authentications are not reported"),
            }
            tx
        });
        match tx.try_send(failure) {
            Ok(()) => metrics().audit_queued(AuditQueue::ProxyFailedAuth, 1),
            Err(e) => {
                let failure = match e {
                    tokio::sync::mpsc::error::TrySendError::Full(f)
                    | tokio::sync::mpsc::error::TrySendError::Closed(f) => f,
                };
                self.failures.count_dropped(&failure.door);
                metrics().audit_dropped(AuditQueue::ProxyFailedAuth);
            }
        }
    }

    /// Sends what is queued in batches, for as long as the process runs.
    async fn send_failures(self, mut rx: tokio::sync::mpsc::Receiver<AuthFailure>) {
        let mut batch = Vec::with_capacity(FAILURE_BATCH);
        while rx.recv_many(&mut batch, FAILURE_BATCH).await > 0 {
            let taken = batch.len();
            // Not queued themselves: a full queue cannot drop the count of what it dropped.
            let dropped = self.failures.take_dropped();
            if !dropped.is_empty() {
                tracing::warn!(
                    dropped = dropped.iter().filter_map(|d| d.count).sum::<u64>(),
                    "failed authentications came faster than auth took them; their count is reported instead"
                );
            }
            batch.extend(dropped);
            let body = serde_json::to_value(&batch).unwrap_or_default();
            match self
                .call(
                    reqwest::Method::POST,
                    sallyport_core::routes::auth::AUTH_FAILURES,
                    Some(body),
                )
                .await
            {
                Ok((200, _)) => {}
                Ok((status, text)) => tracing::warn!(
                    status,
                    answer = %String::from_utf8_lossy(&text),
                    "auth refused a failure report"
                ),
                Err(e) => tracing::warn!(error = %e, "failed authentications not reported"),
            }
            metrics().audit_dequeued(AuditQueue::ProxyFailedAuth, taken);
            batch.clear();
        }
    }

    /// Sends a JSON request and returns the status and body as they came.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        self.call_with_headers(method, path, body)
            .await
            .map(|(status, _, body)| (status, body))
    }

    /// A typed `GET` and the value of one header of the answer, if it has it (the audit
    /// search's `sallyport-audit-unanchored-from`).
    pub async fn get_with_header<T: DeserializeOwned>(
        &self,
        path: &str,
        header: &str,
    ) -> Result<(T, Option<String>), ClientError> {
        let (status, headers, bytes) = self
            .call_with_headers(reqwest::Method::GET, path, None)
            .await?;
        if !(200..300).contains(&status) {
            return Err(refusal(status, &bytes));
        }
        let value = headers
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Setup(format!("unreadable answer from auth: {e}")))?;
        Ok((body, value))
    }

    async fn call_with_headers(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, reqwest::header::HeaderMap, Vec<u8>), ClientError> {
        let route = RouteLabel::of(routes::AUTH, method.as_str(), path);
        if let Some(local) = self.local() {
            let started = Instant::now();
            let answer = local.call(method, path, body.as_ref()).await;
            let status = match &answer {
                Ok((status, _, _)) => StatusClass::of(*status),
                Err(_) => StatusClass::NoAnswer,
            };
            metrics().auth_client_request(route, status, started.elapsed());
            return answer;
        }
        let mut last = None;
        let mut resp = None;
        for (k, base) in self.bases.order() {
            let mut req = self.http().request(method.clone(), format!("{base}{path}"));
            if let Some(b) = &body {
                req = req.json(b);
            }
            let started = Instant::now();
            let sent = req.send().await;
            observe(route, &sent, started);
            match sent {
                Ok(r) => {
                    // An instance that answers 5xx (its database away) is asked last next time.
                    let next = if r.status().is_server_error() {
                        k + 1
                    } else {
                        k
                    };
                    self.bases.current.store(next, Ordering::Relaxed);
                    resp = Some((base, r));
                    break;
                }
                // One that does not answer in time is asked last next time too (the request may
                // have reached it, so it is not sent again).
                Err(e) if e.is_timeout() => {
                    self.bases.current.store(k + 1, Ordering::Relaxed);
                    return Err(ClientError::Unreachable {
                        addr: base.to_string(),
                        source: e,
                    });
                }
                Err(e) if not_sent(&e) => last = Some((base, e)),
                Err(source) => {
                    return Err(ClientError::Unreachable {
                        addr: base.to_string(),
                        source,
                    });
                }
            }
        }
        let (base, resp) = match (resp, last) {
            (Some(r), _) => r,
            (None, Some((base, source))) => {
                return Err(ClientError::Unreachable {
                    addr: base.to_string(),
                    source,
                });
            }
            (None, None) => return Err(ClientError::Setup("no auth address".into())),
        };
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .bytes()
            .await
            .map_err(|source| ClientError::Unreachable {
                addr: base.to_string(),
                source,
            })?;
        Ok((status, headers, body.to_vec()))
    }

    /// A `GET` whose answer is read as it arrives (a recording may be a GiB, an audit range
    /// longer than any whole-request timeout): the connection and the headers within
    /// [`HEADERS_TIMEOUT`], then each read within [`STALL_TIMEOUT`], never the whole body. An
    /// error status becomes [`ClientError::Refused`] with auth's message.
    pub async fn stream(&self, path: &str) -> Result<reqwest::Response, ClientError> {
        let timed_out = || ClientError::Refused {
            status: 504,
            message: format!(
                "auth did not answer within {} s; try again shortly",
                HEADERS_TIMEOUT.as_secs()
            ),
            code: None,
        };
        let mut last = None;
        let mut got = None;
        let route = RouteLabel::of(routes::AUTH, "GET", path);
        for (k, base) in self.bases.order() {
            let started = Instant::now();
            let send = self.streaming().get(format!("{base}{path}")).send();
            let sent = tokio::time::timeout(HEADERS_TIMEOUT, send).await;
            match &sent {
                Ok(r) => observe(route, r, started),
                Err(_) => {
                    metrics().auth_client_request(route, StatusClass::NoAnswer, started.elapsed())
                }
            }
            match sent {
                Err(_) => return Err(timed_out()),
                Ok(Ok(r)) => {
                    self.bases.current.store(k, Ordering::Relaxed);
                    got = Some(r);
                    break;
                }
                Ok(Err(e)) if not_sent(&e) => last = Some((base, e)),
                Ok(Err(source)) => {
                    return Err(ClientError::Unreachable {
                        addr: base.to_string(),
                        source,
                    });
                }
            }
        }
        let resp = match (got, last) {
            (Some(r), _) => r,
            (None, Some((base, source))) => {
                return Err(ClientError::Unreachable {
                    addr: base.to_string(),
                    source,
                });
            }
            (None, None) => return Err(ClientError::Setup("no auth address".into())),
        };
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        // An error answer is small JSON; read at most what a whole call would.
        let bytes = tokio::time::timeout(HEADERS_TIMEOUT, resp.bytes())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        Err(refusal(status, &bytes))
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
            return Err(refusal(status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Setup(format!("unreadable answer from auth: {e}")))
    }
}

/// Counts a request to auth in its route's latency, to the answer's headers.
fn observe(route: RouteLabel, resp: &Result<reqwest::Response, reqwest::Error>, started: Instant) {
    let status = match resp {
        Ok(r) => StatusClass::of(r.status().as_u16()),
        Err(_) => StatusClass::NoAnswer,
    };
    metrics().auth_client_request(route, status, started.elapsed());
}

/// Auth's error answer as a [`ClientError::Refused`].
fn refusal(status: u16, body: &[u8]) -> ClientError {
    let (message, code) = serde_json::from_slice::<ErrorBody>(body)
        .map(|b| (b.error, b.code))
        .unwrap_or_else(|_| (format!("auth answered {status}"), None));
    ClientError::Refused {
        status,
        message,
        code,
    }
}

/// A whole request and its answer must come within this.
const WHOLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A streamed answer's connection and headers must come within this.
pub const HEADERS_TIMEOUT: Duration = Duration::from_secs(30);
/// A streamed answer that sends nothing for this long is given up.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a request to auth may take.
#[derive(Clone, Copy)]
enum Timeouts {
    /// 30 s for the whole request and answer.
    Whole,
    /// No whole-request bound: each read within [`STALL_TIMEOUT`] (the headers' bound is the
    /// caller's, [`AuthClient::stream`]).
    Stream,
}

/// HTTPS with mutual TLS to auth, trusting only the host CA, redirects off.
fn mtls_client(
    host_ca_pem: &str,
    chain_pem: &str,
    key_pem: &str,
    timeouts: Timeouts,
) -> Result<reqwest::Client, ClientError> {
    let setup = |e: &dyn std::fmt::Display| ClientError::Setup(e.to_string());
    let roots = pem_to_ders(host_ca_pem).map_err(|e| setup(&e))?;
    let chain = pem_to_ders(chain_pem).map_err(|e| setup(&e))?;
    let key = private_key_from_pem(key_pem).map_err(|e| setup(&e))?;
    // Auth is checked by its own name, whatever address it is dialed at.
    let trust = Trust::As(
        Box::new(Trust::Roots(roots)),
        sallyport_core::api::AUTH_SERVER_NAME.into(),
    );
    let tls = client_config(trust, Some((chain, key))).map_err(|e| setup(&e))?;
    let builder = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5));
    match timeouts {
        Timeouts::Whole => builder.timeout(WHOLE_TIMEOUT),
        Timeouts::Stream => builder.read_timeout(STALL_TIMEOUT),
    }
    .build()
    .map_err(|e| setup(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An identity whose certificate says `name` (a self-signed CA serves: nothing here
    /// verifies it, the router below only reads it).
    fn identity(name: &str) -> ServiceIdentity {
        let ca = match sallyport_core::x509::TlsCa::generate(name, "test") {
            Ok(ca) => ca,
            Err(e) => panic!("{e}"),
        };
        ServiceIdentity {
            chain_pem: ca.cert_pem.clone(),
            key_pem: ca.key_pem,
            host_ca_pem: ca.cert_pem,
            user_ca_pem: String::new(),
        }
    }

    /// Answers with the common name of the certificate the request came with, and what was
    /// posted; panics for `/panic`.
    fn echo() -> axum::Router {
        use axum::extract::Extension;
        async fn who(Extension(peer): Extension<PeerCertificates>, body: String) -> String {
            let cn = peer
                .0
                .first()
                .and_then(|leaf| sallyport_core::x509::parse_subject(leaf).ok())
                .map(|s| s.common_name)
                .unwrap_or_default();
            format!("{cn}|{body}")
        }
        async fn boom() -> String {
            std::panic::panic_any("a handler that panics")
        }
        axum::Router::new()
            .route("/who", axum::routing::post(who))
            .route("/panic", axum::routing::get(boom))
    }

    #[tokio::test]
    async fn in_process_requests_come_as_the_clients_certificate_as_it_is_renewed() {
        let (a, b) = (identity("proxy a"), identity("proxy b"));
        // Nothing listens on port 1: a request that went over the network would fail.
        let client = AuthClient::new("127.0.0.1:1", &a).and_then(|c| c.in_process(echo(), &a));
        assert!(client.is_ok());
        let Ok(client) = client else { return };
        let posted = serde_json::json!({"n": 1});
        let answer = client
            .call(reqwest::Method::POST, "/who", Some(posted.clone()))
            .await;
        assert!(
            matches!(&answer, Ok((200, body)) if body == b"Sallyport proxy a CA|{\"n\":1}"),
            "{answer:?}"
        );
        assert!(client.renewed(&b).is_ok());
        let answer = client
            .call(reqwest::Method::POST, "/who", Some(posted))
            .await;
        assert!(
            matches!(&answer, Ok((200, body)) if body.starts_with(b"Sallyport proxy b CA|")),
            "{answer:?}"
        );
        // A handler that panics is an error for the caller, not a panic in the proxy.
        let answer = client.call(reqwest::Method::GET, "/panic", None).await;
        assert!(matches!(&answer, Err(ClientError::Local(_))), "{answer:?}");
    }

    #[tokio::test]
    async fn a_users_client_never_rides_the_proxys_in_process_identity() {
        let (proxy, user) = (identity("proxy"), identity("user"));
        let client = AuthClient::new("127.0.0.1:1", &proxy)
            .and_then(|c| c.in_process(echo(), &proxy))
            .and_then(|c| c.as_identity(&user.chain_pem, &user.key_pem));
        assert!(client.is_ok());
        let Ok(client) = client else { return };
        // Over HTTPS as the user, to an address where nothing listens: refused by the network,
        // never answered by the router as the proxy.
        let answer = client.call(reqwest::Method::POST, "/who", None).await;
        assert!(
            matches!(&answer, Err(ClientError::Unreachable { .. })),
            "{answer:?}"
        );
    }

    #[test]
    fn dropped_failures_are_reported_per_door_with_their_count() {
        let q = FailureQueue::default();
        for _ in 0..3 {
            q.count_dropped("ssh");
        }
        q.count_dropped("tunnel");
        let reports = q.take_dropped();
        let got: Vec<_> = reports
            .iter()
            .map(|r| (r.door.as_str(), r.reason.as_str(), r.count))
            .collect();
        assert_eq!(
            got,
            vec![
                ("ssh", "reports dropped: queue full", Some(3)),
                ("tunnel", "reports dropped: queue full", Some(1)),
            ]
        );
        // Counted once: the next batch reports only what was dropped since.
        assert!(q.take_dropped().is_empty());
    }
}
