//! What a session does when its recording stops before the session does (it reached
//! `max_recording_size`, or its file could not be created or written): under `record_session:
//! strict` the session ends with a message the person sees, under `best_effort` it goes on
//! unrecorded; both are audited (`session.recording_limit`, `session.recording_fail`). A
//! recording that failed makes the session's end `incomplete`.
//!
//! The relay's tasks share a session's [`Recorder`] through [`Live::recorder`]: the slot's lock
//! is held only to clone the handle, never while the recorder waits on its writer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sallyport_core::api::RecordMode;
use sallyport_core::audit::EventType;
use serde_json::json;

use super::super::Door;
use super::super::relay::Live;
use super::{Recorder, Stop, WRITER_FAILED};

/// A completed recording's sync, running: answers a stop it met that completing had not.
pub(in crate::session) type Syncing = tokio::task::JoinHandle<Option<Stop>>;

impl<D: Door> Live<D> {
    /// The session's recorder, if it is being recorded.
    pub(in crate::session) fn recorder(&self) -> Option<Arc<Recorder>> {
        self.rec.lock().ok().and_then(|r| r.clone())
    }

    /// Checked before more output reaches the person: if the recording stopped, finishes it
    /// where it stopped and answers the message that ends the session (`strict`), or None
    /// (the session goes on, unrecorded).
    pub(in crate::session) async fn recording_stopped(&self) -> Option<String> {
        let stopped = self
            .rec
            .lock()
            .ok()
            .and_then(|mut r| r.take_if(|r| r.stopped().is_some()))?;
        let stop = stopped.finish().await?;
        self.recording_ended(stop).await
    }

    /// At the session's end, before the person sees it (beside it when the watchdog ends the
    /// session): the recording is complete (written
    /// and flushed, so any reader — the player, the uploader — finds all of it), and a stop
    /// the writer met only now is audited. Its sync starts then, in a task of its own, for
    /// [`Live::recording_synced`].
    pub(in crate::session) async fn complete_recording(&self) -> Option<Syncing> {
        let rec = self.rec.lock().ok().and_then(|mut r| r.take())?;
        let before = rec.complete().await;
        if let Some(stop) = before.clone() {
            self.recording_ended(stop).await;
        }
        Some(tokio::spawn(async move {
            rec.finish()
                .await
                .filter(|after| Some(after) != before.as_ref())
        }))
    }

    /// Beside the end being told (a person who stops reading holds up neither the sync nor the
    /// upload), and before the session's end is audited: the recording synced, a failure to
    /// sync audited (the session's end then says `incomplete`), then handed to the uploads
    /// when the store is elsewhere.
    pub(in crate::session) async fn recording_synced(&self, syncing: Option<Syncing>) {
        if let Some(syncing) = syncing {
            let stop = syncing
                .await
                .unwrap_or_else(|_| Some(Stop::Failed(WRITER_FAILED.into())));
            if let Some(stop) = stop {
                self.recording_ended(stop).await;
            }
        }
        if let Some(uploads) = &self.state.uploads {
            // It looks at the file first: off the async workers, as every use of the disk here.
            let (uploads, id) = (uploads.clone(), self.grant.session_id.clone());
            let handing = tokio::task::spawn_blocking(move || uploads.finished(&id));
            if tokio::time::timeout(super::STALL, handing).await.is_err() {
                // Left to finish when it can; the session's end is not held up for ever.
                tracing::warn!(session = %self.grant.session_id, "the recording's file could not be looked at within {} s (is the recordings disk stalled?); its upload goes on when it can", super::STALL.as_secs());
            }
        }
    }

    /// Audits a recording that stopped; answers the person's message when the session must
    /// end (`strict`).
    async fn recording_ended(&self, stop: Stop) -> Option<String> {
        let grant = &self.grant;
        let strict = grant.record == RecordMode::Strict;
        match stop {
            Stop::Full => {
                let max_bytes = self.state.max_recording_size;
                tracing::warn!(session = %grant.session_id, max_bytes, strict, "recording reached max_recording_size");
                self.audit
                    .event(
                        EventType::SessionRecordingLimit,
                        json!({"max_recording_size": max_bytes, "record_session": grant.record, "action": action(strict)}),
                    )
                    .await;
                strict.then(|| format!("this session's recording reached max_recording_size ({max_bytes} bytes) and it must be recorded (record_session: strict); the session ends"))
            }
            Stop::Failed(error) => {
                self.recording_failed(&error).await;
                strict.then(|| format!("this session's recording could not be written ({error}) and it must be recorded (record_session: strict); the session ends"))
            }
        }
    }

    /// Audits a recording that could not be created or written (`session.recording_fail`);
    /// the session's end will say `incomplete`.
    pub(in crate::session) async fn recording_failed(&self, error: &str) {
        let grant = &self.grant;
        let strict = grant.record == RecordMode::Strict;
        self.recording_failed.store(true, Ordering::Release);
        tracing::error!(session = %grant.session_id, error, strict, "a recording could not be written");
        self.audit
            .event(
                EventType::SessionRecordingFail,
                json!({"error": error, "record_session": grant.record, "action": action(strict)}),
            )
            .await;
    }
}

/// The audited consequence of a stopped recording.
fn action(strict: bool) -> &'static str {
    if strict {
        "session ended"
    } else {
        "recording stopped"
    }
}
