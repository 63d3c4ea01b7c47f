//! Session recordings on disk (`<data>/recordings/<session>.cast`, written by the proxy):
//! which file is a session's, and who may open it.

use sallyport_core::api::{SessionDetail, SessionInfo};

use crate::{AuthError, AuthServer};

impl AuthServer {
    /// Opens session `id`'s recording for streaming. `only_of`: the one user whose sessions the
    /// caller may replay (their own), or `None` for everyone's.
    pub async fn open_recording(
        &self,
        id: &str,
        only_of: Option<&str>,
    ) -> Result<tokio::fs::File, AuthError> {
        let (_, path) = self.visible_session(id, only_of).await?;
        let path = path.ok_or_else(|| AuthError::NotFound("no recordings are kept here".into()))?;
        tokio::fs::File::open(path).await.map_err(|e| {
            AuthError::NotFound(format!("recording of session {id} is not available: {e}"))
        })
    }

    /// Session `id`'s record and its recording's size now (`None`: no file), for `only_of` as
    /// in [`AuthServer::open_recording`].
    pub async fn session_detail(
        &self,
        id: &str,
        only_of: Option<&str>,
    ) -> Result<SessionDetail, AuthError> {
        let (session, path) = self.visible_session(id, only_of).await?;
        let recording_size = match path {
            Some(p) => tokio::fs::metadata(p).await.ok().map(|m| m.len()),
            None => None,
        };
        Ok(SessionDetail {
            session,
            recording_size,
        })
    }

    /// Session `id` if `only_of` may see it, and where its recording would be.
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
        // The id names a file: nothing but a UUID reaches the file system.
        uuid::Uuid::parse_str(id).map_err(|_| AuthError::BadRequest("not a session id".into()))?;
        let path = self
            .config
            .recordings_dir
            .as_ref()
            .map(|dir| dir.join(format!("{id}.cast")));
        Ok((s, path))
    }
}
