//! `kube.request` records on their way to auth: queued by every request, posted in batches,
//! never dropped. The queue is bounded: when auth is slow the door's requests wait for room
//! rather than lose a record, and a batch auth does not take is posted again until it does.

use std::time::Duration;

use sallyport_core::api::{KubePortForwardRecord, KubeRecord, KubeRequestRecord};
use sallyport_core::metrics::{AuditQueue, metrics};
use tokio::sync::mpsc;

use crate::AuthClient;

/// Records waiting at most; past this a request waits to be let through.
const QUEUE: usize = 8192;
/// Records in one post at most (auth takes up to 1024; a record is at most ~10 KiB, its path
/// and reason cut, so a batch stays under auth's 2 MiB body limit).
const BATCH: usize = 128;
/// How long the first record of a post waits for others: `kubectl exec` sends its `GET` of
/// the pod and then the exec within a few milliseconds, and the two go to auth as one write
/// after the exec's grant rather than as two beside it.
const GATHER: Duration = Duration::from_millis(25);

#[derive(Clone)]
pub struct RequestAudit {
    tx: mpsc::Sender<KubeRecord>,
}

impl RequestAudit {
    pub fn start(auth: AuthClient) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(post(auth, rx));
        RequestAudit { tx }
    }

    /// Queues one request's record, waiting for room when auth is behind.
    pub async fn record(&self, r: KubeRequestRecord) {
        self.send(KubeRecord::Request(r)).await
    }

    /// Queues a port-forward's start or stop.
    pub async fn port_forward(&self, r: KubePortForwardRecord) {
        self.send(KubeRecord::PortForward(r)).await
    }

    async fn send(&self, r: KubeRecord) {
        if self.tx.send(r).await.is_err() {
            tracing::error!("the kube request audit queue is gone");
        } else {
            metrics().audit_queued(AuditQueue::ProxyKubeRequests, 1);
        }
    }
}

async fn post(auth: AuthClient, mut rx: mpsc::Receiver<KubeRecord>) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + GATHER;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, room)).await {
                Ok(n) if n > 0 => {}
                // Closed (the proxy is stopping) or the moment is over: posted now.
                Ok(_) | Err(_) => break,
            }
        }
        let mut wait = Duration::from_millis(100);
        loop {
            match auth
                .json::<_, serde_json::Value>(
                    reqwest::Method::POST,
                    sallyport_core::routes::auth::KUBE_REQUESTS,
                    Some(&batch),
                )
                .await
            {
                Ok(_) => break,
                // A batch auth refuses as such will be refused again: said loudly, not retried
                // forever with every request behind it.
                Err(crate::auth_client::ClientError::Refused {
                    status, message, ..
                }) if (400..500).contains(&status) && status != 429 => {
                    tracing::error!(status, error = %message, records = batch.len(), "auth refused kube request records; they are lost");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, records = batch.len(), "kube request records not yet taken by auth; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
        metrics().audit_dequeued(AuditQueue::ProxyKubeRequests, batch.len());
        batch.clear();
    }
}
