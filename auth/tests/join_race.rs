//! Proxies, and agents, joining at once under one name, on PostgreSQL (what several auth
//! instances share): one gets the name, the other a clear conflict, and its one-time token is
//! not spent by losing (it joins at once under another name). Needs `SALLYPORT_TEST_POSTGRES`
//! (`scripts/test`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use base64::Engine;
use rcgen::PublicKeyData;
use russh::keys::ssh_key::{Algorithm, PrivateKey};
use sallyport_auth::{AuthConfig, AuthError, AuthServer};
use sallyport_core::api::{AddJoinToken, JoinRequest, ProxyJoinRequest, TokenKind};

fn request(token: &str, name: &str) -> ProxyJoinRequest {
    let tls = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ssh = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    ProxyJoinRequest {
        token: token.into(),
        name: name.into(),
        tls_spki: base64::engine::general_purpose::STANDARD.encode(tls.subject_public_key_info()),
        ssh_host_key: ssh.public_key().to_openssh().unwrap(),
        dns_names: vec![],
    }
}

fn agent_request(token: &str, name: &str) -> JoinRequest {
    let p = request(token, name);
    JoinRequest {
        token: p.token,
        nodename: p.name,
        labels: Default::default(),
        tls_spki: p.tls_spki,
        ssh_host_key: p.ssh_host_key,
        remote_addr: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_or_agent_that_loses_a_name_race_keeps_its_token() {
    sallyport_core::install_crypto_provider();
    let db = common::PgDatabase::create("sp_join_race");
    let cfg = AuthConfig::new("joins", &db.url);
    // Two auth instances, as two proxies would each reach one.
    let a = AuthServer::open(cfg.clone()).await.unwrap();
    let b = AuthServer::open(cfg).await.unwrap();
    let token = || async {
        let add = AddJoinToken {
            kind: TokenKind::Proxy,
            ttl_secs: 600,
        };
        a.add_join_token(&add, "test").await.unwrap().token
    };
    for round in 0..6 {
        let (t1, t2) = (token().await, token().await);
        let name = format!("edge{round}");
        let (q1, q2) = (request(&t1, &name), request(&t2, &name));
        let (r1, r2) = tokio::join!(
            a.join_proxy(&q1, "127.0.0.1:1"),
            b.join_proxy(&q2, "127.0.0.1:2"),
        );
        let (lost, loser_token) = match (&r1, &r2) {
            (Ok(_), Err(e)) => (e, &t2),
            (Err(e), Ok(_)) => (e, &t1),
            _ => panic!("round {round}: exactly one join must win the name: {r1:?} / {r2:?}"),
        };
        assert!(
            matches!(lost, AuthError::Conflict(m) if m.contains("already taken")),
            "round {round}: {lost:?}"
        );
        // The loser's token still works, once, under another name.
        let retry = request(loser_token, &format!("edge{round}-b"));
        a.join_proxy(&retry, "127.0.0.1:2").await.unwrap();
        let again = request(loser_token, &format!("edge{round}-c"));
        assert!(a.join_proxy(&again, "127.0.0.1:2").await.is_err());
    }
    let node_token = || async {
        let add = AddJoinToken {
            kind: TokenKind::Node,
            ttl_secs: 600,
        };
        a.add_join_token(&add, "test").await.unwrap().token
    };
    for round in 0..6 {
        let (t1, t2) = (node_token().await, node_token().await);
        let name = format!("web{round}");
        let (q1, q2) = (agent_request(&t1, &name), agent_request(&t2, &name));
        let (r1, r2) = tokio::join!(a.join(&q1, "127.0.0.1:1"), b.join(&q2, "127.0.0.1:2"));
        let (lost, loser_token) = match (&r1, &r2) {
            (Ok(_), Err(e)) => (e, &t2),
            (Err(e), Ok(_)) => (e, &t1),
            _ => panic!("round {round}: exactly one agent must win the name: {r1:?} / {r2:?}"),
        };
        assert!(
            matches!(lost, AuthError::Conflict(m) if m.contains("already taken")),
            "round {round}: {lost:?}"
        );
        let retry = agent_request(loser_token, &format!("web{round}-b"));
        a.join(&retry, "127.0.0.1:2").await.unwrap();
        let again = agent_request(loser_token, &format!("web{round}-c"));
        assert!(a.join(&again, "127.0.0.1:2").await.is_err());
    }
}
