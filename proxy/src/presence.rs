//! Presence reports to auth. A tunnel's first heartbeat, new labels and its end are reported on
//! their own, at once ([`report`]); the refreshes that keep a live, unchanged agent online are
//! gathered by a [`Batch`] and sent as one request a [`FLUSH`] naming every node due (`POST
//! /v1/proxies/{id}/presence`): with 10,000 idle agents, ~400 refreshes a second became one
//! request a second. Each heartbeat still waits for its own outcome before it is answered, so a
//! refusal ends its tunnel exactly as a report of its own would.

use std::collections::HashMap;
use std::time::Duration;

use sallyport_core::api::{MAX_PRESENCE_REFRESH, Presence, PresenceRefresh, PresenceRefreshed};
use tokio::sync::{mpsc, oneshot};

use crate::AuthClient;
use crate::auth_client::ClientError;

/// How long refreshes are gathered before they are sent. A heartbeat's answer waits at most
/// this (and the request): far inside the agent's 10 s wait for it.
pub const FLUSH: Duration = Duration::from_secs(1);

/// What became of a presence report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Recorded,
    /// Auth refused it (labels refused, or the node removed): the tunnel ends, saying why.
    Refused(String),
    /// Not recorded for a reason that is not the agent's (auth away): the tunnel stays.
    NotRecorded(String),
}

/// One presence report of its own: the old way, and the way of everything but a refresh.
pub async fn report(auth: &AuthClient, node_id: &str, p: &Presence) -> Outcome {
    let path = sallyport_core::routes::auth::node_presence(node_id);
    match auth
        .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(p))
        .await
    {
        Ok(_) => Outcome::Recorded,
        // Labels refused, or the node removed.
        Err(ClientError::Refused {
            status: 400 | 404,
            message,
            ..
        }) => Outcome::Refused(message),
        Err(e) => Outcome::NotRecorded(e.to_string()),
    }
}

type Waiter = (String, oneshot::Sender<Outcome>);

/// Refreshes waiting to be sent, as one request, by the task [`Batch::start`] spawned.
#[derive(Clone)]
pub struct Batch {
    tx: mpsc::UnboundedSender<Waiter>,
}

impl Batch {
    /// Starts the task that sends proxy `proxy_id`'s refreshes.
    pub fn start(auth: AuthClient, proxy_id: String) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(auth, proxy_id, rx));
        Batch { tx }
    }

    /// Refreshes `node_id`'s presence (its labels unchanged) with the next batch.
    pub async fn refresh(&self, node_id: &str) -> Outcome {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((node_id.to_string(), tx)).is_err() {
            return Outcome::NotRecorded("the presence batch has stopped".into());
        }
        rx.await
            .unwrap_or_else(|_| Outcome::NotRecorded("the presence batch has stopped".into()))
    }
}

async fn run(auth: AuthClient, proxy_id: String, mut rx: mpsc::UnboundedReceiver<Waiter>) {
    let path = sallyport_core::routes::auth::proxy_presence(&proxy_id);
    while let Some(first) = rx.recv().await {
        tokio::time::sleep(FLUSH).await;
        let mut waiting: Waiting = HashMap::new();
        waiting.entry(first.0).or_default().push(first.1);
        while waiting.len() < MAX_PRESENCE_REFRESH {
            match rx.try_recv() {
                Ok((id, tx)) => waiting.entry(id).or_default().push(tx),
                Err(_) => break,
            }
        }
        // Sent by a task of its own, so the next batch gathers meanwhile; bounded, so that
        // one slow answer from auth cannot hold every heartbeat in it past the agents' wait.
        tokio::spawn(send(auth.clone(), path.clone(), waiting));
    }
}

/// The most a batch waits for auth: with [`FLUSH`], well inside the agent's 10 s wait for a
/// heartbeat's answer (a late answer would make every agent in the batch reconnect at once).
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Refreshes gathered for one batch, and who waits for each node's outcome.
type Waiting = HashMap<String, Vec<oneshot::Sender<Outcome>>>;

/// Answers everyone in `waiting` with `outcome`.
fn tell(waiting: Waiting, outcome: Outcome) {
    for tx in waiting.into_values().flatten() {
        let _ = tx.send(outcome.clone());
    }
}

async fn send(auth: AuthClient, path: String, mut waiting: Waiting) {
    let body = PresenceRefresh {
        nodes: waiting.keys().cloned().collect(),
    };
    let asked = auth.json::<_, PresenceRefreshed>(reqwest::Method::POST, &path, Some(&body));
    let unknown = match tokio::time::timeout(BATCH_TIMEOUT, asked).await {
        Ok(Ok(r)) => r.unknown,
        // An auth from before batched refreshes has no such route: each on its own.
        Ok(Err(ClientError::Refused {
            status: 404 | 405, ..
        })) => waiting.keys().cloned().collect(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, nodes = waiting.len(), "presence not refreshed");
            return tell(waiting, Outcome::NotRecorded(e.to_string()));
        }
        Err(_) => {
            let why = format!(
                "auth did not answer a presence batch in {} s",
                BATCH_TIMEOUT.as_secs()
            );
            tracing::warn!(nodes = waiting.len(), "{why}");
            return tell(waiting, Outcome::NotRecorded(why));
        }
    };
    // What auth has no tunnel of here for (removed, or dropped): reported on its own,
    // which records it again or refuses it as before.
    // Each in a task of its own: an older auth's whole batch must not queue behind itself.
    for id in unknown {
        let Some(txs) = waiting.remove(&id) else {
            continue;
        };
        let auth = auth.clone();
        tokio::spawn(async move {
            let p = Presence {
                online: true,
                labels: None,
            };
            let outcome = report(&auth, &id, &p).await;
            for tx in txs {
                let _ = tx.send(outcome.clone());
            }
        });
    }
    tell(waiting, Outcome::Recorded);
}
