//! One ordered sink per session for everything it reports to auth: what kind of session it
//! turned out to be (`update`), the per-operation events (`sftp`, `scp`, `port`,
//! `agent-forward`, ...) in small batches, and its end. One task posts them in the order they
//! were queued, so an end never overtakes the events before it. The queue is bounded: when
//! auth falls behind, the session waits rather than losing audit records. A post auth refuses
//! or cannot be reached at all is not retried (a retry after a lost answer would record the
//! batch twice): a lost batch of events is logged at error with their number, a lost kind
//! update at warn.

use std::sync::Arc;
use std::time::Duration;

use sallyport_core::api::{SessionEnd, SessionEvent, SessionKind};
use sallyport_core::audit::EventType;
use sallyport_core::metrics::{AuditQueue, metrics};
use tokio::sync::{mpsc, oneshot};

use crate::state::ProxyState;

const QUEUE: usize = 4096;
const BATCH: usize = 500;

enum Report {
    Event(SessionEvent),
    Update(SessionEnd),
    End(SessionEnd, oneshot::Sender<()>),
}

/// A session's reports to auth. Cheap to clone; the task ends with the session's end.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::Sender<Report>,
    session_id: Arc<str>,
}

impl Audit {
    pub fn spawn(state: Arc<ProxyState>, session_id: &str) -> Self {
        let (tx, rx) = mpsc::channel::<Report>(QUEUE);
        tokio::spawn(post(state, session_id.to_string(), rx));
        Audit {
            tx,
            session_id: session_id.into(),
        }
    }

    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Queues `event` with `fields` (a JSON object).
    pub async fn event(&self, event: EventType, fields: serde_json::Value) {
        let fields = match fields {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let e = SessionEvent {
            event: event.name().to_string(),
            fields,
        };
        if self.tx.send(Report::Event(e)).await.is_err() {
            tracing::error!(%event, session = %self.session_id, "session event queue closed");
        } else {
            queued();
        }
    }

    /// Queues each of `list`.
    pub async fn events(&self, list: Vec<(EventType, serde_json::Value)>) {
        for (name, fields) in list {
            self.event(name, fields).await;
        }
    }

    /// The session turned out to be `kind` (`shell`, `exec`, `sftp`, `forward`).
    pub async fn update(&self, kind: SessionKind, command: Option<&str>) {
        let body = SessionEnd {
            kind: Some(kind),
            command: command.map(str::to_string),
            ..Default::default()
        };
        if self.tx.send(Report::Update(body)).await.is_ok() {
            queued();
        }
    }

    /// The session ended: posted after everything queued before it; returns once auth has it
    /// (or could not be told).
    pub async fn end(&self, end: SessionEnd) {
        let (done, posted) = oneshot::channel();
        if self.tx.send(Report::End(end, done)).await.is_ok() {
            queued();
            let _ = posted.await;
        }
    }
}

/// Reports wait in every session's queue together: one gauge.
fn queued() {
    metrics().audit_queued(AuditQueue::ProxySessionEvents, 1);
}

fn posted(n: usize) {
    metrics().audit_dequeued(AuditQueue::ProxySessionEvents, n);
}

/// Ends a session that never got an [`Audit`] (its node could not be reached, say).
pub async fn end_now(state: &ProxyState, session_id: &str, end: SessionEnd) {
    let path = sallyport_core::routes::auth::session_end(session_id);
    if let Err(e) = state
        .auth
        .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(&end))
        .await
    {
        tracing::error!(session = %session_id, error = %e, "session end not recorded");
    }
}

async fn post(state: Arc<ProxyState>, session_id: String, mut rx: mpsc::Receiver<Report>) {
    let events_path = sallyport_core::routes::auth::session_events(&session_id);
    let update_path = sallyport_core::routes::auth::session_update(&session_id);
    let mut next: Option<Report> = None;
    loop {
        let report = match next.take() {
            Some(r) => r,
            None => match rx.recv().await {
                Some(r) => r,
                None => return,
            },
        };
        match report {
            Report::Event(first) => {
                let mut batch = vec![first];
                // Gather what arrives within a moment, up to a batch; anything else waits its
                // turn behind the batch.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
                while batch.len() < BATCH {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(Report::Event(e))) => batch.push(e),
                        Ok(Some(other)) => {
                            next = Some(other);
                            break;
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                if let Err(e) = state
                    .auth
                    .json::<_, serde_json::Value>(reqwest::Method::POST, &events_path, Some(&batch))
                    .await
                {
                    tracing::error!(session = %session_id, error = %e, lost = batch.len(), "session events not recorded");
                }
                posted(batch.len());
            }
            Report::Update(body) => {
                if let Err(e) = state
                    .auth
                    .json::<_, serde_json::Value>(reqwest::Method::POST, &update_path, Some(&body))
                    .await
                {
                    tracing::warn!(session = %session_id, error = %e, "session kind not recorded");
                }
                posted(1);
            }
            Report::End(end, done) => {
                end_now(&state, &session_id, end).await;
                posted(1);
                let _ = done.send(());
                // Nothing is taken after the end: what still waits is let go, and uncounted.
                rx.close();
                let mut left = 0;
                while rx.try_recv().is_ok() {
                    left += 1;
                }
                posted(left);
                return;
            }
        }
    }
}
