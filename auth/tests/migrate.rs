//! `Backend::copy_into` (`sallyport storage migrate`) past one batch of rows: a source that
//! cannot be copied whole leaves the target's tables empty, and once it can, every row arrives
//! and the chain verifies on PostgreSQL with the same CA pins. The end-to-end flow through the
//! daemon is `tests/tests/daemon.rs`. Needs `SALLYPORT_TEST_POSTGRES` (set by `scripts/test`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sallyport_auth::backend::Backend;
use sallyport_auth::{AuthConfig, AuthServer};
use sallyport_core::audit::{Event, EventType};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_all_rows_or_none() {
    sallyport_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!(
        "sqlite:{}?mode=rwc",
        dir.path().join("sallyport.db").display()
    );
    let mut cfg = AuthConfig::new("copy", &sqlite);
    cfg.second_factor = false;
    let auth = AuthServer::open(cfg).await.unwrap();
    let pins = auth.authorities.pins().unwrap();
    // More audit records than one INSERT takes (1,000 rows at most).
    for i in 0..2_345 {
        auth.emit(
            Event::new(EventType::LockDelete, Some("admin")).with("lock_id", format!("l{i}")),
        )
        .await
        .unwrap();
    }
    let records = auth.audit_count().await.unwrap();
    assert!(records >= 2_345, "{records}");
    // A row PostgreSQL cannot take (text where the schema says BIGINT, which SQLite keeps),
    // in the last table copied.
    sqlx::query(
        "INSERT INTO web_sso_pending (binding_hash, client_key, private_key, created, expires) \
         VALUES ('x', 'k', 'p', 'not a number', 0)",
    )
    .execute(&auth.backend.pool)
    .await
    .unwrap();
    let source = auth.backend.clone();

    let db = common::PgDatabase::create("sp_copy");
    let target = Backend::open(&db.url).await.unwrap();
    let refused = source.copy_into(&target).await.unwrap_err().to_string();
    assert!(refused.contains("web_sso_pending"), "{refused}");
    let count = |t: &'static str| {
        let pool = target.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {t}")))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("audit_events").await,
        0,
        "nothing of a failed copy stays"
    );
    assert_eq!(count("cert_authorities").await, 0);

    sqlx::query("DELETE FROM web_sso_pending")
        .execute(&auth.backend.pool)
        .await
        .unwrap();
    let copied = source.copy_into(&target).await.unwrap();
    let audit = copied
        .iter()
        .find(|(t, _)| t == "audit_events")
        .map(|(_, n)| *n);
    assert_eq!(audit, Some(records as u64));
    assert_eq!(count("audit_events").await, records as i64);
    // A second copy finds the target full and leaves it so.
    let again = source.copy_into(&target).await.unwrap_err().to_string();
    assert!(again.contains("already holds data"), "{again}");
    assert_eq!(count("audit_events").await, records as i64);
    drop(auth);

    // The same cluster on PostgreSQL: its CAs, and a chain that verifies.
    let mut cfg = AuthConfig::new("copy", &db.url);
    cfg.second_factor = false;
    let moved = AuthServer::open(cfg).await.unwrap();
    assert_eq!(moved.authorities.pins().unwrap(), pins);
    let v = moved.audit_verify().await.unwrap();
    assert!(v.ok, "{}", v.message);
}
