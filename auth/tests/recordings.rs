//! Where auth reads a recording from: its own process's recordings directory first (a running
//! session's, or one waiting for its upload), then the recording store; with no directory (auth
//! on another host than the proxy) a running session's recording is said to be on its proxy
//! until the session ends. Streamed either way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use sallyport_auth::{AuthConfig, AuthError, AuthServer};
use sallyport_recordings::RecordingStore;

async fn session(auth: &AuthServer, status: &str) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    sqlx::query("INSERT INTO sessions (id, user_name, login, node, node_id, kind, start, status) VALUES ($1, 'alice', 'root', 'web1', 'n1', 'shell', 0, $2)")
        .bind(&id)
        .bind(status)
        .execute(&auth.backend.pool)
        .await
        .unwrap();
    id
}

async fn read(auth: &AuthServer, id: &str) -> Result<Vec<u8>, AuthError> {
    let mut s = auth.open_recording(id, Some("alice")).await?;
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    Ok(out)
}

fn not_found(r: Result<Vec<u8>, AuthError>) -> String {
    match r {
        Err(AuthError::NotFound(m)) => m,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_proxys_directory_first_then_the_store_and_a_running_session_on_another_host() {
    sallyport_core::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store = RecordingStore::local(&store_dir).unwrap();
    let url = format!("sqlite:{}?mode=rwc", tmp.path().join("db").display());
    // Auth on a host of its own: no recordings directory, only the store.
    let mut cfg = AuthConfig::new("rec", &url);
    cfg.recording_store = Some(store.clone());
    let auth = AuthServer::open(cfg).await.unwrap();
    let running = session(&auth, "running").await;
    let said = not_found(read(&auth, &running).await);
    assert!(
        said.contains(&format!(
            "session {running} is still running: its recording is uploaded to {} when the session ends",
            store.uri()
        )),
        "{said}"
    );
    let ended = session(&auth, "complete").await;
    let said = not_found(read(&auth, &ended).await);
    assert!(said.contains("it is not in file://"), "{said}");
    assert_eq!(
        auth.session_detail(&ended, None)
            .await
            .unwrap()
            .recording_size,
        None
    );
    std::fs::write(store_dir.join(format!("{ended}.cast")), b"from the store").unwrap();
    assert_eq!(read(&auth, &ended).await.unwrap(), b"from the store");
    assert_eq!(
        auth.session_detail(&ended, None)
            .await
            .unwrap()
            .recording_size,
        Some(14)
    );
    // Someone else's: refused before anything is read.
    assert!(matches!(
        auth.open_recording(&ended, Some("bob")).await,
        Err(AuthError::AccessDenied(_))
    ));
    drop(auth);

    // All-in-one: the proxy's directory in this process is read first.
    let local = tmp.path().join("recordings");
    std::fs::create_dir_all(&local).unwrap();
    let mut cfg = AuthConfig::new("rec", &url);
    cfg.recordings_dir = Some(local.clone());
    cfg.recording_store = Some(store);
    let auth = AuthServer::open(cfg).await.unwrap();
    std::fs::write(local.join(format!("{ended}.cast")), b"not yet uploaded").unwrap();
    assert_eq!(read(&auth, &ended).await.unwrap(), b"not yet uploaded");
    assert_eq!(
        auth.session_detail(&ended, None)
            .await
            .unwrap()
            .recording_size,
        Some(16)
    );
    std::fs::remove_file(local.join(format!("{ended}.cast"))).unwrap();
    assert_eq!(read(&auth, &ended).await.unwrap(), b"from the store");
    // A running session whose proxy is this process is not yet recorded anywhere: no claim
    // that it is elsewhere.
    let said = not_found(read(&auth, &running).await);
    assert!(said.contains("it is not in file://"), "{said}");
}
