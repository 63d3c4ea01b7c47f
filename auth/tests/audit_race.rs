//! Two auth instances on one PostgreSQL database, started at once on an empty one, write the
//! audit chain's very first records at the same moment: the chain must stay one line (no
//! record lost to a clash over record 1, none written twice) and verify.
//! Needs `SALLYPORT_TEST_POSTGRES` (set by `scripts/test` after it starts PostgreSQL).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sallyport_auth::{AuthConfig, AuthServer};
use sallyport_core::api::AddUser;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_writing_the_first_records_at_once_keep_one_chain() {
    sallyport_core::install_crypto_provider();
    // Several fresh databases: the clash, when there is one, is a matter of timing.
    for round in 0..4 {
        let db = common::PgDatabase::create(&format!("sp_audit_race_{round}"));
        let mut cfg = AuthConfig::new("race", &db.url);
        cfg.second_factor = false;
        let (a, b) = tokio::join!(AuthServer::open(cfg.clone()), AuthServer::open(cfg.clone()));
        let (a, b) = (a.unwrap(), b.unwrap());
        let add = |auth: std::sync::Arc<AuthServer>, name: String| async move {
            auth.add_user(
                &AddUser {
                    name,
                    roles: vec!["access".into()],
                    logins: vec![],
                },
                "test",
            )
            .await
        };
        let per = 8;
        let mut tasks = Vec::new();
        for i in 0..per {
            tasks.push(tokio::spawn(add(a.clone(), format!("a{i}"))));
            tasks.push(tokio::spawn(add(b.clone(), format!("b{i}"))));
        }
        for t in tasks {
            let r = t.await.unwrap();
            assert!(
                r.is_ok(),
                "round {round}: a user add (and its audit record) failed: {r:?}"
            );
        }
        let n = a.audit_count().await.unwrap();
        assert_eq!(
            n,
            2 * per as u64,
            "round {round}: one record per user added"
        );
        let v = b.audit_verify().await.unwrap();
        assert!(v.ok, "round {round}: {}", v.message);
        drop((a, b));
    }
}

/// An empty chain verifies as empty, on both databases' start (nothing written yet).
#[tokio::test]
async fn a_fresh_log_verifies_before_its_first_record() {
    sallyport_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}?mode=rwc", dir.path().join("a.db").display());
    let auth = AuthServer::open(AuthConfig::new("fresh", &url))
        .await
        .unwrap();
    let v = auth.audit_verify().await.unwrap();
    assert!(v.ok, "{}", v.message);
    assert_eq!(auth.audit_count().await.unwrap(), 0);
}
