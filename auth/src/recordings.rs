//! Session recordings: which one is a session's, who may open it, and where it is read from.
//!
//! A recording is read from the proxy's own directory when this process has one (all-in-one:
//! `<data>/recordings/<session>.cast`, where a running session's recording grows and a finished
//! one waits for its upload), otherwise from the recording store (`recordings:` in the config:
//! the same directory by default, or S3). A recording is always streamed, never read whole: it
//! may be `max_recording_size` (a GiB by default), and several may be read at once.
//!
//! A session running on a proxy in another process has its recording only on that proxy's
//! disk until the session ends and the proxy uploads it; auth says so rather than guess.

use sallyport_core::api::{SessionDetail, SessionInfo, SessionStatus};
use sallyport_recordings::RecordingStream;

use crate::{AuthError, AuthServer};

/// A local file's chunk, as the data dir was always read.
const CHUNK: usize = 64 * 1024;

impl AuthServer {
    /// Opens session `id`'s recording for streaming. `only_of`: the one user whose sessions the
    /// caller may replay (their own), or `None` for everyone's.
    pub async fn open_recording(
        &self,
        id: &str,
        only_of: Option<&str>,
    ) -> Result<RecordingStream, AuthError> {
        use futures::StreamExt;
        let (session, path) = self.visible_session(id, only_of).await?;
        if let Some(path) = &path {
            // Opened, the file stays readable whole even if its upload removes it meanwhile.
            match tokio::fs::File::open(path).await {
                Ok(f) => return Ok(tokio_util::io::ReaderStream::with_capacity(f, CHUNK).boxed()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(AuthError::NotFound(format!(
                        "recording of session {id} is not available: {e}"
                    )));
                }
            }
        }
        if let Some(store) = &self.config.recording_store {
            match store.open(id).await {
                Ok(Some((_, stream))) => return Ok(stream),
                Ok(None) => {}
                Err(e) => return Err(AuthError::Upstream(e.to_string())),
            }
        }
        Err(self.not_kept(&session, path.is_some()))
    }

    /// Session `id`'s record and its recording's size now (`None`: no recording), for
    /// `only_of` as in [`AuthServer::open_recording`].
    pub async fn session_detail(
        &self,
        id: &str,
        only_of: Option<&str>,
    ) -> Result<SessionDetail, AuthError> {
        let (session, path) = self.visible_session(id, only_of).await?;
        let mut recording_size = match path {
            Some(p) => tokio::fs::metadata(p).await.ok().map(|m| m.len()),
            None => None,
        };
        if recording_size.is_none()
            && let Some(store) = &self.config.recording_store
        {
            recording_size = store
                .size(id)
                .await
                .map_err(|e| AuthError::Upstream(e.to_string()))?;
        }
        Ok(SessionDetail {
            session,
            recording_size,
        })
    }

    /// Why session `s` has no recording to read here.
    fn not_kept(&self, s: &SessionInfo, local: bool) -> AuthError {
        let id = &s.session_id;
        let Some(store) = &self.config.recording_store else {
            return AuthError::NotFound("no recordings are kept here".into());
        };
        if s.status == SessionStatus::Running && !local {
            // Its proxy holds it until the session ends.
            return AuthError::NotFound(format!(
                "session {id} is still running: its recording is uploaded to {} when the session ends",
                store.uri()
            ));
        }
        AuthError::NotFound(format!(
            "recording of session {id} is not available: it is not in {} (not recorded, or its proxy has not uploaded it yet)",
            store.uri()
        ))
    }

    /// Session `id` if `only_of` may see it, and where its recording would be on this host.
    async fn visible_session(
        &self,
        id: &str,
        only_of: Option<&str>,
    ) -> Result<(SessionInfo, Option<std::path::PathBuf>), AuthError> {
        let s = self
            .get_session(id)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("session {id} does not exist")))?;
        if only_of.is_some_and(|u| u != s.user) {
            return Err(AuthError::AccessDenied(format!(
                "session {id} belongs to another user"
            )));
        }
        // The id names a file: nothing but a UUID reaches the file system or the store.
        uuid::Uuid::parse_str(id).map_err(|_| AuthError::BadRequest("not a session id".into()))?;
        let path = self
            .config
            .recordings_dir
            .as_ref()
            .map(|dir| dir.join(format!("{id}.cast")));
        Ok((s, path))
    }
}
