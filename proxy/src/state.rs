//! What every door of the proxy shares: the auth client, the agents' tunnels, the proxy's SSH
//! key (which auth certifies per session), where recordings go, the locks auth reports and the
//! live connections they end, and the count of each user's open node connections. The SSH
//! door, the browser terminal and the Kubernetes door all hold the same [`ProxyState`], so a
//! lock ends a user's sessions at every door at once.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use russh::keys::ssh_key::{PrivateKey, PublicKey};
use sallyport_core::api::ConnectionRef;

use crate::AuthClient;
use crate::tunnels::Tunnels;

/// Something a door can end when its user is locked: an SSH connection, a WebSocket.
pub trait HangUp: Send + Sync {
    /// Ends it, telling the person `why` where the door can.
    fn hang_up(&self, why: String);
}

impl HangUp for russh::server::Handle {
    fn hang_up(&self, why: String) {
        let handle = self.clone();
        tokio::spawn(async move {
            let _ = handle
                .disconnect(russh::Disconnect::ByApplication, why, String::new())
                .await;
        });
    }
}

/// A live connection's user, and how to end it.
type LiveConnection = (String, Arc<dyn HangUp>);

pub struct ProxyState {
    pub auth: AuthClient,
    pub cluster: String,
    /// The proxy's SSH key: auth certifies it per session for the node.
    pub key: Arc<PrivateKey>,
    /// The host CAs a node's SSH certificate must come from.
    pub host_cas: Vec<PublicKey>,
    pub tunnels: Tunnels,
    pub recordings: PathBuf,
    /// Finished recordings on their way to the recording store; none when the store is
    /// `recordings` itself.
    pub uploads: Option<Arc<crate::session::record::Uploads>>,
    /// `max_recording_size`: the largest a recording may grow.
    pub max_recording_size: u64,
    /// Users under a lock, with its message (polled from auth).
    locked: RwLock<HashMap<String, String>>,
    /// Live connections by id, with their user, ended when the user is locked.
    live: Mutex<HashMap<u64, LiveConnection>>,
    /// Open node connections: their user by the order they authenticated in, for the roles'
    /// `max_connections`.
    open: Mutex<BTreeMap<u64, (String, Arc<Held>)>>,
    /// Registered connections that closed, not yet told to auth, and whether a task is
    /// telling it ([`ProxyState::closed`]).
    closed: Mutex<Vec<u64>>,
    telling_closed: AtomicBool,
    /// Whether the task that tells auth which registered connections are still open runs
    /// ([`ProxyState::reconcile`]).
    reconciling: AtomicBool,
}

/// What auth holds of an open connection (`max_connections` across proxies).
#[derive(Default)]
struct Held {
    /// Auth said it registered it: auth counts it, so the proxy does not count it again.
    confirmed: AtomicBool,
    /// Auth registered it or may have (a grant that failed after auth could have): it is told
    /// when the connection closes.
    maybe: AtomicBool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh id for a live connection or an open node connection.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A user's node connection, counted in [`ProxyState`] while it is open.
pub struct OpenConnection {
    state: Arc<ProxyState>,
    seq: u64,
    opened_ms: i64,
    held: Arc<Held>,
}

impl std::fmt::Debug for OpenConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenConnection")
            .field("seq", &self.seq)
            .field("opened_ms", &self.opened_ms)
            .finish()
    }
}

impl OpenConnection {
    /// What auth knows the connection by, with the user's older connections on this proxy that
    /// auth does not count itself; and how many of the user's connections opened before this
    /// one are still open. One pass over the open connections for both.
    pub fn reference(&self) -> (ConnectionRef, u32) {
        let (older, unconfirmed_older) = self.state.older(self.seq);
        let reference = ConnectionRef {
            id: self.seq,
            opened_ms: self.opened_ms,
            unconfirmed_older,
        };
        (reference, older)
    }

    /// Auth registered the connection: it counts it from now on.
    pub fn registered(&self) {
        self.held.confirmed.store(true, Ordering::Release);
        self.maybe_registered();
    }

    /// Auth may have registered the connection (a grant failed after it could have): it is
    /// told when the connection closes, and meanwhile that it is open
    /// ([`ProxyState::reconcile`]).
    pub fn maybe_registered(&self) {
        self.held.maybe.store(true, Ordering::Release);
        self.state.reconcile();
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Ok(mut open) = self.state.open.lock() {
            open.remove(&self.seq);
        }
        if self.held.maybe.load(Ordering::Acquire) {
            self.state.closed(self.seq);
        }
    }
}

/// How often a proxy tells auth which of its registered connections are open.
const RECONCILE_EVERY: Duration = Duration::from_secs(10);

impl ProxyState {
    pub fn new(
        auth: AuthClient,
        cluster: String,
        key: PrivateKey,
        host_cas: Vec<PublicKey>,
        tunnels: Tunnels,
        recordings: PathBuf,
    ) -> Self {
        ProxyState {
            auth,
            cluster,
            key: Arc::new(key),
            host_cas,
            tunnels,
            recordings,
            uploads: None,
            max_recording_size: crate::session::record::DEFAULT_MAX_RECORDING_SIZE,
            locked: RwLock::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            open: Mutex::new(BTreeMap::new()),
            closed: Mutex::new(Vec::new()),
            telling_closed: AtomicBool::new(false),
            reconciling: AtomicBool::new(false),
        }
    }

    /// Recordings waiting for their upload to the recording store (none when the store is
    /// the proxy's own directory), for the metrics.
    pub fn recording_backlog(&self) -> crate::session::record::Backlog {
        self.uploads
            .as_ref()
            .map(|u| u.backlog())
            .unwrap_or_default()
    }

    /// The proxy's public SSH key, as auth certifies it.
    pub fn public_key(&self) -> Result<String, String> {
        self.key
            .public_key()
            .to_openssh()
            .map_err(|e| e.to_string())
    }

    /// Counts a node connection of `user` as open until the returned value is dropped.
    pub fn open_connection(self: &Arc<Self>, user: &str) -> OpenConnection {
        let held = Arc::new(Held::default());
        // The id is taken with the lock held, so a list of the open connections made under it
        // holds every id below the next one ([`ProxyState::reconcile`]).
        let seq = match self.open.lock() {
            Ok(mut open) => {
                let seq = next_id();
                open.insert(seq, (user.to_string(), held.clone()));
                seq
            }
            Err(_) => next_id(),
        };
        OpenConnection {
            state: self.clone(),
            seq,
            opened_ms: i64::try_from(sallyport_core::unix_now_ms()).unwrap_or(i64::MAX),
            held,
        }
    }

    /// Tells auth that registered connection `seq` closed, soon: one task at a time sends what
    /// closed meanwhile in one request. What auth could not take is not sent again: the next
    /// list of open connections ([`ProxyState::reconcile`]) removes it.
    fn closed(self: &Arc<Self>, seq: u64) {
        if let Ok(mut closed) = self.closed.lock() {
            closed.push(seq);
        }
        if self.telling_closed.swap(true, Ordering::AcqRel) {
            return; // the running task takes it
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.telling_closed.store(false, Ordering::Release);
            return;
        };
        let state = self.clone();
        rt.spawn(async move {
            loop {
                let ids: Vec<u64> = match state.closed.lock() {
                    Ok(mut c) => {
                        let n = c.len().min(sallyport_core::api::MAX_CLOSED_CONNECTIONS);
                        c.drain(..n).collect()
                    }
                    Err(_) => Vec::new(),
                };
                if ids.is_empty() {
                    state.telling_closed.store(false, Ordering::Release);
                    // A close queued after the take and before the flag fell: take it too.
                    let more = state.closed.lock().map(|c| !c.is_empty()).unwrap_or(false);
                    if more && !state.telling_closed.swap(true, Ordering::AcqRel) {
                        continue;
                    }
                    return;
                }
                let n = ids.len();
                let body = sallyport_core::api::ClosedConnections { ids, open: None };
                if let Err(e) = state.tell_connections(&body).await {
                    tracing::warn!(error = %e, connections = n, "could not tell auth of closed connections; the next list of open ones will");
                }
            }
        });
    }

    /// From the first registration on, every [`RECONCILE_EVERY`] tells auth every connection
    /// of this proxy's still open, and the id below which that list is whole: auth drops its
    /// rows of this proxy below that id and not in the list, so what a close could not remove
    /// (a grant auth committed after the proxy stopped waiting for it, then the connection
    /// closed) goes too. A connection opened after the list has a higher id and is not touched;
    /// no clock is compared.
    fn reconcile(self: &Arc<Self>) {
        if self.reconciling.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reconciling.store(false, Ordering::Release);
            return;
        };
        let state = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                tokio::time::sleep(RECONCILE_EVERY).await;
                let Some(state) = state.upgrade() else { return };
                let (open, below): (Vec<u64>, u64) = match state.open.lock() {
                    Ok(o) => (o.keys().copied().collect(), next_id()),
                    Err(_) => continue,
                };
                if open.len() > sallyport_core::api::MAX_OPEN_CONNECTIONS {
                    tracing::warn!(
                        open = open.len(),
                        "too many open connections to reconcile with auth"
                    );
                    continue;
                }
                let body = sallyport_core::api::ClosedConnections {
                    ids: Vec::new(),
                    open: Some(sallyport_core::api::OpenConnections { ids: open, below }),
                };
                if let Err(e) = state.tell_connections(&body).await {
                    tracing::warn!(error = %e, "could not tell auth which connections are open");
                }
            }
        });
    }

    /// `POST /v1/connections/closed`.
    async fn tell_connections(
        &self,
        body: &sallyport_core::api::ClosedConnections,
    ) -> Result<serde_json::Value, crate::auth_client::ClientError> {
        self.auth
            .json(
                reqwest::Method::POST,
                sallyport_core::routes::auth::CONNECTIONS_CLOSED,
                Some(body),
            )
            .await
    }

    /// How many of its user's connections opened before connection `seq` are still open, and
    /// how many of those auth has not confirmed registering (it counts the others itself).
    fn older(&self, seq: u64) -> (u32, u32) {
        self.open
            .lock()
            .map(|open| {
                let Some((user, _)) = open.get(&seq) else {
                    return (0, 0);
                };
                open.range(..seq).filter(|(_, (u, _))| u == user).fold(
                    (0, 0),
                    |(all, unconfirmed), (_, (_, h))| {
                        let confirmed = h.confirmed.load(Ordering::Acquire);
                        (all + 1, unconfirmed + u32::from(!confirmed))
                    },
                )
            })
            .unwrap_or((0, 0))
    }

    /// Why `user` is locked, if they are.
    pub fn lock_of(&self, user: &str) -> Option<String> {
        self.locked.read().ok().and_then(|l| l.get(user).cloned())
    }

    /// Remembers live connection `id` of `user`, to end it if they are locked.
    pub fn track(&self, id: u64, user: &str, conn: Arc<dyn HangUp>) {
        if let Ok(mut live) = self.live.lock() {
            live.insert(id, (user.to_string(), conn));
        }
    }

    /// Connection `id` ended.
    pub fn untrack(&self, id: u64) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&id);
        }
    }

    /// Polls auth's locks every `every`: refuses locked users at every door from then on, and
    /// ends their live connections.
    pub async fn watch_locks(self: Arc<Self>, every: Duration) {
        loop {
            match self
                .auth
                .json::<(), Vec<sallyport_core::api::LockInfo>>(
                    reqwest::Method::GET,
                    sallyport_core::routes::auth::LOCKS,
                    None,
                )
                .await
            {
                Ok(locks) => {
                    let now: HashMap<String, String> =
                        locks.into_iter().map(|l| (l.user, l.message)).collect();
                    let doomed: Vec<(String, Arc<dyn HangUp>)> = match self.live.lock() {
                        Ok(mut live) => {
                            let ids: Vec<u64> = live
                                .iter()
                                .filter(|(_, (u, _))| now.contains_key(u))
                                .map(|(id, _)| *id)
                                .collect();
                            ids.iter().filter_map(|id| live.remove(id)).collect()
                        }
                        Err(_) => vec![],
                    };
                    for (user, conn) in doomed {
                        let why = now.get(&user).cloned().unwrap_or_default();
                        tracing::info!(%user, "ending the connection of a locked user");
                        conn.hang_up(format!("user {user} is locked: {why}"));
                    }
                    if let Ok(mut l) = self.locked.write() {
                        *l = now;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read locks from auth"),
            }
            tokio::time::sleep(every).await;
        }
    }
}
