//! The store against a local directory and against a real S3 API (`moto_server`, from PyPI
//! `moto[server]`, on a loopback port).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// A `moto_server` on a free loopback port, killed when dropped.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Moto {
    /// `auth`: moto checks credentials (by default it takes any).
    fn start(auth: bool) -> Moto {
        sallyport_core::install_crypto_provider();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new("moto_server");
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if auth {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let child = cmd
            .spawn()
            .expect("moto_server (pip install 'moto[server]'; scripts/test does)");
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { child, endpoint }
    }

    /// Creates a bucket through the S3 API (moto takes an unsigned `PUT /bucket`).
    async fn bucket(&self, name: &str) {
        let r = reqwest::Client::new()
            .put(format!("{}/{name}", self.endpoint))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text().await);
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn creds() -> Credentials {
    Credentials {
        key_id: "AKIDTESTTESTTEST".into(),
        secret: "a-secret-never-printed".into(),
        token: None,
    }
}

fn s3(uri: &str, endpoint: &str) -> RecordingStore {
    RecordingStore::s3_with(
        &StoreConfig {
            uri: uri.into(),
            endpoint: Some(endpoint.into()),
            region: Some("us-east-1".into()),
        },
        &creds(),
    )
    .unwrap()
}

const ID: &str = "0f9f7f5e-1111-4222-8333-944444444444";

/// A file of `len` bytes that is not the same from part to part.
fn sample(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let p = dir.join(format!("sample-{len}"));
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

async fn read_all(store: &RecordingStore, id: &str) -> Option<Vec<u8>> {
    let (size, mut s) = store.open(id).await.unwrap()?;
    let mut out = Vec::new();
    let mut largest = 0;
    while let Some(chunk) = s.next().await {
        let chunk = chunk.unwrap();
        largest = largest.max(chunk.len());
        out.extend_from_slice(&chunk);
    }
    assert_eq!(out.len() as u64, size);
    // A read arrives in pieces, never as one buffer of the whole.
    assert!(largest <= PART, "a chunk of {largest} bytes");
    Some(out)
}

#[test]
fn a_uri_names_a_store_or_says_what_to_write() {
    let cfg = |uri: &str, endpoint: Option<&str>| StoreConfig {
        uri: uri.into(),
        endpoint: endpoint.map(Into::into),
        region: None,
    };
    for (c, said) in [
        (cfg("gs://bucket/x", None), "unknown scheme \"gs\""),
        (cfg("bucket/x", None), "relative URL without a base"),
        (cfg("s3:///x", None), "no bucket"),
        (
            cfg("s3://key:secret@bucket/x", None),
            "credentials do not go in the uri",
        ),
        (cfg("s3://bucket/x?region=eu", None), "no query or fragment"),
        (cfg("file://host/tmp/x", None), "a file uri has no host"),
        (
            cfg("file:///tmp/x", Some("http://127.0.0.1:1")),
            "endpoint and region are for an s3:// store only",
        ),
    ] {
        let e = RecordingStore::from_config(&c).unwrap_err().to_string();
        assert!(e.contains(said), "{c:?}: {e}");
        assert!(e.starts_with("recordings: "), "{e}");
    }
    for endpoint in ["ftp://127.0.0.1:9000", "127.0.0.1:9000", "http://"] {
        let e = RecordingStore::s3_with(&cfg("s3://bucket", Some(endpoint)), &creds())
            .unwrap_err()
            .to_string();
        assert!(e.contains("use http(s)://HOST:PORT"), "{endpoint}: {e}");
    }
}

#[tokio::test]
async fn a_local_store_keeps_the_data_dir_layout_and_streams_in_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let recordings = dir.path().join("recordings");
    let store = RecordingStore::local(&recordings).unwrap();
    assert!(store.is_dir(&recordings));
    assert!(!store.is_dir(dir.path()));
    assert_eq!(store.size(ID).await.unwrap(), None);
    assert!(store.open(ID).await.unwrap().is_none());
    // Written where the proxy writes it: `<dir>/<id>.cast`.
    let data = b"{\"version\": 2}\n[0.1, \"o\", \"hi\"]\n";
    std::fs::write(recordings.join(format!("{ID}.cast")), data).unwrap();
    assert_eq!(store.size(ID).await.unwrap(), Some(data.len() as u64));
    assert_eq!(read_all(&store, ID).await.unwrap(), data);
    // Only a session id names a file.
    for id in ["../x", "a/b", "", "x.cast"] {
        assert!(store.size(id).await.is_err(), "{id}");
    }
}

#[tokio::test]
async fn a_file_store_elsewhere_takes_uploads_whole_and_again() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    let store = RecordingStore::from_config(&StoreConfig {
        uri: format!("file://{}", target.display()),
        ..StoreConfig::default()
    })
    .unwrap();
    assert!(!store.is_dir(&dir.path().join("recordings")));
    // Past one part: a multipart upload.
    let (file, data) = sample(dir.path(), PART * 2 + 12345);
    assert_eq!(store.upload(ID, &file).await.unwrap(), data.len() as u64);
    assert_eq!(
        std::fs::read(target.join(format!("{ID}.cast"))).unwrap(),
        data
    );
    // Again (a proxy that crashed after uploading and before removing its copy): the same.
    store.upload(ID, &file).await.unwrap();
    assert_eq!(read_all(&store, ID).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_store_takes_small_and_multipart_uploads_and_streams_them_back() {
    let moto = Moto::start(false);
    moto.bucket("recs").await;
    let store = s3("s3://recs/cluster/one", &moto.endpoint);
    store.check().await.unwrap();
    assert_eq!(store.size(ID).await.unwrap(), None);
    assert!(store.open(ID).await.unwrap().is_none());
    let dir = tempfile::tempdir().unwrap();
    let small_id = "0f9f7f5e-1111-4222-8333-000000000001";
    let (small, small_data) = sample(dir.path(), 1000);
    store.upload(small_id, &small).await.unwrap();
    let (big, big_data) = sample(dir.path(), PART * 2 + 777);
    assert_eq!(store.upload(ID, &big).await.unwrap(), big_data.len() as u64);
    assert_eq!(store.size(ID).await.unwrap(), Some(big_data.len() as u64));
    assert_eq!(read_all(&store, small_id).await.unwrap(), small_data);
    assert_eq!(read_all(&store, ID).await.unwrap(), big_data);
    // Under the prefix, named by the session id.
    let listed = reqwest::get(format!("{}/recs?prefix=cluster/one/", moto.endpoint))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        listed.contains(&format!("<Key>cluster/one/{ID}.cast</Key>")),
        "{listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_or_no_service_are_clear_errors_without_the_secret() {
    let moto = Moto::start(true);
    let store = s3("s3://recs", &moto.endpoint);
    let e = store.check().await.unwrap_err().to_string();
    assert!(
        e.starts_with("the recording store s3://recs failed: "),
        "{e}"
    );
    assert!(e.contains("403 Forbidden"), "{e}");
    assert!(!e.contains("a-secret-never-printed"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = sample(dir.path(), 100);
    let e = store.upload(ID, &file).await.unwrap_err().to_string();
    assert!(e.contains("InvalidAccessKeyId"), "{e}");
    assert!(file.exists());
    // Nothing listens: refused within the short retries a reader waits for.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = s3("s3://recs", &format!("http://127.0.0.1:{port}"));
    let started = Instant::now();
    let e = store.check().await.unwrap_err().to_string();
    assert!(
        e.starts_with("the recording store s3://recs failed: "),
        "{e}"
    );
    assert!(e.contains("Connection refused"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(!format!("{store:?}").contains("secret"));
}
