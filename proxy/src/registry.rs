//! This proxy in the cluster's proxy set: it heartbeats its addresses to auth every
//! [`HEARTBEAT`] (the first says it started, so auth drops the agent tunnels and running
//! sessions it held before, and nobody else's), and keeps the set auth answers, which every
//! agent tunnel hears in its heartbeat answers, so agents keep a tunnel to every proxy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sallyport_core::api::{ProxyAddrs, ProxyHeartbeat, ProxyInfo};

use crate::AuthClient;

pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// The proxy set as agents hear it: `{"proxies":[{"id":..,"tunnel":..}]}`, one JSON line.
#[derive(Clone, Default)]
pub struct ProxySet {
    line: Arc<Mutex<Arc<str>>>,
}

/// One proxy as an agent needs it: who it is (its certificate's CN) and where it takes tunnels.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TunnelTarget {
    pub id: String,
    pub tunnel: String,
}

/// What a proxy appends to its `ok` answer to an agent's heartbeat.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct HeartbeatAnswer {
    pub proxies: Vec<TunnelTarget>,
}

impl ProxySet {
    /// The line to append after `ok ` (empty until auth has answered once).
    pub fn line(&self) -> Arc<str> {
        self.line
            .lock()
            .map(|l| l.clone())
            .unwrap_or_else(|_| "".into())
    }

    fn set(&self, proxies: &[ProxyInfo]) {
        let answer = HeartbeatAnswer {
            proxies: proxies
                .iter()
                .filter(|p| !p.addrs.tunnel.is_empty())
                .map(|p| TunnelTarget {
                    id: p.id.clone(),
                    tunnel: p.addrs.tunnel.clone(),
                })
                .collect(),
        };
        if let (Ok(json), Ok(mut l)) = (serde_json::to_string(&answer), self.line.lock()) {
            *l = json.into();
        }
    }
}

/// The first heartbeat of a proxy that just started, before its doors open: auth drops the agent
/// tunnels and running sessions it held before. Retried until auth answers; a refusal (this
/// proxy removed) stops the start.
pub async fn announce(
    auth: &AuthClient,
    id: &str,
    addrs: &ProxyAddrs,
    set: &ProxySet,
) -> Result<(), crate::auth_client::ClientError> {
    let hb = ProxyHeartbeat {
        addrs: addrs.clone(),
        started: true,
    };
    let path = sallyport_core::routes::auth::proxy_heartbeat(id);
    let mut wait = Duration::from_millis(200);
    loop {
        match auth
            .json::<_, Vec<ProxyInfo>>(reqwest::Method::POST, &path, Some(&hb))
            .await
        {
            Ok(proxies) => {
                set.set(&proxies);
                return Ok(());
            }
            Err(e @ crate::auth_client::ClientError::Refused { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "auth unreachable; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Heartbeats forever as proxy `id` at `addrs`. Returns only if auth says this proxy is no
/// longer registered (removed): the caller stops the proxy, whose certificate auth now refuses.
pub async fn heartbeat(auth: AuthClient, id: String, addrs: ProxyAddrs, set: ProxySet) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        let hb = ProxyHeartbeat {
            addrs: addrs.clone(),
            started: false,
        };
        let path = sallyport_core::routes::auth::proxy_heartbeat(&id);
        match auth
            .json::<_, Vec<ProxyInfo>>(reqwest::Method::POST, &path, Some(&hb))
            .await
        {
            Ok(proxies) => set.set(&proxies),
            Err(crate::auth_client::ClientError::Refused {
                status: 401 | 404,
                message,
                ..
            }) => {
                tracing::error!(proxy = %id, error = %message, "auth no longer knows this proxy");
                return;
            }
            Err(e) => tracing::warn!(proxy = %id, error = %e, "proxy heartbeat not recorded"),
        }
    }
}
