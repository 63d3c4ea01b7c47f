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
    targets: Arc<Mutex<Option<Arc<Vec<TunnelTarget>>>>>,
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
    /// The agent's certificates, renewed as it asked in this heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed: Option<sallyport_core::api::Renewed>,
}

impl ProxySet {
    /// The answer to an agent's heartbeat: `ok`, then what it should know (the proxy set
    /// once auth has told it, a renewal it asked for), one line.
    pub fn answer(&self, renewed: Option<sallyport_core::api::Renewed>) -> String {
        let targets = self.targets.lock().ok().and_then(|t| t.clone());
        if targets.is_none() && renewed.is_none() {
            return "ok\n".into();
        }
        let answer = HeartbeatAnswer {
            proxies: targets.map(|t| t.as_ref().clone()).unwrap_or_default(),
            renewed,
        };
        match serde_json::to_string(&answer) {
            Ok(json) => format!("ok {json}\n"),
            Err(_) => "ok\n".into(),
        }
    }

    fn set(&self, proxies: &[ProxyInfo]) {
        let targets = proxies
            .iter()
            .filter(|p| !p.addrs.tunnel.is_empty())
            .map(|p| TunnelTarget {
                id: p.id.clone(),
                tunnel: p.addrs.tunnel.clone(),
            })
            .collect();
        if let Ok(mut t) = self.targets.lock() {
            *t = Some(Arc::new(targets));
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
            // Not registered (removed) or not this cluster's: retrying will not help.
            Err(
                e @ crate::auth_client::ClientError::Refused {
                    status: 400..=499, ..
                },
            ) => {
                return Err(e);
            }
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
