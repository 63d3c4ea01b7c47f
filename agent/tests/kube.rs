//! The kube agent against the fixture API server (`tests/kube/apiserver.py`: the real wire
//! protocol, client certificates and tokens, impersonation, watch, exec over WebSocket), with
//! the proxy's side played here: an HTTP/1.1 client on a stream the agent serves. What the
//! fixture logged (`requests.jsonl`) shows who the API server saw and what it was sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use sallyport_agent::kube::{KubeServer, KubeUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Body = UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// The fixture API server, killed when dropped.
struct Fixture {
    dir: PathBuf,
    child: Child,
}

impl Fixture {
    fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sallyport-kube-fixture-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/kube/apiserver.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--dir")
            .arg(&dir)
            .args(["--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim())
            .unwrap_or_else(|e| panic!("the fixture API server said {line:?}: {e}"));
        assert!(v["port"].as_u64().is_some(), "{v}");
        Fixture { dir, child }
    }

    fn server(&self, kubeconfig: &str) -> Arc<KubeServer> {
        sallyport_core::install_crypto_provider();
        let upstream = KubeUpstream::from_kubeconfig(&self.dir.join(kubeconfig))
            .unwrap_or_else(|e| panic!("{e}"));
        Arc::new(KubeServer::new(upstream))
    }

    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The proxy's end of one stream the agent serves.
async fn stream_to(server: &Arc<KubeServer>) -> hyper::client::conn::http1::SendRequest<Body> {
    let (proxy_end, agent_end) = tokio::io::duplex(1 << 20);
    tokio::spawn(server.clone().serve(agent_end));
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(proxy_end))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    sender
}

/// A request as the proxy sends it, impersonating alice in two groups, with a credential of
/// the person's that must go no further.
fn impersonated(method: &str, path: &str) -> hyper::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "kube-agent")
        .header("impersonate-user", "alice")
        .header("impersonate-group", "developers")
        .header("impersonate-group", "system:authenticated")
        .header(header::AUTHORIZATION, "Bearer the-persons-token")
}

fn empty() -> Body {
    Empty::new().boxed_unsync()
}

async fn json(resp: Response<Incoming>) -> serde_json::Value {
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)))
}

/// A header's values as the fixture logged them (names as sent, compared without case).
fn logged<'a>(rec: &'a serde_json::Value, name: &str) -> Vec<&'a str> {
    rec["impersonate"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.as_array().into_iter().flatten())
        .filter_map(|v| v.as_str())
        .collect()
}

#[tokio::test]
async fn every_kubeconfig_kind_forwards_as_the_agent_impersonating_as_the_proxy_said() {
    let f = Fixture::start("forward");
    let token = std::fs::read_to_string(f.dir.join("token")).unwrap();
    for (kubeconfig, identity) in [
        (
            "kubeconfig",
            serde_json::json!({"via": "x509", "cn": "sallyport-agent", "o": ["system:masters"]}),
        ),
        (
            "kubeconfig-data",
            serde_json::json!({"via": "x509", "cn": "sallyport-agent", "o": ["system:masters"]}),
        ),
        (
            "kubeconfig-ed25519",
            serde_json::json!({"via": "x509", "cn": "sallyport-agent", "o": ["system:masters"]}),
        ),
        (
            "kubeconfig-token",
            serde_json::json!({"via": "token", "user": "sallyport-token"}),
        ),
    ] {
        let server = f.server(kubeconfig);
        let mut proxy = stream_to(&server).await;
        let resp = proxy
            .send_request(
                impersonated("GET", "/api/v1/namespaces/dev/pods?limit=500")
                    .body(empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{kubeconfig}");
        let list = json(resp).await;
        assert_eq!(list["kind"], "PodList", "{kubeconfig}");
        assert_eq!(list["items"].as_array().map(Vec::len), Some(2));
        let rec = f.requests().pop().unwrap();
        assert_eq!(rec["path"], "/api/v1/namespaces/dev/pods", "{kubeconfig}");
        assert_eq!(rec["identity"], identity, "{kubeconfig}");
        assert_eq!(logged(&rec, "impersonate-user"), ["alice"]);
        assert_eq!(
            logged(&rec, "impersonate-group"),
            ["developers", "system:authenticated"]
        );
        assert_eq!(rec["effective"]["user"], "alice");
        // Never the person's credential: the agent's token, or nothing beside its certificate.
        let authorization = match kubeconfig {
            "kubeconfig-token" => serde_json::json!(format!("Bearer {}", token.trim())),
            _ => serde_json::Value::Null,
        };
        assert_eq!(rec["authorization"], authorization, "{kubeconfig}");
    }
}

#[tokio::test]
async fn without_impersonate_user_nothing_reaches_the_api_server() {
    let f = Fixture::start("refuse");
    let server = f.server("kubeconfig");
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(
            Request::builder()
                .uri("/api/v1/namespaces/prod/secrets")
                .header(header::HOST, "kube-agent")
                .header("impersonate-group", "system:masters")
                .body(empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let status = json(resp).await;
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 403);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("no Impersonate-User"),
        "{status}"
    );
    assert!(f.requests().is_empty(), "{:?}", f.requests());
}

#[tokio::test]
async fn a_watch_streams_events_as_they_happen() {
    let f = Fixture::start("watch");
    let server = f.server("kubeconfig-data");
    let mut watcher = stream_to(&server).await;
    let resp = watcher
        .send_request(
            impersonated("GET", "/api/v1/namespaces/dev/configmaps?watch=1")
                .body(empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut seen = String::new();
    let mut next_event = async || {
        while !seen.contains('\n') {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .expect("an event in time")
                .unwrap()
                .unwrap();
            if let Some(d) = frame.data_ref() {
                seen.push_str(&String::from_utf8_lossy(d));
            }
        }
        let (line, rest) = seen.split_once('\n').unwrap();
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        seen = rest.to_string();
        event
    };
    // The existing ones first, then one created while the watch is open.
    let mut names = vec![];
    for _ in 0..2 {
        let e = next_event().await;
        assert_eq!(e["type"], "ADDED");
        names.push(
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    names.sort();
    assert_eq!(names, ["kube-root-ca.crt", "web-config"]);
    let mut writer = stream_to(&server).await;
    let created = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "while-watching", "namespace": "dev"},
        "data": {"k": "v"},
    });
    let resp = writer
        .send_request(
            impersonated("POST", "/api/v1/namespaces/dev/configmaps")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(created.to_string())).boxed_unsync())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let e = next_event().await;
    assert_eq!(e["type"], "ADDED");
    assert_eq!(e["object"]["metadata"]["name"], "while-watching");
}

/// A client's WebSocket frame: masked, as RFC 6455 requires of clients.
fn ws_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x82];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n < 65536 => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let mask = [0x12, 0x34, 0x56, 0x78];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads one server frame: (opcode, payload).
async fn ws_read(io: &mut (impl AsyncReadExt + Unpin)) -> (u8, Vec<u8>) {
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await.unwrap();
    let len = match head[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            io.read_exact(&mut b).await.unwrap();
            u16::from_be_bytes(b) as usize
        }
        127 => {
            let mut b = [0u8; 8];
            io.read_exact(&mut b).await.unwrap();
            u64::from_be_bytes(b) as usize
        }
        n => n as usize,
    };
    assert_eq!(head[1] & 0x80, 0, "a server never masks");
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await.unwrap();
    (head[0] & 0x0f, payload)
}

#[tokio::test]
async fn exec_over_websocket_v5_runs_with_stdin_and_its_close() {
    let f = Fixture::start("exec");
    let server = f.server("kubeconfig-ed25519");
    let mut proxy = stream_to(&server).await;
    let mut resp = proxy
        .send_request(
            impersonated(
                "GET",
                "/api/v1/namespaces/dev/pods/web-2/exec?command=cat&stdin=true&stdout=true&stderr=true",
            )
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("sec-websocket-protocol", "v5.channel.k8s.io")
            .body(empty())
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "v5.channel.k8s.io"
    );
    let mut io = TokioIo::new(hyper::upgrade::on(&mut resp).await.unwrap());
    let rec = f.requests().pop().unwrap();
    assert_eq!(rec["status"], 101);
    assert_eq!(logged(&rec, "impersonate-user"), ["alice"]);
    assert_eq!(rec["authorization"], serde_json::Value::Null);

    // stdin, then v5's close of stdin (255, 0): cat echoes and ends, the status says success.
    let mut stdin = vec![0u8];
    stdin.extend_from_slice(b"hello through the kube agent\n");
    io.write_all(&ws_frame(&stdin)).await.unwrap();
    io.write_all(&ws_frame(&[255, 0])).await.unwrap();
    let mut stdout = Vec::new();
    let status = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (op, payload) = ws_read(&mut io).await;
            match (op, payload.split_first()) {
                (0x2, Some((1, data))) => stdout.extend_from_slice(data),
                (0x2, Some((3, data))) => {
                    return serde_json::from_slice::<serde_json::Value>(data).unwrap();
                }
                (0x8, _) => panic!("closed before the status"),
                _ => {}
            }
        }
    })
    .await
    .expect("the exec ended");
    assert_eq!(status["status"], "Success", "{status}");
    assert_eq!(stdout, b"hello through the kube agent\n");
}

#[tokio::test]
async fn a_refused_websocket_is_passed_through_for_kubectl_to_fall_back() {
    let f = Fixture::start("fallback");
    let server = f.server("kubeconfig");
    let mut proxy = stream_to(&server).await;
    let resp = proxy
        .send_request(
            impersonated(
                "GET",
                "/api/v1/namespaces/dev/pods/web-2/exec?command=true&stdout=true",
            )
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("sec-websocket-protocol", "no.such.protocol")
            .body(empty())
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with("requested protocol(s) are not supported"),
        "{text}"
    );
}
