//! The kube agent's forwarder: kubeconfigs read as kubectl reads them (and refused with the file
//! and field named), and requests forwarded to a small HTTPS API server of the test's own,
//! which requires a client certificate from its CA and logs what it was sent: the proxy's
//! impersonation kept, the caller's credentials never, a request without impersonation never
//! sent, watches and uploads streamed, upgrades piped, a pooled connection reused.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SignatureAlgorithm,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

trait Must<T> {
    fn must(self) -> T;
}

impl<T, E: std::fmt::Display> Must<T> for Result<T, E> {
    fn must(self) -> T {
        self.unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T> Must<T> for Option<T> {
    fn must(self) -> T {
        self.unwrap_or_else(|| panic!("none"))
    }
}

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sallyport-kube-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).must();
    dir
}

/// A CA for the test API server's certificate and the agent's client certificates.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).must();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, "test kube CA");
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Pki {
            ca: CertifiedIssuer::self_signed(p, KeyPair::generate().must()).must(),
        }
    }

    fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A certificate and its key (PEM); `server` for the API server (names as SANs), else a
    /// client certificate with this CN.
    fn leaf(&self, name: &str, server: bool, alg: &'static SignatureAlgorithm) -> (String, String) {
        let sans = if server {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        } else {
            vec![]
        };
        let mut p = CertificateParams::new(sans).must();
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate_for(alg).must();
        let cert = p.signed_by(&key, &self.ca).must();
        (cert.pem(), key.serialize_pem())
    }
}

/// What the test API server was sent.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    /// The CN of the client certificate, if one was presented.
    client: Option<String>,
    /// Which TLS connection it came on (1, 2, ...).
    connection: usize,
}

impl Seen {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

type Log = Arc<Mutex<Vec<Seen>>>;
type TestBody = UnsyncBoxBody<Bytes, Infallible>;

/// A small HTTPS "API server": client certificates from the test CA are verified (and
/// optional, for token tests), every request is logged, and a few paths act like the real ones.
struct ApiServer {
    addr: SocketAddr,
    log: Log,
    connections: Arc<AtomicUsize>,
}

impl ApiServer {
    async fn start(pki: &Pki) -> Self {
        let (cert, key) = pki.leaf("apiserver", true, &rcgen::PKCS_ECDSA_P256_SHA256);
        let cfg = sallyport_core::tls::server_config(
            sallyport_core::x509::pem_to_ders(&cert).must(),
            sallyport_core::tls::private_key_from_pem(&key).must(),
            sallyport_core::tls::ClientAuth::Optional(
                sallyport_core::x509::pem_to_ders(&pki.ca_pem()).must(),
            ),
        )
        .must();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.must();
        let addr = listener.local_addr().must();
        let log: Log = Arc::default();
        let connections = Arc::new(AtomicUsize::new(0));
        let (l, c) = (log.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let log = l.clone();
                let connection = c.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let client = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| sallyport_core::x509::parse_subject(c).ok())
                        .map(|s| s.common_name);
                    let service = hyper::service::service_fn(move |req| {
                        let seen = Seen {
                            method: req.method().to_string(),
                            path: req
                                .uri()
                                .path_and_query()
                                .map_or("/", |p| p.as_str())
                                .to_string(),
                            headers: req
                                .headers()
                                .iter()
                                .map(|(n, v)| {
                                    (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into())
                                })
                                .collect(),
                            client: client.clone(),
                            connection,
                        };
                        if let Ok(mut l) = log.lock() {
                            l.push(seen.clone());
                        }
                        api(req, seen)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        ApiServer {
            addr,
            log,
            connections,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }
}

fn full(b: impl Into<Bytes>) -> TestBody {
    http_body_util::Full::new(b.into()).boxed_unsync()
}

async fn api(req: Request<Incoming>, seen: Seen) -> Result<Response<TestBody>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if req.headers().contains_key(header::UPGRADE) {
        if path.ends_with("/attach") {
            // As an API server that does not speak this protocol: kubectl then falls back.
            let mut r = Response::new(full(r#"{"kind":"Status","code":400}"#));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r.headers_mut()
                .insert("x-refused", HeaderValue::from_static("upgrade"));
            return Ok(r);
        }
        let on = hyper::upgrade::on(req);
        tokio::spawn(async move {
            let Ok(io) = on.await else { return };
            let mut io = TokioIo::new(io);
            let mut buf = vec![0u8; 64 * 1024];
            // Echo until the agent half-closes, then say goodbye and close.
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if io.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = io.write_all(b"bye").await;
            let _ = io.shutdown().await;
        });
        let mut r = Response::new(full(Bytes::new()));
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = r.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("v5.channel.k8s.io"),
        );
        return Ok(r);
    }
    if path.ends_with("/upload") {
        // Counted as it arrives, never held.
        let mut body = req.into_body();
        let mut n = 0usize;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => n += f.data_ref().map_or(0, |d| d.len()),
                Err(_) => break,
            }
        }
        return Ok(Response::new(full(n.to_string())));
    }
    if query.contains("watch=1") {
        // A watch never ends: events until the client goes away.
        let events = futures::stream::unfold(0u32, |i| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let line = format!("{{\"type\":\"ADDED\",\"n\":{i}}}\n");
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), i + 1))
        });
        return Ok(Response::new(StreamBody::new(events).boxed_unsync()));
    }
    let echo = serde_json::json!({
        "method": seen.method,
        "path": seen.path,
        "client": seen.client,
    });
    let mut r = Response::new(full(echo.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// Writes a kubeconfig into `dir` and returns its path.
fn write_kubeconfig(dir: &Path, text: &str) -> PathBuf {
    let file = dir.join("kubeconfig");
    std::fs::write(&file, text).must();
    file
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig for `server` whose user has a client certificate (`alg`), inline.
fn inline_kubeconfig(pki: &Pki, server: &str, alg: &'static SignatureAlgorithm) -> String {
    let (cert, key) = pki.leaf("sallyport-kube-agent", false, alg);
    format!(
        "apiVersion: v1
kind: Config
current-context: agent
clusters:
- name: test
  cluster:
    server: {server}
    certificate-authority-data: {}
contexts:
- name: agent
  context: {{cluster: test, user: agent, namespace: default}}
users:
- name: agent
  user:
    client-certificate-data: {}
    client-key-data: {}
preferences: {{}}
",
        b64(&pki.ca_pem()),
        b64(&cert),
        b64(&key)
    )
}

/// The proxy's end of one tunnel stream served by `server`: an HTTP/1.1 client.
async fn stream_to(
    server: &Arc<KubeServer>,
) -> hyper::client::conn::http1::SendRequest<UnsyncBoxBody<Bytes, Infallible>> {
    let (proxy_end, agent_end) = tokio::io::duplex(1 << 20);
    tokio::spawn(server.clone().serve(agent_end));
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(proxy_end))
        .await
        .must();
    tokio::spawn(conn.with_upgrades());
    sender
}

/// A request as the proxy sends it: impersonating alice (two groups), with a caller's
/// credential that must not go on.
fn impersonated(method: &str, path: &str) -> hyper::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "proxy.example.com:3026")
        .header("impersonate-user", "alice")
        .header("impersonate-group", "developers")
        .header("impersonate-group", "system:authenticated")
        .header(header::AUTHORIZATION, "Bearer the-person's-token")
        .header(header::PROXY_AUTHORIZATION, "Basic c2VjcmV0")
}

fn empty() -> UnsyncBoxBody<Bytes, Infallible> {
    Empty::new().boxed_unsync()
}

async fn text(resp: Response<Incoming>) -> String {
    let body = resp.into_body().collect().await.must().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

fn server_for(kubeconfig: &Path) -> Arc<KubeServer> {
    sallyport_core::install_crypto_provider();
    Arc::new(KubeServer::new(
        KubeUpstream::from_kubeconfig(kubeconfig).must(),
    ))
}

#[tokio::test]
async fn impersonated_requests_go_on_with_the_agents_identity_and_nothing_of_the_callers() {
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("forward");
    let kc = write_kubeconfig(
        &dir,
        &inline_kubeconfig(&pki, &api.server(), &rcgen::PKCS_ED25519),
    );
    let server = server_for(&kc);
    let mut proxy = stream_to(&server).await;
    for path in ["/api/v1/namespaces/default/pods?limit=500", "/version"] {
        let resp = proxy
            .send_request(impersonated("GET", path).body(empty()).must())
            .await
            .must();
        assert_eq!(resp.status(), StatusCode::OK);
        let echo: serde_json::Value = serde_json::from_str(&text(resp).await).must();
        assert_eq!(echo["path"], path);
        // The Ed25519 client certificate from the kubeconfig.
        assert_eq!(echo["client"], "sallyport-kube-agent");
    }
    let seen = api.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.all("impersonate-user"), ["alice"]);
        assert_eq!(
            s.all("impersonate-group"),
            ["developers", "system:authenticated"],
            "repeated groups stay repeated, in order"
        );
        assert!(s.all("authorization").is_empty(), "{s:?}");
        assert!(s.all("proxy-authorization").is_empty(), "{s:?}");
        assert_eq!(s.all("host"), [format!("127.0.0.1:{}", api.addr.port())]);
    }
    // Two requests, one stream from the proxy, and one TLS connection to the API server.
    assert_eq!(api.connections.load(Ordering::SeqCst), 1);
    // A second stream reuses the pooled connection: no handshake per stream either.
    let mut other = stream_to(&server).await;
    let resp = other
        .send_request(impersonated("GET", "/api").body(empty()).must())
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(api.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_request_without_impersonation_is_refused_and_never_reaches_the_api_server() {
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("refuse");
    let kc = write_kubeconfig(
        &dir,
        &inline_kubeconfig(&pki, &api.server(), &rcgen::PKCS_ECDSA_P256_SHA256),
    );
    let server = server_for(&kc);
    let mut proxy = stream_to(&server).await;
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[], "no Impersonate-User"),
        (&[("impersonate-user", "")], "no Impersonate-User"),
        (
            &[("impersonate-group", "system:masters")],
            "no Impersonate-User",
        ),
        (
            &[("impersonate-user", "alice"), ("impersonate-uid", "1")],
            "impersonate-uid",
        ),
        (
            &[
                ("impersonate-user", "alice"),
                ("impersonate-extra-scopes", "x"),
            ],
            "impersonate-extra-scopes",
        ),
    ];
    for (headers, needle) in cases {
        let mut req = Request::builder()
            .uri("/api/v1/secrets")
            .header(header::HOST, "proxy")
            .header(header::AUTHORIZATION, "Bearer caller");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let resp = proxy.send_request(req.body(empty()).must()).await.must();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{headers:?}");
        assert_eq!(
            resp.headers().get(header::CONTENT_TYPE).must(),
            "application/json"
        );
        let status: serde_json::Value = serde_json::from_str(&text(resp).await).must();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], 403);
        assert_eq!(status["reason"], "Forbidden");
        let message = status["message"].as_str().must();
        assert!(message.contains(needle), "{headers:?}: {message}");
    }
    // The stream stays usable after refusals, and only now does anything reach the server.
    assert!(api.seen().is_empty(), "{:?}", api.seen());
    assert_eq!(api.connections.load(Ordering::SeqCst), 0);
    let resp = proxy
        .send_request(impersonated("GET", "/api").body(empty()).must())
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(api.seen().len(), 1);
}

#[tokio::test]
async fn a_watch_streams_and_an_upload_is_not_held() {
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("stream");
    let kc = write_kubeconfig(
        &dir,
        &inline_kubeconfig(&pki, &api.server(), &rcgen::PKCS_ECDSA_P256_SHA256),
    );
    let server = server_for(&kc);
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(
            impersonated("GET", "/api/v1/pods?watch=1")
                .body(empty())
                .must(),
        )
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::OK);
    // Events arrive one by one from a body that never ends.
    let mut body = resp.into_body();
    let mut got = String::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        while got.lines().count() < 3 {
            let frame = body.frame().await.must().must();
            if let Some(d) = frame.data_ref() {
                got.push_str(&String::from_utf8_lossy(d));
            }
        }
    })
    .await
    .must();
    assert!(got.starts_with("{\"type\":\"ADDED\",\"n\":0}\n"), "{got}");
    drop(body);

    // 8 MiB sent in chunks, as `kubectl cp` sends a tar, on a new stream.
    let mut proxy = stream_to(&server).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let chunks = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let sending = tokio::spawn(async move {
        for _ in 0..128 {
            if tx.send(Bytes::from(vec![7u8; 64 * 1024])).await.is_err() {
                return;
            }
        }
    });
    let resp = proxy
        .send_request(
            impersonated("POST", "/api/v1/namespaces/default/pods/p/upload")
                .body(StreamBody::new(chunks).boxed_unsync())
                .must(),
        )
        .await
        .must();
    assert_eq!(text(resp).await, (8 * 1024 * 1024).to_string());
    sending.await.must();
}

#[tokio::test]
async fn an_accepted_upgrade_is_a_pipe_and_a_refused_one_is_passed_through() {
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("upgrade");
    let kc = write_kubeconfig(
        &dir,
        &inline_kubeconfig(&pki, &api.server(), &rcgen::PKCS_ECDSA_P256_SHA256),
    );
    let server = server_for(&kc);

    let upgrade = |path: &str| {
        impersonated("GET", path)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header("sec-websocket-protocol", "v5.channel.k8s.io")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .body(empty())
            .must()
    };
    // Refused: the API server's answer as it gave it, and the stream goes on.
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(upgrade(
            "/api/v1/namespaces/default/pods/p/attach?stdin=true",
        ))
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(resp.headers().get("x-refused").must(), "upgrade");
    assert_eq!(text(resp).await, r#"{"kind":"Status","code":400}"#);

    let mut resp = proxy
        .send_request(upgrade(
            "/api/v1/namespaces/default/pods/p/exec?command=cat&stdin=true",
        ))
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").must(),
        "v5.channel.k8s.io"
    );
    let mut io = TokioIo::new(hyper::upgrade::on(&mut resp).await.must());
    // Bytes both ways, then a half-close passed on: the API server's last words still arrive.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = tokio::io::split(&mut io);
    let send = async {
        w.write_all(&data).await.must();
        w.shutdown().await.must();
    };
    let mut back = Vec::new();
    let recv = async {
        r.read_to_end(&mut back).await.must();
    };
    tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(send, recv) })
        .await
        .must();
    assert_eq!(back.len(), data.len() + 3);
    assert_eq!(&back[..data.len()], &data[..]);
    assert_eq!(&back[data.len()..], b"bye");

    let seen = api.seen();
    let exec = seen.iter().find(|s| s.path.contains("/exec")).must();
    assert_eq!(exec.all("connection"), ["Upgrade"]);
    assert_eq!(exec.all("upgrade"), ["websocket"]);
    assert_eq!(exec.all("sec-websocket-protocol"), ["v5.channel.k8s.io"]);
    assert_eq!(exec.all("impersonate-user"), ["alice"]);
    assert!(exec.all("authorization").is_empty());
    // The upgraded connection never went back to the pool: the next request gets a fresh one.
    let before = api.connections.load(Ordering::SeqCst);
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(impersonated("GET", "/api").body(empty()).must())
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::OK);
    let last = api.seen().pop().must();
    assert_ne!(last.connection, exec.connection);
    assert!(api.connections.load(Ordering::SeqCst) >= before);
}

#[tokio::test]
async fn an_unreachable_api_server_is_a_503_that_names_nothing() {
    let pki = Pki::new();
    // A port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").must();
        l.local_addr().must().port()
    };
    let dir = temp_dir("unreachable");
    let kc = write_kubeconfig(
        &dir,
        &inline_kubeconfig(
            &pki,
            &format!("https://127.0.0.1:{port}"),
            &rcgen::PKCS_ECDSA_P256_SHA256,
        ),
    );
    let server = server_for(&kc);
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(impersonated("GET", "/api").body(empty()).must())
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = text(resp).await;
    let status: serde_json::Value = serde_json::from_str(&body).must();
    assert_eq!(status["message"], UNREACHABLE);
    assert_eq!(status["code"], 503);
    assert!(!body.contains(&port.to_string()) && !body.contains("127.0.0.1"));
}

#[tokio::test]
async fn a_server_path_prefix_and_a_token_file_relative_to_the_kubeconfig() {
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("prefix");
    std::fs::create_dir_all(dir.join("certs")).must();
    std::fs::write(dir.join("certs/ca.pem"), pki.ca_pem()).must();
    std::fs::write(dir.join("token"), "file-token\n").must();
    let kc = write_kubeconfig(
        &dir,
        &format!(
            "current-context: t
clusters:
- name: c
  cluster: {{server: '{}/k8s/prefix/', certificate-authority: certs/ca.pem}}
contexts:
- name: t
  context: {{cluster: c, user: u}}
users:
- name: u
  user: {{tokenFile: token}}
",
            api.server()
        ),
    );
    let server = server_for(&kc);
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(
            impersonated("GET", "/api/v1/pods?watch=0")
                .body(empty())
                .must(),
        )
        .await
        .must();
    assert_eq!(resp.status(), StatusCode::OK);
    let s = api.seen().pop().must();
    assert_eq!(s.path, "/k8s/prefix/api/v1/pods?watch=0");
    assert_eq!(s.all("authorization"), ["Bearer file-token"]);
    assert_eq!(s.client, None);
}

#[tokio::test]
async fn in_cluster_the_service_account_token_is_read_again_as_it_rotates() {
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("incluster");
    std::fs::write(dir.join("ca.crt"), pki.ca_pem()).must();
    std::fs::write(dir.join("token"), "first").must();
    sallyport_core::install_crypto_provider();
    let upstream =
        KubeUpstream::in_cluster_at(&dir, "127.0.0.1", &api.addr.port().to_string()).must();
    assert_eq!(upstream.server(), api.server());
    let server = Arc::new(KubeServer::new(upstream));
    let mut proxy = stream_to(&server).await;
    let mut ask = async || {
        let resp = proxy
            .send_request(impersonated("GET", "/api").body(empty()).must())
            .await
            .must();
        assert_eq!(resp.status(), StatusCode::OK);
        api.seen().pop().must().all("authorization").join(",")
    };
    assert_eq!(ask().await, "Bearer first");
    // Rotated: within a minute of the last read the old token is still used...
    std::fs::write(dir.join("token"), "second").must();
    assert_eq!(ask().await, "Bearer first");
    // ...and once a minute has passed, the file is read again.
    if let Some(Token::File { current, .. }) = &server.upstream.token {
        let mut c = current.lock().must();
        c.1 = Instant::now().checked_sub(TOKEN_REREAD).must();
    }
    assert_eq!(ask().await, "Bearer second");
    // A token file that cannot be read keeps the last good token.
    std::fs::remove_file(dir.join("token")).must();
    if let Some(Token::File { current, .. }) = &server.upstream.token {
        let mut c = current.lock().must();
        c.1 = Instant::now().checked_sub(TOKEN_REREAD).must();
    }
    assert_eq!(ask().await, "Bearer second");
}

#[test]
fn in_cluster_without_a_pod_says_what_to_give() {
    let dir = temp_dir("nopod");
    let e = KubeUpstream::in_cluster_at(&dir, "10.96.0.1", "443")
        .err()
        .must()
        .to_string();
    assert!(
        e.starts_with("in-cluster service account: cannot read "),
        "{e}"
    );
    assert!(e.contains("ca.crt"), "{e}");
    let e = KubeUpstream::in_cluster_at(&dir, "10.96.0.1", "https")
        .err()
        .must()
        .to_string();
    assert!(e.contains("KUBERNETES_SERVICE_PORT \"https\""), "{e}");
    let pki = Pki::new();
    std::fs::write(dir.join("ca.crt"), pki.ca_pem()).must();
    std::fs::write(dir.join("token"), "  \n").must();
    let e = KubeUpstream::in_cluster_at(&dir, "fd00::1", "443")
        .err()
        .must()
        .to_string();
    assert!(e.contains("token") && e.contains("empty"), "{e}");
    std::fs::write(dir.join("token"), "t").must();
    sallyport_core::install_crypto_provider();
    let up = KubeUpstream::in_cluster_at(&dir, "fd00::1", "443").must();
    assert_eq!(up.server(), "https://[fd00::1]:443");
    assert_eq!(up.host, "fd00::1");
}

/// A kubeconfig with two contexts on two clusters, its files beside it.
fn files_kubeconfig(dir: &Path, pki: &Pki, current: &str) -> PathBuf {
    let (cert, key) = pki.leaf("agent", false, &rcgen::PKCS_RSA_SHA256);
    std::fs::create_dir_all(dir.join("pki")).must();
    std::fs::write(dir.join("pki/ca.crt"), pki.ca_pem()).must();
    std::fs::write(dir.join("pki/agent.crt"), cert).must();
    std::fs::write(dir.join("pki/agent.key"), key).must();
    write_kubeconfig(
        dir,
        &format!(
            r#"apiVersion: v1
kind: Config
current-context: {current}
clusters:
- name: one
  cluster:
    server: https://one.example.com:6443
    certificate-authority: pki/ca.crt
- name: two
  cluster:
    server: "https://10.0.0.2"
    certificate-authority: {}/pki/ca.crt
    tls-server-name: kubernetes.default
    extensions: []
contexts:
- name: first
  context: {{cluster: one, user: certs}}
- name: second
  context: {{cluster: two, user: token}}
- name: lost
  context: {{cluster: one, user: nobody}}
- name: nowhere
  context: {{cluster: three, user: certs}}
users:
- name: certs
  user:
    client-certificate: pki/agent.crt
    client-key: pki/agent.key
- name: token
  user:
    token: sekret
"#,
            dir.display()
        ),
    )
}

#[test]
fn kubeconfig_current_context_files_and_tokens() {
    sallyport_core::install_crypto_provider();
    let pki = Pki::new();
    let dir = temp_dir("contexts");
    // Relative paths from another working directory: relative to the kubeconfig, as kubectl.
    let up = KubeUpstream::from_kubeconfig(&files_kubeconfig(&dir, &pki, "first")).must();
    assert_eq!(up.server(), "https://one.example.com:6443");
    assert_eq!(
        (
            up.origin.as_str(),
            up.prefix.as_str(),
            up.host.as_str(),
            up.port
        ),
        ("https://one.example.com:6443", "", "one.example.com", 6443)
    );
    assert!(up.token.is_none());
    let up = KubeUpstream::from_kubeconfig(&files_kubeconfig(&dir, &pki, "second")).must();
    assert_eq!(up.server(), "https://10.0.0.2");
    assert_eq!(up.port, 443);
    assert_eq!(
        up.server_name,
        ServerName::try_from("kubernetes.default").must()
    );
    assert!(matches!(up.token, Some(Token::Fixed(ref v)) if v == "Bearer sekret"));
}

#[test]
fn kubeconfig_mistakes_name_the_file_and_the_field() {
    sallyport_core::install_crypto_provider();
    let pki = Pki::new();
    let dir = temp_dir("mistakes");
    let file = dir.join("kubeconfig").display().to_string();
    let err = |text: &str| {
        let kc = write_kubeconfig(&dir, text);
        KubeUpstream::from_kubeconfig(&kc).err().must().to_string()
    };
    let check = |e: String, needle: &str| {
        assert!(
            e.starts_with(&format!("kubeconfig {file}: ")) && e.contains(needle),
            "wanted {needle:?} in {e:?}"
        );
    };
    for (current, needle) in [
        (
            "lost",
            r#"user "nobody" (of context "lost") is not among its users"#,
        ),
        (
            "nowhere",
            r#"cluster "three" (of context "nowhere") is not among its clusters"#,
        ),
        (
            "gone",
            r#"current-context "gone" is not among its contexts"#,
        ),
    ] {
        let kc = files_kubeconfig(&dir, &pki, current);
        let e = KubeUpstream::from_kubeconfig(&kc).err().must().to_string();
        check(e, needle);
    }
    let ok = inline_kubeconfig(&pki, "https://k8s:6443", &rcgen::PKCS_ECDSA_P256_SHA256);
    let cases: Vec<(String, &str)> = vec![
        (
            ok.replace("current-context: agent\n", ""),
            "no current-context",
        ),
        (
            ok.replace(
                "    certificate-authority-data",
                "    insecure-skip-tls-verify: true\n    certificate-authority-data",
            ),
            "clusters[test].cluster.insecure-skip-tls-verify is true",
        ),
        (
            ok.replace(
                "certificate-authority-data: ",
                "certificate-authority-data: x_y-",
            ),
            "clusters[test].cluster.certificate-authority-data: not base64",
        ),
        (
            ok.replace(
                "certificate-authority-data: ",
                "certificate-authority-data: aGVsbG8K\n    x: ",
            ),
            "the CA of cluster \"test\": no PEM certificate",
        ),
        (
            ok.replace(
                "certificate-authority-data: ",
                "proxy-url: http://p:3128\n    x: ",
            ),
            "clusters[test].cluster.proxy-url is not supported",
        ),
        (
            ok.replace("    client-certificate-data: ", "    x: "),
            "users[agent].user.client-certificate is missing",
        ),
        (
            ok.replace("    client-key-data: ", "    x: "),
            "users[agent].user.client-key is missing",
        ),
        (
            ok.replace(
                "    client-key-data: ",
                "    exec: {command: aws}\n    client-key-data: ",
            ),
            "users[agent].user.exec: credential plugins are not supported",
        ),
        (
            ok.replace(
                "    client-key-data: ",
                "    as: admin\n    client-key-data: ",
            ),
            "users[agent].user.as",
        ),
        (
            ok.replace(
                "    client-certificate-data: ",
                "    client-certificate: nowhere.crt\n    x: ",
            ),
            "users[agent].user.client-certificate: cannot read",
        ),
        (
            ok.replace(
                "  user:\n    client-certificate-data",
                "  user:\n    tokenFile: missing-token\n    client-certificate-data",
            ),
            "users[agent].user.tokenFile: cannot read the token file",
        ),
        (
            ok.replace(
                "    server: https://k8s:6443",
                "    server: http://k8s:8080",
            ),
            "speaks only HTTPS",
        ),
        (
            ok.replace("    server: https://k8s:6443\n", ""),
            "clusters[test].cluster.server is missing",
        ),
        (
            ok.replace("user: agent, namespace", "namespace"),
            "context \"agent\" names no user",
        ),
        ("clusters: 5\n".to_string(), "not a kubeconfig"),
    ];
    for (text, needle) in cases {
        check(err(&text), needle);
    }
    // A user with neither certificate nor token.
    let mut no_credentials = ok.clone();
    let at = no_credentials.find("  user:\n    client").must();
    no_credentials.truncate(at);
    no_credentials.push_str("  user: {}\n");
    check(
        err(&no_credentials),
        "has no client certificate and no token",
    );
    let e = KubeUpstream::from_kubeconfig(&dir.join("absent"))
        .err()
        .must();
    assert!(e.to_string().contains("cannot read it"), "{e}");
}

#[test]
fn client_keys_of_every_kind_are_accepted() {
    sallyport_core::install_crypto_provider();
    let pki = Pki::new();
    let dir = temp_dir("keys");
    for alg in [
        &rcgen::PKCS_ED25519,
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_RSA_SHA256,
    ] {
        let kc = write_kubeconfig(&dir, &inline_kubeconfig(&pki, "https://k8s", alg));
        KubeUpstream::from_kubeconfig(&kc).unwrap_or_else(|e| panic!("{alg:?}: {e}"));
    }
}

#[test]
fn hop_by_hop_headers_go_and_impersonation_is_checked_after() {
    let mut h = HeaderMap::new();
    h.insert(header::CONNECTION, HeaderValue::from_static("close, x-hop"));
    h.insert("x-hop", HeaderValue::from_static("1"));
    h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    h.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    h.insert("impersonate-user", HeaderValue::from_static("alice"));
    assert!(!wants_upgrade(&h));
    strip_hop_by_hop(&mut h, false);
    let left: BTreeMap<String, String> = h
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(
        left,
        BTreeMap::from([("impersonate-user".into(), "alice".into())])
    );
    // A Connection header naming the impersonation takes it away, and then the check refuses.
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("impersonate-user"),
    );
    strip_hop_by_hop(&mut h, false);
    assert!(check_impersonation(&h).is_err());

    let mut up = HeaderMap::new();
    up.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, Upgrade"),
    );
    up.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    assert!(wants_upgrade(&up));
    strip_hop_by_hop(&mut up, true);
    assert_eq!(up.get(header::CONNECTION).must(), "Upgrade");
    assert_eq!(up.get(header::UPGRADE).must(), "SPDY/3.1");
    let mut h2c = HeaderMap::new();
    h2c.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h2c.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
    assert!(!wants_upgrade(&h2c));
}

/// Through a real tunnel (yamux over TCP, the proxy's end decoupled as the proxy has it): 32 MiB
/// each way at once through an exec upgrade, as `kubectl exec -i POD -- cat` moves them. The
/// agent serves the stream from one task at a time (hyper's connection, then the pipe), so no
/// wake-up is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_through_a_real_tunnel_moves_bulk_both_ways() {
    use sallyport_core::tunnel::{self, Side};
    let pki = Pki::new();
    let api = ApiServer::start(&pki).await;
    let dir = temp_dir("tunnel");
    let kc = write_kubeconfig(
        &dir,
        &inline_kubeconfig(&pki, &api.server(), &rcgen::PKCS_ECDSA_P256_SHA256),
    );
    let server = server_for(&kc);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.must();
    let addr = listener.local_addr().must();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.must();
        let (_opener, mut inbound) = tunnel::run(tcp, Side::Agent);
        while let Some(s) = inbound.recv().await {
            tokio::spawn(StreamServer::serve(server.clone(), s, None));
        }
    });
    let (opener, _inbound) = tunnel::run(TcpStream::connect(addr).await.must(), Side::Proxy);
    let stream = sallyport_core::flow::Decoupled::new(opener.open().await.must());
    let (mut proxy, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .must();
    tokio::spawn(conn.with_upgrades());
    let req = impersonated("GET", "/api/v1/namespaces/default/pods/p/exec?command=cat")
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("x-stream-protocol-version", "v4.channel.k8s.io")
        .body(empty())
        .must();
    let mut resp = proxy.send_request(req).await.must();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    let io = TokioIo::new(hyper::upgrade::on(&mut resp).await.must());
    let (mut r, mut w) = tokio::io::split(io);
    let total = 32 * 1024 * 1024;
    let writer = tokio::spawn(async move {
        let chunk = vec![5u8; 64 * 1024];
        for _ in 0..total / chunk.len() {
            w.write_all(&chunk).await.must();
        }
        w.shutdown().await.must();
    });
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let n = r.read(&mut buf).await.must();
            if n == 0 {
                break;
            }
            got += n;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("stalled after {got} bytes"));
    writer.await.must();
    assert_eq!(
        got,
        total + 3,
        "everything echoed, then the API server's goodbye"
    );
}
