//! A real russh server and client joined by an in-memory pipe, for the tests of our russh
//! patches (`vendor/russh/PATCHES.md`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use russh::keys::ssh_key::PrivateKey;

/// A client that takes any host key (the server is this test's own).
pub struct AnyHostKey;

impl russh::client::Handler for AnyHostKey {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// Runs `server` (under `server_config`, given a fresh host key) and connects `client` (under
/// `client_config`) to it over a pipe, authenticated with that same key as user "test" (the
/// server's handler decides whether to accept it).
pub async fn connect<S, C>(
    server: S,
    server_config: russh::server::Config,
    client: C,
    client_config: russh::client::Config,
) -> russh::client::Handle<C>
where
    S: russh::server::Handler<Error = russh::Error> + Send + 'static,
    C: russh::client::Handler<Error = russh::Error> + Send + 'static,
{
    let key =
        PrivateKey::random(&mut rand::rng(), russh::keys::ssh_key::Algorithm::Ed25519).unwrap();
    let server_config = russh::server::Config {
        keys: vec![key.clone()],
        ..server_config
    };
    let (a, b) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = russh::server::run_stream(Arc::new(server_config), a, server).await {
            let _ = running.await;
        }
    });
    let mut handle = russh::client::connect_stream(Arc::new(client_config), b, client)
        .await
        .unwrap();
    let auth = handle
        .authenticate_publickey(
            "test",
            russh::keys::PrivateKeyWithHashAlg::new(Arc::new(key), None),
        )
        .await
        .unwrap();
    assert!(auth.success());
    handle
}
