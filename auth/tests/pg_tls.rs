//! Auth's storage on PostgreSQL over TLS (`sslmode` in the connection string): the CA keys and
//! every record cross that connection. The test server is Debian's PostgreSQL with its defaults
//! (`ssl = on`, the `ssl-cert` package's self-signed "snakeoil" certificate for `localhost`).
//! Needs `SALLYPORT_TEST_POSTGRES` (set by `scripts/test`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sallyport_auth::backend::Backend;

/// Debian's default server certificate, which is its own CA.
const SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

async fn encrypted(b: &Backend) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&b.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn storage_speaks_tls_and_checks_the_servers_certificate() {
    sallyport_core::install_crypto_provider();
    let db = common::PgDatabase::create("sp_tls");
    // The name the server's certificate carries.
    let url = db.url.replace("@127.0.0.1:", "@localhost:");
    assert_ne!(url, db.url, "the test server is reached at 127.0.0.1");

    let b = Backend::open(&format!("{url}?sslmode=require"))
        .await
        .unwrap();
    assert!(encrypted(&b).await, "sslmode=require is encrypted");
    b.pool.close().await;

    let b = Backend::open(&format!("{url}?sslmode=verify-full&sslrootcert={SNAKEOIL}"))
        .await
        .unwrap();
    assert!(encrypted(&b).await);
    b.pool.close().await;

    // Another CA than the one that signed the server's certificate: refused, naming why.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(&other, ca.cert.pem()).unwrap();
    let refused = Backend::open(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        other.display()
    ))
    .await
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        refused.contains("cannot open storage") && refused.contains("certificate"),
        "{refused}"
    );
    assert!(
        !refused.contains("sallyport_test:sallyport_test"),
        "{refused}"
    );
}
