//! Session events seen by the proxy (`sftp`, `scp`, `port`, `agent-forward`, ...), sent to
//! auth in small batches so a busy SFTP session costs one request per batch, not per
//! operation. The queue is bounded: when auth falls behind, the session waits rather than
//! losing audit records.

use std::sync::Arc;
use std::time::Duration;

use sallyport_core::api::SessionEvent;
use tokio::sync::mpsc;

use super::SshState;

const QUEUE: usize = 4096;
const BATCH: usize = 500;

#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<SessionEvent>,
}

impl EventSink {
    pub fn spawn(state: Arc<SshState>, session_id: String) -> Self {
        let (tx, mut rx) = mpsc::channel::<SessionEvent>(QUEUE);
        tokio::spawn(async move {
            let path = format!(
                "/v1/sessions/{}/events",
                sallyport_core::api::path_segment(&session_id)
            );
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                // Gather what arrives within a moment, up to a batch.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
                while batch.len() < BATCH {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(e)) => batch.push(e),
                        Ok(None) | Err(_) => break,
                    }
                }
                if let Err(e) = state
                    .auth
                    .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(&batch))
                    .await
                {
                    tracing::error!(session = %session_id, error = %e, lost = batch.len(), "session events not recorded");
                }
            }
        });
        EventSink { tx }
    }

    /// Queues `event` with `fields` (a JSON object).
    pub async fn send(&self, event: &str, fields: serde_json::Value) {
        let fields = match fields {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let e = SessionEvent {
            event: event.to_string(),
            fields,
        };
        if self.tx.send(e).await.is_err() {
            tracing::error!(event, "session event queue closed");
        }
    }
}
