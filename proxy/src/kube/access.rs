//! What one person may do on one cluster, as auth says it now: the user's current roles
//! compiled into a `RoleSet`, and the cluster's labels and id. Asked of auth at most every 2 s
//! per (user, cluster), so a removed role, a lock or a deleted user takes effect within that,
//! and a request costs no round trip to auth.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sallyport_core::api::{KubeAccess, KubeAccessRequest, KubeClusterInfo};
use sallyport_core::role::RoleSet;

use crate::AuthClient;
use crate::auth_client::ClientError;

/// How long an answer from auth stands.
pub const FRESH: Duration = Duration::from_secs(2);
/// Entries kept at most (a flood of names cannot grow the cache without bound).
const MAX_ENTRIES: usize = 10_000;

pub struct Snapshot {
    pub user: String,
    pub roles: RoleSet,
    pub cluster: KubeClusterInfo,
    /// The labels roles match: the cluster's plus `kube_cluster`.
    pub labels: BTreeMap<String, String>,
}

/// Why a person's request cannot be decided.
#[derive(Debug, Clone)]
pub enum Refused {
    /// The cluster is not registered (404).
    NoCluster,
    /// The user is gone or locked (403), with auth's words.
    Denied(String),
    /// Auth could not be asked (503).
    Unavailable,
}

type Entry = (Instant, Result<Arc<Snapshot>, Refused>);

#[derive(Clone)]
pub struct AccessCache {
    auth: AuthClient,
    entries: Arc<Mutex<HashMap<(String, String), Entry>>>,
}

impl AccessCache {
    pub fn new(auth: AuthClient) -> Self {
        AccessCache {
            auth,
            entries: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub async fn get(&self, user: &str, cluster: &str) -> Result<Arc<Snapshot>, Refused> {
        let key = (user.to_string(), cluster.to_string());
        if let Ok(m) = self.entries.lock()
            && let Some((at, answer)) = m.get(&key)
            && at.elapsed() < FRESH
        {
            return answer.clone();
        }
        // Fresh from when it was asked, not answered: never older than FRESH.
        let asked = Instant::now();
        let answer = self.ask(user, cluster).await;
        // Auth being away is not remembered: the next request asks again.
        if !matches!(answer, Err(Refused::Unavailable))
            && let Ok(mut m) = self.entries.lock()
        {
            if m.len() >= MAX_ENTRIES {
                m.retain(|_, (at, _)| at.elapsed() < FRESH);
            }
            if m.len() < MAX_ENTRIES {
                m.insert(key, (asked, answer.clone()));
            }
        }
        answer
    }

    async fn ask(&self, user: &str, cluster: &str) -> Result<Arc<Snapshot>, Refused> {
        let req = KubeAccessRequest {
            user: user.to_string(),
            cluster: cluster.to_string(),
        };
        let a: KubeAccess = match self
            .auth
            .json(
                reqwest::Method::POST,
                sallyport_core::routes::auth::KUBE_ACCESS,
                Some(&req),
            )
            .await
        {
            Ok(a) => a,
            Err(ClientError::Refused { status: 404, .. }) => return Err(Refused::NoCluster),
            // A lock's message and a gone user's, as auth words them.
            Err(ClientError::Refused {
                status: 403,
                message,
                ..
            }) => return Err(Refused::Denied(message)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask auth about a Kubernetes request");
                return Err(Refused::Unavailable);
            }
        };
        let labels = sallyport_core::kube::cluster_labels(&a.cluster.name, &a.cluster.labels);
        Ok(Arc::new(Snapshot {
            user: a.user,
            roles: RoleSet::new(&a.roles, &a.traits),
            cluster: a.cluster,
            labels,
        }))
    }
}
