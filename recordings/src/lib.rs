//! Where finished session recordings are kept, behind one interface on the `object_store`
//! crate: the local data dir (`<data>/recordings/<id>.cast`, the default), another local
//! directory (`file:///path`), or any S3-compatible service (`s3://bucket/prefix`).
//!
//! The proxy writes each recording to its own disk while the session runs and hands the
//! finished file to [`RecordingStore::upload`]; auth reads from [`RecordingStore::open`] and
//! [`RecordingStore::size`]. Both ends stream: an upload goes in parts of [`PART`] bytes with at
//! most two in flight, a read is a stream of chunks as the store sends them. Nothing here ever
//! holds a whole recording in memory (a recording may be `max_recording_size`, a GiB by
//! default).
//!
//! Credentials come from the standard environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), never from the config file, and are never
//! printed: [`RecordingStore`]'s `Debug` and every message name the store by its URI alone.

mod http;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{GetResultPayload, ObjectStore, ObjectStoreExt, WriteMultipart};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// What the store is, as the config file's `recordings:` section says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreConfig {
    /// `s3://bucket[/prefix]` or `file:///absolute/path`.
    pub uri: String,
    /// An S3-compatible service's URL (MinIO, moto, Ceph): `http://host:9000`. None: AWS.
    pub endpoint: Option<String>,
    /// The S3 region; None: `AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
}

/// What a [`StoreConfig`] names.
enum Location {
    Dir(PathBuf),
    S3(S3),
}

struct S3 {
    bucket: String,
    prefix: Option<Key>,
    /// The endpoint, and whether it is plain HTTP.
    endpoint: Option<(String, bool)>,
}

impl StoreConfig {
    /// Whether this names a store: the URI's shape and the endpoint, before any credentials or
    /// request (the config file's check).
    pub fn check(&self) -> Result<(), StoreError> {
        self.location().map(|_| ())
    }

    fn location(&self) -> Result<Location, StoreError> {
        let bad = |why: &str| {
            StoreError::Config(format!(
                "uri {:?}: {why}; use s3://BUCKET[/PREFIX] or file:///PATH",
                self.uri
            ))
        };
        let url = url::Url::parse(&self.uri).map_err(|e| bad(&e.to_string()))?;
        if !url.username().is_empty() || url.password().is_some() {
            // A secret in the config file would end up in logs and messages.
            return Err(bad(
                "credentials do not go in the uri: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("no query or fragment"));
        }
        match url.scheme() {
            "file" => {
                if self.endpoint.is_some() || self.region.is_some() {
                    return Err(StoreError::Config(
                        "endpoint and region are for an s3:// store only".into(),
                    ));
                }
                if url.host_str().is_some_and(|h| !h.is_empty()) {
                    return Err(bad("a file uri has no host: file:///PATH"));
                }
                let path = url
                    .to_file_path()
                    .map_err(|()| bad("not an absolute path"))?;
                Ok(Location::Dir(path))
            }
            "s3" => {
                let bucket = url
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| bad("no bucket"))?;
                let prefix = url.path().trim_matches('/');
                let prefix = if prefix.is_empty() {
                    None
                } else {
                    Some(Key::parse(prefix).map_err(|e| bad(&format!("the prefix: {e}")))?)
                };
                let endpoint = match &self.endpoint {
                    None => None,
                    Some(endpoint) => {
                        let how = "use http(s)://HOST:PORT";
                        let e = url::Url::parse(endpoint).map_err(|e| {
                            StoreError::Config(format!("endpoint {endpoint:?}: {e}; {how}"))
                        })?;
                        if !matches!(e.scheme(), "http" | "https") || e.host_str().is_none() {
                            return Err(StoreError::Config(format!(
                                "endpoint {endpoint:?}: {how}"
                            )));
                        }
                        Some((
                            endpoint.trim_end_matches('/').to_string(),
                            e.scheme() == "http",
                        ))
                    }
                };
                Ok(Location::S3(S3 {
                    bucket: bucket.to_string(),
                    prefix,
                    endpoint,
                }))
            }
            other => Err(bad(&format!("unknown scheme {other:?}"))),
        }
    }
}

/// An S3 access key. No `Debug`: it is never printed.
#[derive(Clone)]
pub struct Credentials {
    pub key_id: String,
    pub secret: String,
    pub token: Option<String>,
}

impl Credentials {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`; None without the
    /// first two. Nothing else is looked for (no profile files, no instance metadata): the
    /// environment says exactly which key the store is used with.
    pub fn from_env() -> Option<Self> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(Credentials {
            key_id: env("AWS_ACCESS_KEY_ID")?,
            secret: env("AWS_SECRET_ACCESS_KEY")?,
            token: env("AWS_SESSION_TOKEN"),
        })
    }
}

/// What went wrong, worded for the person reading the log or the client's error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The configuration cannot name a store.
    #[error("recordings: {0}")]
    Config(String),
    /// The store answered that the recording is not there.
    #[error("recording {0} is not in the store")]
    NotFound(String),
    /// The store could not be reached or refused the request.
    #[error("the recording store {store} failed: {error}")]
    Store { store: String, error: String },
    /// The local file could not be read.
    #[error("{0}")]
    Local(String),
}

/// A recording's bytes, as the store sends them.
pub type RecordingStream = BoxStream<'static, Result<Bytes, std::io::Error>>;

/// Each part of an upload (S3 wants at least 5 MiB but the last); at most [`IN_FLIGHT`] are
/// held at once.
pub const PART: usize = 8 << 20;
const IN_FLIGHT: usize = 2;
/// A local read's chunk (a stored file is read as the data dir's was before: 64 KiB at a time).
const CHUNK: usize = 64 << 10;

/// Where recordings are kept. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct RecordingStore {
    store: Arc<dyn ObjectStore>,
    /// Keys are `<prefix>/<id>.cast`.
    prefix: Option<Key>,
    /// The store as the config named it: the one thing messages say about it.
    uri: String,
    /// The directory when the store is a local one.
    dir: Option<PathBuf>,
}

impl std::fmt::Debug for RecordingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingStore")
            .field("uri", &self.uri)
            .finish()
    }
}

impl RecordingStore {
    /// A local directory (created if missing): the data dir's `recordings/`, the default.
    pub fn local(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Config(format!(
                "the recordings directory {} cannot be created: {e}",
                dir.display()
            ))
        })?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|e| {
            StoreError::Config(format!(
                "the recordings directory {} cannot be used: {e}",
                dir.display()
            ))
        })?;
        Ok(RecordingStore {
            store: Arc::new(fs),
            prefix: None,
            uri: format!("file://{}", dir.display()),
            dir: Some(dir.to_path_buf()),
        })
    }

    /// The store `cfg` names; nothing is sent yet (see [`RecordingStore::check`]). A URI that
    /// names no store, or an S3 store without credentials, is an error.
    pub fn from_config(cfg: &StoreConfig) -> Result<Self, StoreError> {
        match cfg.location()? {
            Location::Dir(path) => Self::local(&path),
            Location::S3(s3) => Self::s3(cfg, s3, Credentials::from_env()),
        }
    }

    /// An `s3://` store with these credentials (tests; [`RecordingStore::from_config`] reads
    /// them from the environment).
    pub fn s3_with(cfg: &StoreConfig, creds: &Credentials) -> Result<Self, StoreError> {
        match cfg.location()? {
            Location::S3(s3) => Self::s3(cfg, s3, Some(creds.clone())),
            Location::Dir(_) => Err(StoreError::Config(format!("{} is not s3://", cfg.uri))),
        }
    }

    fn s3(cfg: &StoreConfig, at: S3, creds: Option<Credentials>) -> Result<Self, StoreError> {
        let S3 {
            bucket,
            prefix,
            endpoint,
        } = at;
        let creds = creds.ok_or_else(|| {
            StoreError::Config(format!(
                "the store {} needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment",
                cfg.uri
            ))
        })?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = cfg
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        // Not `from_env`: only the credentials (and a default region) come from the environment,
        // so nothing else (another endpoint, instance-metadata credentials) changes what the file
        // says.
        let mut b = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(region)
            .with_access_key_id(&creds.key_id)
            .with_secret_access_key(&creds.secret)
            .with_http_connector(http::Connector)
            .with_retry(retry());
        if let Some(token) = &creds.token {
            b = b.with_token(token);
        }
        if let Some((endpoint, http)) = &endpoint {
            b = b
                .with_endpoint(endpoint)
                .with_allow_http(*http)
                // Path-style requests (`endpoint/bucket/key`): what every S3-compatible
                // service answers, where a bucket's own host name may not resolve.
                .with_virtual_hosted_style_request(false);
        }
        let store = b
            .build()
            .map_err(|e| StoreError::Config(format!("the store {}: {e}", cfg.uri)))?;
        Ok(RecordingStore {
            store: Arc::new(store),
            prefix,
            uri: cfg.uri.clone(),
            dir: None,
        })
    }

    /// The store as configured (`s3://bucket/prefix`, `file:///path`): what logs name.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Whether this store is the local directory `dir` itself (then there is nothing to upload:
    /// a recording is in the store as it is written).
    pub fn is_dir(&self, dir: &Path) -> bool {
        let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        };
        self.dir.as_deref().is_some_and(|d| same(d, dir))
    }

    /// The key of session `id`'s recording. Only a plain name reaches the store: the callers
    /// pass session ids (UUIDs).
    fn key(&self, id: &str) -> Result<Key, StoreError> {
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(StoreError::Local(format!("{id:?} is not a session id")));
        }
        let name = format!("{id}.cast");
        Ok(match &self.prefix {
            Some(p) => p.clone().join(name.as_str()),
            None => Key::from(name),
        })
    }

    fn failed(&self, e: object_store::Error) -> StoreError {
        match e {
            object_store::Error::NotFound { path, .. } => StoreError::NotFound(path),
            e => StoreError::Store {
                store: self.uri.clone(),
                error: one_line(&e.to_string()),
            },
        }
    }

    /// The size of session `id`'s recording in the store; None: it is not there.
    pub async fn size(&self, id: &str) -> Result<Option<u64>, StoreError> {
        match self.store.head(&self.key(id)?).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Session `id`'s recording as a stream of chunks, with its size; None: it is not there.
    pub async fn open(&self, id: &str) -> Result<Option<(u64, RecordingStream)>, StoreError> {
        let got = match self.store.get(&self.key(id)?).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.failed(e)),
        };
        let size = got.range.end - got.range.start;
        let stream = match got.payload {
            // A local file: read 64 KiB at a time on the runtime, as the data dir always was.
            GetResultPayload::File(file, _) => {
                let mut file = tokio::fs::File::from_std(file);
                file.seek(std::io::SeekFrom::Start(got.range.start))
                    .await
                    .map_err(|e| StoreError::Local(e.to_string()))?;
                tokio_util::io::ReaderStream::with_capacity(file.take(size), CHUNK).boxed()
            }
            GetResultPayload::Stream(s) => {
                let uri = self.uri.clone();
                s.map_err(move |e| {
                    std::io::Error::other(format!(
                        "the recording store {uri} failed: {}",
                        one_line(&e.to_string())
                    ))
                })
                .boxed()
            }
        };
        Ok(Some((size, stream)))
    }

    /// Copies the finished recording `file` into the store as session `id`'s, in parts (at
    /// most [`IN_FLIGHT`] × [`PART`] bytes held), replacing any earlier copy: uploading the
    /// same file again is harmless. Answers the bytes uploaded.
    pub async fn upload(&self, id: &str, file: &Path) -> Result<u64, StoreError> {
        let key = self.key(id)?;
        let local =
            |e: std::io::Error| StoreError::Local(format!("cannot read {}: {e}", file.display()));
        let mut f = tokio::fs::File::open(file).await.map_err(local)?;
        let len = f.metadata().await.map_err(local)?.len();
        if len <= PART as u64 {
            // One request; the file is small.
            let mut buf = Vec::with_capacity(len as usize);
            f.read_to_end(&mut buf).await.map_err(local)?;
            let sent = buf.len() as u64;
            self.store
                .put(&key, Bytes::from(buf).into())
                .await
                .map_err(|e| self.failed(e))?;
            return Ok(sent);
        }
        let upload = self
            .store
            .put_multipart(&key)
            .await
            .map_err(|e| self.failed(e))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
        let mut sent = 0u64;
        loop {
            if let Err(e) = w.wait_for_capacity(IN_FLIGHT).await {
                let _ = w.abort().await;
                return Err(self.failed(e));
            }
            let mut buf = vec![0u8; PART];
            let n = match read_full(&mut f, &mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = w.abort().await;
                    return Err(local(e));
                }
            };
            if n == 0 {
                break;
            }
            buf.truncate(n);
            sent += n as u64;
            w.put(Bytes::from(buf));
        }
        w.finish().await.map_err(|e| self.failed(e))?;
        Ok(sent)
    }

    /// Asks the store something small (the size of a recording that does not exist), so that
    /// a store that cannot be reached or refuses the credentials is known at start.
    pub async fn check(&self) -> Result<(), StoreError> {
        self.size("00000000-0000-0000-0000-000000000000")
            .await
            .map(|_| ())
    }
}

/// An error as one log line: a store's answer is often an XML document over several lines.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reads until `buf` is full or the file ends.
async fn read_full(f: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).await? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// object_store's retries within one request: few and short, since a reader is waiting; the
/// proxy's uploader retries a failed upload itself, with a longer backoff.
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
    }
}

#[cfg(test)]
mod tests;
