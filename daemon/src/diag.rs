//! The diagnostics listener (`sallyport.diag_addr`, `--diag-addr`; off unless set): plain HTTP
//! for a load balancer, an orchestrator and Prometheus.
//!
//! - `/healthz`: 200 `ok` while the process serves.
//! - `/readyz`: 200 `ready` when every check of what this process runs passes — auth: its
//!   database answers `SELECT 1`; a proxy: auth answers its ping (over the proxy's own mTLS
//!   client); an agent: its tunnel to the proxy is up. Otherwise 503 with one line saying which
//!   check failed and why. Each check is bounded by [`CHECK_TIMEOUT`].
//! - `/metrics`: `sallyport_core::metrics`, Prometheus text format.
//!
//! It serves no secret and changes nothing: what it shows is counts, the names of closed
//! vocabularies, and a readiness reason (an error's text, never a connection string). Being
//! plain HTTP, it belongs on a private address.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sallyport_auth::AuthServer;
use sallyport_core::metrics::{CertificateKind, TunnelKind, metrics};
use sallyport_proxy::AuthClient;

/// How long one readiness check may take before it counts as failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

type Probe =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// What this process serves, as the diagnostics listener sees it: the readiness checks, and
/// the certificates whose expiry `/metrics` shows.
#[derive(Clone, Default)]
pub struct Serves {
    checks: Vec<(&'static str, Probe)>,
}

impl Serves {
    fn check<F, Fut>(mut self, name: &'static str, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.checks
            .push((name, Arc::new(move || Box::pin(probe()) as Pin<Box<_>>)));
        self
    }

    /// Auth, with its TLS certificate chain (leaf first): ready while its database answers.
    pub fn auth(self, auth: &Arc<AuthServer>, chain_pem: &str) -> Self {
        record_tls_expiry(CertificateKind::AuthTls, chain_pem);
        let auth = auth.clone();
        self.check("database", move || {
            let auth = auth.clone();
            async move { auth.backend.ping().await.map_err(|e| e.to_string()) }
        })
    }

    /// A proxy, with its TLS chain and SSH host certificate: ready while auth answers it.
    pub fn proxy(
        self,
        client: &AuthClient,
        chain_pem: &str,
        ssh_host_cert: &russh::keys::ssh_key::Certificate,
    ) -> Self {
        record_tls_expiry(CertificateKind::ProxyTls, chain_pem);
        metrics().certificate_expires(
            CertificateKind::ProxySshHost,
            i64::try_from(ssh_host_cert.valid_before()).unwrap_or(i64::MAX),
        );
        let client = client.clone();
        self.check("auth", move || {
            let client = client.clone();
            async move { auth_answers(&client).await }
        })
    }

    /// An agent serving `kind` (its certificates are recorded by its tunnel): ready while its
    /// tunnel to the proxy is up.
    pub fn agent(self, kind: TunnelKind) -> Self {
        let name = match kind {
            TunnelKind::Node => "node tunnel",
            TunnelKind::Kube => "kube tunnel",
        };
        self.check(name, move || async move {
            match metrics().agent_tunnel_is_up(kind) {
                Some(true) => Ok(()),
                Some(false) => Err("not connected to the proxy; reconnecting".into()),
                None => Err("not started yet".into()),
            }
        })
    }

    /// Runs every check at once; the first failure in the order they were added, as one line.
    async fn ready(&self) -> Result<(), String> {
        let runs = self.checks.iter().map(|(name, probe)| {
            let run = probe();
            async move {
                match tokio::time::timeout(CHECK_TIMEOUT, run).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(why)) => Err(format!("{name}: {why}")),
                    Err(_) => Err(format!(
                        "{name}: no answer within {} s",
                        CHECK_TIMEOUT.as_secs()
                    )),
                }
            }
        });
        let results = futures::future::join_all(runs).await;
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            // One line, whatever the error's text held.
            Some(why) => Err(why.split_whitespace().collect::<Vec<_>>().join(" ")),
        }
    }
}

/// Auth answers the proxy as itself (the locks it polls: a route that checks the proxy's
/// certificate and registration and reads the database), so a removed proxy, an expired
/// certificate or a broken auth is not ready.
async fn auth_answers(client: &AuthClient) -> Result<(), String> {
    match client
        .call(
            reqwest::Method::GET,
            sallyport_core::routes::auth::LOCKS,
            None,
        )
        .await
    {
        Ok((200, _)) => Ok(()),
        Ok((status, body)) => Err(format!(
            "auth answered {status}: {}",
            serde_json::from_slice::<sallyport_core::api::ErrorBody>(&body)
                .map(|b| b.error)
                .unwrap_or_default()
        )),
        Err(e) => Err(e.to_string()),
    }
}

fn record_tls_expiry(kind: CertificateKind, chain_pem: &str) {
    let leaf = sallyport_core::x509::pem_to_ders(chain_pem)
        .ok()
        .and_then(|c| c.into_iter().next());
    if let Some((_, not_after)) = leaf.and_then(|l| sallyport_core::x509::spki_and_expiry(&l).ok())
    {
        metrics().certificate_expires(kind, not_after);
    }
}

fn router(serves: Serves) -> Router {
    let serves = Arc::new(serves);
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let serves = serves.clone();
                async move {
                    match serves.ready().await {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                    }
                }
            }),
        )
        .route("/metrics", get(metrics_text))
}

async fn metrics_text() -> Response {
    (
        [(header::CONTENT_TYPE, sallyport_core::metrics::CONTENT_TYPE)],
        sallyport_core::metrics::encode(),
    )
        .into_response()
}

/// Starts the listener at `addr` when one is set, serving what `serves` describes; returns the
/// line `sallyport start` prints for it (`diag     http://ADDR`, the port the kernel gave for
/// port 0).
pub async fn start(addr: Option<SocketAddr>, serves: Serves) -> Result<Option<String>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for diagnostics (sallyport.diag_addr, --diag-addr)")
    })?;
    let bound = listener
        .local_addr()
        .context("cannot read the address diagnostics listen on")?;
    let app = router(serves);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the diagnostics listener stopped");
        }
    });
    Ok(Some(format!("diag     http://{bound}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(serves: Serves, path: &str) -> (StatusCode, String) {
        let resp = router(serves)
            .oneshot(Request::get(path).body(Body::empty()).unwrap_or_default())
            .await
            .unwrap_or_else(|e| match e {});
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn ready_only_when_every_check_passes_and_the_reason_is_one_line() {
        let ok = || async { Ok(()) };
        let cases: Vec<(Serves, StatusCode, &str)> = vec![
            (Serves::default(), StatusCode::OK, "ready\n"),
            (
                Serves::default().check("database", ok),
                StatusCode::OK,
                "ready\n",
            ),
            (
                Serves::default()
                    .check("database", ok)
                    .check("auth", || async {
                        Err("auth service unreachable\nat x".into())
                    }),
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: auth: auth service unreachable at x\n",
            ),
            (
                Serves::default().check("database", || async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(())
                }),
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: database: no answer within 2 s\n",
            ),
        ];
        for (serves, status, body) in cases {
            assert_eq!(get(serves, "/readyz").await, (status, body.to_string()));
        }
    }

    #[tokio::test]
    async fn an_agent_is_ready_only_while_its_tunnel_is_up() {
        let serves = Serves::default().agent(TunnelKind::Kube);
        let (status, body) = get(serves.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: kube tunnel: not started yet\n");
        metrics().agent_runs(TunnelKind::Kube);
        let (_, body) = get(serves.clone(), "/readyz").await;
        assert!(body.contains("not connected to the proxy"), "{body}");
        metrics().agent_tunnel(TunnelKind::Kube, true);
        assert_eq!(get(serves, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn health_and_metrics_answer_and_nothing_else_does() {
        assert_eq!(
            get(Serves::default(), "/healthz").await,
            (StatusCode::OK, "ok\n".into())
        );
        let (status, text) = get(Serves::default(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            text.contains("# TYPE sallyport_sessions_active gauge"),
            "{text}"
        );
        assert_eq!(get(Serves::default(), "/").await.0, StatusCode::NOT_FOUND);
    }
}
