//! Finished recordings to the recording store. A session's recording is written to the proxy's
//! own `recordings/` directory while it runs (flushed every second, so a proxy killed
//! mid-session leaves a readable file); when the session ends the whole file is uploaded to the
//! store, and the local copy is removed only once the store has it. Nothing is uploaded when
//! the store is that directory itself (the default).
//!
//! At start, every recording left in the directory (a proxy killed mid-session, whose sessions
//! auth marks incomplete; an upload that had not succeeded before a stop) is uploaded the same
//! way: an upload replaces any earlier copy, so doing one twice is harmless. A failed upload is
//! tried again after a growing pause (1 s doubling to [`MAX_PAUSE`], with jitter), for as long as
//! the proxy runs; [`Uploads::backlog`] says how much waits meanwhile.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sallyport_recordings::RecordingStore;

/// The longest pause between two tries of one upload.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);
/// Uploads at once (each holds at most two 8 MiB parts).
const AT_ONCE: usize = 2;

/// Recordings waiting to reach the store: how many and how large.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    pub files: u64,
    pub bytes: u64,
}

/// The proxy's uploads to the recording store.
pub struct Uploads {
    store: RecordingStore,
    dir: PathBuf,
    /// Sessions whose recording is queued or being uploaded, with its size.
    pending: Mutex<HashMap<String, u64>>,
    slots: tokio::sync::Semaphore,
}

impl Uploads {
    /// Starts uploading to `store` what sessions leave in `dir`, beginning with what is there
    /// now (call before any session starts); None when `store` is `dir` itself. Also asks the
    /// store something small, so that one that cannot be reached or refuses the credentials
    /// is in the log at start, not only at the first session's end.
    pub fn start(store: RecordingStore, dir: PathBuf) -> Option<Arc<Self>> {
        if store.is_dir(&dir) {
            return None;
        }
        let uploads = Arc::new(Uploads {
            store,
            dir,
            pending: Mutex::new(HashMap::new()),
            slots: tokio::sync::Semaphore::new(AT_ONCE),
        });
        let left = uploads.left_behind();
        if !left.is_empty() {
            tracing::warn!(
                recordings = left.len(),
                store = uploads.store.uri(),
                "uploading recordings left by an earlier run"
            );
        }
        for id in left {
            uploads.finished(&id);
        }
        let probe = uploads.clone();
        tokio::spawn(async move {
            if let Err(e) = probe.store.check().await {
                tracing::error!(error = %e, dir = %probe.dir.display(), "the recording store cannot be used now; recordings stay in the directory and are uploaded when it can");
            }
        });
        Some(uploads)
    }

    /// Session ids of the recordings in the directory.
    fn left_behind(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return vec![];
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name.strip_suffix(".cast")?;
                uuid::Uuid::parse_str(id).ok()?;
                Some(id.to_string())
            })
            .collect()
    }

    /// Session `id` ended and its recording (if it has one) is complete on disk: upload it.
    pub fn finished(self: &Arc<Self>, id: &str) {
        let path = self.path(id);
        let Ok(meta) = std::fs::metadata(&path) else {
            // Not recorded (a file copy), or nothing could be written.
            return;
        };
        {
            let Ok(mut pending) = self.pending.lock() else {
                return;
            };
            if pending.contains_key(id) {
                return;
            }
            pending.insert(id.to_string(), meta.len());
            export(&pending);
        }
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move { me.upload_until_done(&id, &path).await });
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.cast"))
    }

    async fn upload_until_done(&self, id: &str, path: &Path) {
        let mut pause = Duration::from_secs(1);
        loop {
            let tried = match self.slots.acquire().await {
                Ok(_slot) => self.upload(id, path).await,
                Err(_) => return,
            };
            match tried {
                Ok(()) => break,
                Err(e) => {
                    let wait = jitter(pause);
                    tracing::error!(session = id, error = %e, file = %path.display(), retry_in_secs = wait.as_secs_f32(), "a recording could not be uploaded; it stays on this proxy's disk and is tried again");
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
        }
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(id);
            export(&pending);
        }
    }

    /// One try: the whole file to the store, then the local copy away.
    async fn upload(&self, id: &str, path: &Path) -> Result<(), String> {
        match self.store.upload(id, path).await {
            Ok(bytes) => {
                tracing::info!(
                    session = id,
                    bytes,
                    store = self.store.uri(),
                    "recording uploaded"
                );
                match tokio::fs::remove_file(path).await {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => {
                        // In the store already; the next start uploads it again, harmlessly.
                        tracing::warn!(session = id, error = %e, "an uploaded recording's local copy could not be removed");
                        Ok(())
                    }
                }
            }
            Err(sallyport_recordings::StoreError::Local(e))
                if !tokio::fs::try_exists(path).await.unwrap_or(true) =>
            {
                // Gone meanwhile (removed by hand): nothing left to upload.
                tracing::warn!(session = id, error = e, "a recording to upload is gone");
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// What waits to be uploaded (queued, being uploaded, or waiting to be tried again).
    pub fn backlog(&self) -> Backlog {
        self.pending
            .lock()
            .map(|p| Backlog {
                files: p.len() as u64,
                bytes: p.values().sum(),
            })
            .unwrap_or_default()
    }
}

/// The backlog to the metrics (`sallyport_recording_upload_backlog_files`, `_bytes`).
fn export(pending: &HashMap<String, u64>) {
    sallyport_core::metrics::metrics()
        .set_recording_upload_backlog(pending.len() as u64, pending.values().sum());
}

/// `pause` give or take a fifth, so that a proxy's many failed uploads do not all come back
/// at once.
fn jitter(pause: Duration) -> Duration {
    let fifth = pause.as_millis() as u64 / 5;
    let offset = rand::random_range(0..=2 * fifth);
    Duration::from_millis(pause.as_millis() as u64 - fifth + offset)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const A: &str = "0f9f7f5e-1111-4222-8333-000000000001";
    const B: &str = "0f9f7f5e-1111-4222-8333-000000000002";

    async fn until(mut f: impl FnMut() -> bool) -> bool {
        for _ in 0..100 {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test]
    async fn what_a_run_left_is_uploaded_at_start_and_removed_after() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("recordings");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{A}.cast")), b"a").unwrap();
        std::fs::write(dir.join(format!("{B}.cast")), b"bb").unwrap();
        std::fs::write(dir.join("notes.txt"), b"not a recording").unwrap();
        // The default: the store is the directory, nothing to upload.
        assert!(Uploads::start(RecordingStore::local(&dir).unwrap(), dir.clone()).is_none());
        let elsewhere = tmp.path().join("store");
        let store = RecordingStore::local(&elsewhere).unwrap();
        let uploads = Uploads::start(store, dir.clone()).unwrap();
        assert!(until(|| uploads.backlog() == Backlog::default()).await);
        assert_eq!(
            std::fs::read(elsewhere.join(format!("{A}.cast"))).unwrap(),
            b"a"
        );
        assert_eq!(
            std::fs::read(elsewhere.join(format!("{B}.cast"))).unwrap(),
            b"bb"
        );
        assert!(!dir.join(format!("{A}.cast")).exists());
        assert!(dir.join("notes.txt").exists());
        // A session without a recording (a file copy) has nothing to upload.
        uploads.finished("0f9f7f5e-1111-4222-8333-000000000003");
        assert_eq!(uploads.backlog(), Backlog::default());
    }

    #[tokio::test]
    async fn an_upload_that_fails_is_kept_and_counted_in_the_backlog() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::write(dir.join(format!("{A}.cast")), b"0123456789").unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = RecordingStore::s3_with(
            &sallyport_recordings::StoreConfig {
                uri: "s3://nowhere".into(),
                endpoint: Some(format!("http://127.0.0.1:{port}")),
                region: None,
            },
            &sallyport_recordings::Credentials {
                key_id: "AKID".into(),
                secret: "secret".into(),
                token: None,
            },
        )
        .unwrap();
        let uploads = Uploads::start(store, dir.clone()).unwrap();
        assert_eq!(
            uploads.backlog(),
            Backlog {
                files: 1,
                bytes: 10
            }
        );
        // Tried (and refused) at least once: still there, still counted.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(uploads.backlog().files, 1);
        assert!(dir.join(format!("{A}.cast")).exists());
    }

    #[test]
    fn pauses_stay_within_a_fifth() {
        for _ in 0..100 {
            let p = jitter(Duration::from_secs(10));
            assert!(
                p >= Duration::from_secs(8) && p <= Duration::from_secs(12),
                "{p:?}"
            );
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
