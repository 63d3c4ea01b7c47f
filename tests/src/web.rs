//! A browser, as far as the proxy can tell: HTTPS with an `Origin`, the session cookie and
//! the CSRF token, and the terminal's WebSocket (subprotocol `sallyport.term.v1`, binary frames
//! raw bytes, text frames JSON) over the tree's rustls. Shared by the web tests.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::Cluster;
pub const PASSWORD: &str = "correct horse battery";
pub const PROTOCOL: &str = "sallyport.term.v1";

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn tls(c: &Cluster, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut cfg =
        sallyport_core::tls::client_config(sallyport_core::tls::Trust::Pin(c.pin.clone()), None)
            .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    cfg
}

/// A browser, as far as the proxy can tell: its origin, its cookie, its CSRF token.
pub struct Browser {
    pub http: reqwest::Client,
    pub base: String,
    pub origin: String,
    pub addr: String,
    pub tls: Arc<rustls::ClientConfig>,
    pub cookie: Option<String>,
    pub csrf: Option<String>,
}

impl Browser {
    pub fn new(c: &Cluster) -> Self {
        Self::at(c, &c.proxy)
    }

    /// A browser that reaches the proxy at `addr` (`127.0.0.1:PORT`, one of several behind a
    /// load balancer), its origin the same until changed.
    pub fn at(c: &Cluster, addr: &str) -> Self {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls(c, &[b"h2", b"http/1.1"]))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Browser {
            http,
            base: format!("https://{addr}"),
            origin: format!("https://{addr}"),
            addr: addr.to_string(),
            tls: Arc::new(tls(c, &[b"http/1.1"])),
            cookie: None,
            csrf: None,
        }
    }

    pub fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        origin: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        if let Some(c) = &self.cookie {
            r = r.header("cookie", format!("__Host-sallyport_session={c}"));
        }
        r
    }

    /// Signs in; keeps the cookie and the CSRF token. Returns the status, the `Set-Cookie`
    /// header and the body.
    pub async fn login(
        &mut self,
        user: &str,
        password: &str,
        totp: Option<&str>,
    ) -> (u16, String, Value) {
        let mut body = json!({"user": user, "password": password});
        if let Some(t) = totp {
            body["totp"] = t.into();
        }
        let resp = self
            .request(
                reqwest::Method::POST,
                "/v1/webapi/web/login",
                Some(&self.origin.clone()),
            )
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let set_cookie = resp
            .headers()
            .get("set-cookie")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status == 200 {
            let id = set_cookie
                .split(';')
                .next()
                .and_then(|kv| kv.strip_prefix("__Host-sallyport_session="))
                .unwrap()
                .to_string();
            self.cookie = Some(id);
            self.csrf = body["csrf_token"].as_str().map(String::from);
        }
        (status, set_cookie, body)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .request(reqwest::Method::GET, path, None)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// The body as bytes, with the status and the `Content-Type`.
    pub async fn get_bytes(&self, path: &str) -> (u16, String, Vec<u8>) {
        let resp = self
            .request(reqwest::Method::GET, path, None)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, ctype, resp.bytes().await.unwrap().to_vec())
    }

    /// A request that changes something, as the page sends it: this proxy's origin, the
    /// session's CSRF token, a JSON body.
    pub async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
        let csrf = self.csrf.clone();
        self.send_as(
            method,
            path,
            Some(&self.origin.clone()),
            csrf.as_deref(),
            body,
        )
        .await
    }

    /// A request that changes something from `origin` with `csrf`.
    pub async fn send_as(
        &self,
        method: reqwest::Method,
        path: &str,
        origin: Option<&str>,
        csrf: Option<&str>,
        body: Value,
    ) -> (u16, Value) {
        let mut r = self.request(method, path, origin).json(&body);
        if let Some(t) = csrf {
            r = r.header("x-csrf-token", t);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `DELETE /v1/webapi/web/session` from `origin` with `csrf`.
    pub async fn logout(&self, origin: Option<&str>, csrf: Option<&str>) -> (u16, Value) {
        let mut r = self.request(reqwest::Method::DELETE, "/v1/webapi/web/session", origin);
        if let Some(t) = csrf {
            r = r.header("x-csrf-token", t);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Opens a terminal WebSocket from `origin`; `Err` carries the HTTP refusal of the upgrade.
    pub async fn terminal_from(
        &self,
        origin: Option<&str>,
        query: &str,
    ) -> Result<Term, (u16, String)> {
        let url = format!("wss://{}/v1/webapi/terminal?{query}", self.addr);
        let mut req = url.into_client_request().unwrap();
        let h = req.headers_mut();
        h.insert("sec-websocket-protocol", PROTOCOL.parse().unwrap());
        if let Some(o) = origin {
            h.insert("origin", o.parse().unwrap());
        }
        if let Some(c) = &self.cookie {
            h.insert(
                "cookie",
                format!("__Host-sallyport_session={c}").parse().unwrap(),
            );
        }
        let tcp = TcpStream::connect(&self.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let stream = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .unwrap();
        match tokio_tungstenite::client_async(req, stream).await {
            Ok((ws, resp)) => {
                let proto = resp
                    .headers()
                    .get("sec-websocket-protocol")
                    .map(|v| v.to_str().unwrap().to_string());
                assert_eq!(proto.as_deref(), Some(PROTOCOL));
                Ok(Term {
                    ws,
                    out: Vec::new(),
                    texts: Vec::new(),
                    close: None,
                })
            }
            Err(tungstenite::Error::Http(resp)) => {
                let status = resp.status().as_u16();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).to_string())
                    .unwrap_or_default();
                Err((status, body))
            }
            Err(e) => panic!("upgrade failed: {e}"),
        }
    }

    pub async fn terminal(&self, query: &str) -> Term {
        self.terminal_from(Some(&self.origin.clone()), query)
            .await
            .unwrap()
    }
}

pub type Ws = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// One terminal: what came out of it so far.
pub struct Term {
    pub ws: Ws,
    pub out: Vec<u8>,
    pub texts: Vec<Value>,
    pub close: Option<(u16, String)>,
}

impl Term {
    pub async fn input(&mut self, bytes: &[u8]) {
        self.ws
            .send(Message::Binary(bytes.to_vec().into()))
            .await
            .unwrap();
    }

    pub async fn text(&mut self, v: &str) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    /// Reads one message into the record; false when the socket ended.
    pub async fn read_one(&mut self) -> bool {
        match self.ws.next().await {
            Some(Ok(Message::Binary(b))) => self.out.extend_from_slice(&b),
            Some(Ok(Message::Text(t))) => {
                self.texts.push(serde_json::from_str(t.as_str()).unwrap())
            }
            Some(Ok(Message::Close(f))) => {
                self.close = Some(
                    f.map(|f| (u16::from(f.code), f.reason.to_string()))
                        .unwrap_or((1005, String::new())),
                );
                return false;
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => {
                if self.close.is_none() {
                    self.close = Some((1006, String::new()));
                }
                return false;
            }
        }
        true
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.out).to_string()
    }

    /// Reads until the output contains `needle`.
    pub async fn wait_for(&mut self, needle: &str) {
        let ok = tokio::time::timeout(Duration::from_secs(20), async {
            while !self.screen().contains(needle) {
                if !self.read_one().await {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(
            matches!(ok, Ok(true)),
            "never saw {needle:?}; screen: {:?}; frames: {:?}; close: {:?}",
            self.screen(),
            self.texts,
            self.close
        );
    }

    /// Reads until the socket closes; returns the close code.
    pub async fn closed(&mut self) -> u16 {
        let _ = tokio::time::timeout(Duration::from_secs(20), async {
            while self.read_one().await {}
        })
        .await;
        self.close.as_ref().map(|c| c.0).unwrap_or_else(|| {
            panic!(
                "never closed; frames: {:?}; screen: {:?}",
                self.texts,
                self.screen()
            )
        })
    }

    /// The text frames of `type`.
    pub fn frames(&self, kind: &str) -> Vec<&Value> {
        self.texts.iter().filter(|t| t["type"] == kind).collect()
    }

    pub fn error(&self) -> String {
        self.frames("error")
            .last()
            .and_then(|e| e["message"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}
