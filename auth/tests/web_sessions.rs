//! Web sessions kept by auth for every proxy: what one proxy opens, another finds; a sign-out,
//! a lock or a sign-in past the per-user limit ends it for all, with the words every proxy's
//! terminals close with. In process on the real router, as a real proxy certificate, over
//! SQLite (and PostgreSQL when `SALLYPORT_TEST_POSTGRES` is set: two auth instances on it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use rustls::pki_types::CertificateDer;
use sallyport_auth::{AuthConfig, AuthServer};
use sallyport_core::api::{AddLock, AddUser, WebSessionRecord};
use sallyport_core::https::{PeerCertificates, RemoteAddr};
use sallyport_core::x509::{ed25519_spki, pem_to_der};
use serde_json::{Value, json};
use tower::ServiceExt;

struct Instance {
    auth: Arc<AuthServer>,
    proxy: Vec<CertificateDer<'static>>,
}

impl Instance {
    async fn open(url: &str) -> Instance {
        sallyport_core::install_crypto_provider();
        let auth = AuthServer::open(AuthConfig::new("websessions", url))
            .await
            .unwrap();
        auth.register_local_proxy(&Default::default())
            .await
            .unwrap();
        let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[6; 32]);
        let pem = auth
            .issue_service_cert(
                &ed25519_spki(&kp.public.0),
                "proxy",
                "proxy",
                vec![],
                Duration::from_secs(3600),
                false,
            )
            .unwrap();
        Instance {
            auth,
            proxy: vec![pem_to_der(&pem).unwrap()],
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        req.extensions_mut()
            .insert(PeerCertificates(Arc::new(self.proxy.clone())));
        req.extensions_mut()
            .insert(RemoteAddr("192.0.2.7:40000".parse().unwrap()));
        let resp = sallyport_auth::api::router(self.auth.clone())
            .oneshot(req)
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 22)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes)
                .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned())),
        )
    }
}

fn record(user: &str, n: u32) -> (String, Value) {
    let hash = hex::encode(sallyport_core::sha256(
        format!("{user}-{n}-{}", uuid()).as_bytes(),
    ));
    let r = WebSessionRecord {
        id_hash: hash.clone(),
        user: user.into(),
        roles: vec!["access".into()],
        logins: vec!["root".into()],
        cert_chain_pem: "CHAIN".into(),
        key_pem: "KEY".into(),
        csrf_token: "csrf".into(),
        created_ms: 0,
        last_input_ms: 0,
        expires: sallyport_core::unix_now() as u64 + 3600,
        valid_until: "later".into(),
        idle_ms: 60_000,
    };
    (hash, serde_json::to_value(r).unwrap())
}

fn uuid() -> String {
    sallyport_core::random_hex(8)
}

async fn two_instances() -> (Instance, Instance, Option<tempfile::TempDir>) {
    match std::env::var("SALLYPORT_TEST_POSTGRES")
        .ok()
        .filter(|u| !u.is_empty())
    {
        Some(base) => {
            // A database of its own on the shared server.
            let db = format!("ws_{}", sallyport_core::random_hex(6));
            let admin = format!("{base}/postgres");
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&admin).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
                .execute(&pool)
                .await
                .unwrap();
            let url = format!("{base}/{db}");
            let a = Instance::open(&url).await;
            let b = Instance::open(&url).await;
            (a, b, None)
        }
        None => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite:{}?mode=rwc", dir.path().join("ws.db").display());
            let a = Instance::open(&url).await;
            let b = Instance::open(&url).await;
            (a, b, Some(dir))
        }
    }
}

#[tokio::test]
async fn a_session_opened_through_one_instance_is_found_touched_and_ended_through_another() {
    let (a, b, _dir) = two_instances().await;
    for name in ["alice", "bob"] {
        a.auth
            .add_user(
                &AddUser {
                    name: name.into(),
                    roles: vec!["access".into()],
                    logins: vec![],
                },
                "test",
            )
            .await
            .unwrap();
    }
    let (h, r) = record("alice", 0);
    let (status, created) = a.call("POST", "/v1/web-sessions", Some(r)).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["evicted"], json!([]));
    let (status, got) = b.call("GET", &format!("/v1/web-sessions/{h}"), None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["user"], "alice");
    assert_eq!(got["key_pem"], "KEY");
    assert_eq!(got["csrf_token"], "csrf");

    // Input through one is seen through the other; the latest wins.
    let at = sallyport_core::unix_now_ms();
    let (status, _) = b
        .call(
            "POST",
            &format!("/v1/web-sessions/{h}/touch"),
            Some(json!({"last_input_ms": at})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, older) = a
        .call(
            "POST",
            &format!("/v1/web-sessions/{h}/touch"),
            Some(json!({"last_input_ms": 1})),
        )
        .await;
    assert_eq!(older, json!({}));
    let unknown = "f".repeat(64);
    let (status, states) = a
        .call(
            "POST",
            "/v1/web-sessions/check",
            Some(json!({"id_hashes": [h, unknown]})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        states.as_array().unwrap().len(),
        1,
        "an unknown hash is not answered: {states}"
    );
    assert_eq!(states[0]["last_input_ms"], at);
    assert!(states[0].get("ended").is_none());

    // Signed out through b: a's check says so, in the words a's terminals close with, and
    // nobody finds it again.
    let (status, _) = b
        .call(
            "POST",
            &format!("/v1/web-sessions/{h}/end"),
            Some(json!({"code": 4401, "message": "you signed out"})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, states) = a
        .call(
            "POST",
            "/v1/web-sessions/check",
            Some(json!({"id_hashes": [h]})),
        )
        .await;
    assert_eq!(
        states[0]["ended"],
        json!({"code": 4401, "message": "you signed out"})
    );
    let (status, _) = a.call("GET", &format!("/v1/web-sessions/{h}"), None).await;
    assert_eq!(status, 404);
    let (status, _) = a
        .call(
            "POST",
            &format!("/v1/web-sessions/{h}/touch"),
            Some(json!({"last_input_ms": at})),
        )
        .await;
    assert_eq!(status, 404, "input does not bring it back");

    // A lock ends the user's sessions for every proxy, and they stay ended once it lifts.
    let (h2, r) = record("bob", 0);
    a.call("POST", "/v1/web-sessions", Some(r)).await;
    let lock = b
        .auth
        .add_lock(
            &AddLock {
                user: "bob".into(),
                message: Some("gone fishing".into()),
                ttl_secs: None,
            },
            "test",
        )
        .await
        .unwrap();
    let (_, states) = a
        .call(
            "POST",
            "/v1/web-sessions/check",
            Some(json!({"id_hashes": [h2]})),
        )
        .await;
    assert_eq!(states[0]["ended"]["code"], 4409);
    assert_eq!(
        states[0]["ended"]["message"],
        "user bob is locked: gone fishing"
    );
    b.auth.remove_lock(&lock.id, "test").await.unwrap();
    let (status, _) = a.call("GET", &format!("/v1/web-sessions/{h2}"), None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn signing_in_past_the_per_user_limit_ends_the_oldest_whichever_instance_opened_it() {
    let (a, b, _dir) = two_instances().await;
    let max = sallyport_core::api::MAX_WEB_SESSIONS_PER_USER;
    let mut hashes = vec![];
    for i in 0..max {
        let (h, r) = record("carol", i as u32);
        let by = if i % 2 == 0 { &a } else { &b };
        let (status, created) = by.call("POST", "/v1/web-sessions", Some(r)).await;
        assert_eq!((status, &created["evicted"]), (200, &json!([])), "{i}");
        hashes.push(h);
        // Distinct creation times.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (h, r) = record("carol", 99);
    let (_, created) = b.call("POST", "/v1/web-sessions", Some(r)).await;
    assert_eq!(created["evicted"], json!([hashes[0]]), "the oldest");
    let (_, states) = a
        .call(
            "POST",
            "/v1/web-sessions/check",
            Some(json!({"id_hashes": [hashes[0], hashes[1], h]})),
        )
        .await;
    let states = states.as_array().unwrap();
    let of = |x: &str| states.iter().find(|s| s["id_hash"] == x).unwrap().clone();
    assert_eq!(
        of(&hashes[0])["ended"]["message"],
        "too many web sessions: this one, the oldest, was signed out"
    );
    assert!(of(&hashes[1]).get("ended").is_none());
    assert!(of(&h).get("ended").is_none());
}

#[tokio::test]
async fn an_sso_sign_in_in_progress_is_read_by_any_instance_and_removed_once() {
    let (a, b, _dir) = two_instances().await;
    let h = "a".repeat(64);
    let (status, _) = a
        .call(
            "POST",
            "/v1/web-sso",
            Some(json!({"binding_hash": h, "client_key": "ck", "key_pem": "KEY"})),
        )
        .await;
    assert_eq!(status, 200);
    for _ in 0..2 {
        let (status, got) = b.call("GET", &format!("/v1/web-sso/{h}"), None).await;
        assert_eq!(
            (status, &got["client_key"]),
            (200, &json!("ck")),
            "a look uses nothing up"
        );
    }
    assert_eq!(
        b.call("DELETE", &format!("/v1/web-sso/{h}"), None).await.0,
        200
    );
    assert_eq!(
        a.call("GET", &format!("/v1/web-sso/{h}"), None).await.0,
        404
    );
    assert_eq!(
        a.call("DELETE", &format!("/v1/web-sso/{h}"), None).await.0,
        404
    );
}
