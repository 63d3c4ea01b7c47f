//! Session recordings on disk (`<data>/recordings/<session>.cast`, written by the proxy):
//! which file is a session's, and who may open it.

use crate::{AuthError, AuthServer};

impl AuthServer {
    /// Opens session `id`'s recording for streaming. `only_of`: the one user whose sessions the
    /// caller may replay (their own), or `None` for everyone's.
    pub async fn open_recording(
        &self,
        id: &str,
        only_of: Option<&str>,
    ) -> Result<tokio::fs::File, AuthError> {
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
        let dir = self
            .config
            .recordings_dir
            .clone()
            .ok_or_else(|| AuthError::NotFound("no recordings are kept here".into()))?;
        tokio::fs::File::open(dir.join(format!("{id}.cast")))
            .await
            .map_err(|e| {
                AuthError::NotFound(format!("recording of session {id} is not available: {e}"))
            })
    }
}
