//! Proxy services. A proxy on its own host joins with a one-time `proxy` token, straight to auth
//! (`POST /v1/proxies/join`, the one route a caller without a certificate may use), and gets its
//! own TLS and SSH host certificates: it never holds a CA key. The all-in-one's own proxy is
//! registered when it starts. Every proxy heartbeats its addresses; agents learn the proxy set
//! from those heartbeats and keep a tunnel to each.
//!
//! A proxy certificate is honoured only while its proxy is registered: removing one
//! (`sallyctl proxies rm`) refuses it at once, on every auth instance (the registry is in the
//! database), not at the certificate's expiry.

use base64::Engine;
use russh::keys::ssh_key::PublicKey;
use sallyport_core::api::{
    NodeKind, PROXY_TTL_SECS, ProxyAddrs, ProxyHeartbeat, ProxyInfo, ProxyJoinRequest, ProxyJoined,
    SessionStatus, TokenKind,
};
use sallyport_core::audit::{Event, EventType};
use sallyport_core::ca::CaKind;
use sallyport_core::sshcert;
use sqlx::Row;

use crate::users::token_hash;
use crate::{AuthError, AuthServer};

/// The id (and certificate CN) of the all-in-one's own proxy.
pub const LOCAL_PROXY_ID: &str = "proxy";

/// Most addresses a proxy may name for itself, and their length.
const MAX_DNS_NAMES: usize = 32;

impl AuthServer {
    /// Is `id` a proxy of this cluster now? The proxy extractor asks on every request.
    pub async fn proxy_registered(&self, id: &str) -> Result<bool, AuthError> {
        Ok(sqlx::query("SELECT 1 AS one FROM proxies WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.backend.pool)
            .await?
            .is_some())
    }

    /// Names no node may take: the configured public names and, in a cluster of separate
    /// services, every registered proxy's name and the hosts it is reached at.
    pub async fn reserved_names(&self) -> Result<Vec<String>, AuthError> {
        let mut names = self.config.public_names.clone();
        for p in self.list_proxies().await? {
            names.push(p.name.clone());
            for addr in [&p.addrs.web, &p.addrs.ssh, &p.addrs.tunnel, &p.addrs.kube] {
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if !host.is_empty() {
                    names.push(host.to_string());
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The all-in-one's own proxy: registered (under [`LOCAL_PROXY_ID`]) when it starts.
    pub async fn register_local_proxy(&self, addrs: &ProxyAddrs) -> Result<(), AuthError> {
        let now = sallyport_core::unix_now();
        sqlx::query(
            "INSERT INTO proxies (id, name, addrs, created, last_seen) VALUES ($1, $1, $2, $3, $3)
             ON CONFLICT (id) DO UPDATE SET addrs = excluded.addrs, last_seen = excluded.last_seen",
        )
        .bind(LOCAL_PROXY_ID)
        .bind(serde_json::to_string(addrs)?)
        .bind(now)
        .execute(&self.backend.pool)
        .await?;
        Ok(())
    }

    /// A proxy joins: the token is checked first (a caller without one learns nothing), then the
    /// name and keys, then the token is spent and the proxy registered and certified.
    pub async fn join_proxy(
        &self,
        req: &ProxyJoinRequest,
        remote: &str,
    ) -> Result<ProxyJoined, AuthError> {
        let now = sallyport_core::unix_now();
        let hash = token_hash(&req.token);
        let valid = sqlx::query(
            "SELECT 1 AS one FROM join_tokens WHERE token_hash = $1 AND used = 0 AND expires > $2 AND kind = $3",
        )
        .bind(&hash)
        .bind(now)
        .bind(TokenKind::Proxy.as_str())
        .fetch_optional(&self.backend.pool)
        .await?
        .is_some();
        if !valid {
            return Err(self.proxy_join_refused(req, remote).await);
        }
        if let Err(e) = sallyport_core::names::validate("proxy", &req.name) {
            self.proxy_join_failed(req, remote, &e.to_string()).await;
            return Err(AuthError::BadRequest(e.to_string()));
        }
        let dns_names = check_dns_names(&req.dns_names)?;
        let (spki, host_key) = keys(req)?;
        if sqlx::query("SELECT id FROM proxies WHERE name = $1")
            .bind(&req.name)
            .fetch_optional(&self.backend.pool)
            .await?
            .is_some()
        {
            let why = format!(
                "proxy name {} is already taken; remove it first (`sallyctl proxies rm {}`) or start this proxy with another --nodename",
                req.name, req.name
            );
            self.proxy_join_failed(req, remote, &why).await;
            return Err(AuthError::Conflict(why));
        }
        // The token is spent and the name taken in one transaction: a join that loses a race
        // for the name leaves its token unspent, for a retry under another name.
        let mut tx = self.backend.pool.begin().await?;
        let claimed = sqlx::query("UPDATE join_tokens SET used = 1 WHERE token_hash = $1 AND used = 0 AND expires > $2 AND kind = $3")
            .bind(&hash)
            .bind(now)
            .bind(TokenKind::Proxy.as_str())
            .execute(&mut *tx)
            .await?;
        if claimed.rows_affected() != 1 {
            drop(tx);
            return Err(self.proxy_join_refused(req, remote).await);
        }
        let id = uuid::Uuid::new_v4().to_string();
        let registered = sqlx::query(
            "INSERT INTO proxies (id, name, addrs, created, last_seen) VALUES ($1, $2, $3, $4, 0)",
        )
        .bind(&id)
        .bind(&req.name)
        .bind(serde_json::to_string(&ProxyAddrs::default())?)
        .bind(now)
        .execute(&mut *tx)
        .await;
        if registered.is_err() {
            drop(tx);
            let why = format!("proxy name {} is already taken", req.name);
            self.proxy_join_failed(req, remote, &why).await;
            return Err(AuthError::Conflict(why));
        }
        tx.commit().await?;
        let joined = self.proxy_certs(&id, &spki, &host_key, dns_names)?;
        self.emit(
            Event::new(EventType::ProxyJoin, None)
                .with("success", true)
                .with("proxy_id", id.clone())
                .with("name", req.name.clone())
                .with("remote_addr", remote),
        )
        .await?;
        Ok(joined)
    }

    /// A registered proxy's new keys certified (the request's token is not used): what it
    /// runs on when its certificates near their end.
    pub async fn renew_proxy(
        &self,
        id: &str,
        req: &ProxyJoinRequest,
    ) -> Result<ProxyJoined, AuthError> {
        if !self.proxy_registered(id).await? {
            return Err(AuthError::NotFound(format!("proxy {id} is not registered")));
        }
        let dns_names = check_dns_names(&req.dns_names)?;
        let (spki, host_key) = keys(req)?;
        self.proxy_certs(id, &spki, &host_key, dns_names)
    }

    fn proxy_certs(
        &self,
        id: &str,
        spki: &[u8],
        host_key: &PublicKey,
        mut names: Vec<String>,
    ) -> Result<ProxyJoined, AuthError> {
        let internal = |e: &dyn std::fmt::Display| AuthError::Internal(e.to_string());
        names.push(self.config.cluster_name.clone());
        let ssh_host_cert = sshcert::issue_host(
            &self.authorities.host_signer().key,
            host_key,
            id,
            &names,
            self.config.host_cert_ttl,
        )
        .map_err(|e| internal(&e))?
        .to_openssh()
        .map_err(|e| internal(&e))?;
        names.pop();
        let cert = self.issue_service_cert(
            spki,
            id,
            crate::api::PROXY_ROLE,
            names,
            self.config.host_cert_ttl,
            false,
        )?;
        let openssh = |kind| -> Result<Vec<String>, AuthError> {
            self.authorities
                .ssh_public_keys(kind)
                .iter()
                .map(|k| k.to_openssh().map_err(|e| internal(&e)))
                .collect()
        };
        Ok(ProxyJoined {
            proxy_id: id.to_string(),
            cluster_name: self.config.cluster_name.clone(),
            tls_chain_pem: format!("{cert}{}", self.authorities.tls_host_signer().cert_pem),
            host_ca_pem: self.authorities.tls_pem(CaKind::TlsHost),
            user_ca_pem: self.authorities.tls_pem(CaKind::TlsUser),
            ssh_host_cert,
            user_ca_keys: openssh(CaKind::User)?,
            host_ca_keys: openssh(CaKind::Host)?,
            not_after: sallyport_core::unix_now() + self.config.host_cert_ttl.as_secs() as i64,
        })
    }

    /// A proxy's heartbeat: its addresses now. Its first after a start drops what it held before
    /// (its agents' presence, its running sessions, marked incomplete), and nobody else's.
    /// Answers the proxy set, which the proxy passes on to its agents.
    pub async fn proxy_heartbeat(
        &self,
        id: &str,
        hb: &ProxyHeartbeat,
    ) -> Result<Vec<ProxyInfo>, AuthError> {
        let now = sallyport_core::unix_now();
        let r = sqlx::query("UPDATE proxies SET addrs = $1, last_seen = $2 WHERE id = $3")
            .bind(serde_json::to_string(&hb.addrs)?)
            .bind(now)
            .bind(id)
            .execute(&self.backend.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!("proxy {id} is not registered")));
        }
        if hb.started {
            let interrupted = self.proxy_started(id).await?;
            if interrupted > 0 {
                tracing::warn!(
                    proxy = %id,
                    sessions = interrupted,
                    "sessions interrupted by the proxy's last stop are marked incomplete"
                );
            }
        }
        self.list_proxies().await
    }

    /// Proxy `id` started again: the tunnels it held are gone (each node's presence is what
    /// other proxies still hold), so are its users' connections, and its running sessions
    /// ended incomplete. Returns how many.
    pub async fn proxy_started(&self, id: &str) -> Result<u64, AuthError> {
        self.drop_proxy_presence(id).await?;
        self.drop_proxy_connections(id).await?;
        // Sessions from before proxies were recorded (`''`) were the all-in-one's.
        let r = sqlx::query("UPDATE sessions SET status = $1 WHERE status = $2 AND (proxy = $3 OR ($3 = 'proxy' AND proxy = ''))")
            .bind(SessionStatus::Incomplete.as_str())
            .bind(SessionStatus::Running.as_str())
            .bind(id)
            .execute(&self.backend.pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn drop_proxy_presence(&self, id: &str) -> Result<(), AuthError> {
        let mut tx = self.backend.pool.begin().await?;
        sqlx::query("DELETE FROM node_tunnels WHERE proxy_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE nodes SET last_seen = COALESCE((SELECT MAX(t.last_seen) FROM node_tunnels t WHERE t.node_id = nodes.id), 0)
             WHERE kind IN ($1, $2)",
        )
        .bind(NodeKind::Agent.as_str())
        .bind(NodeKind::Kube.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn list_proxies(&self) -> Result<Vec<ProxyInfo>, AuthError> {
        let now = sallyport_core::unix_now();
        let rows = sqlx::query("SELECT id, name, addrs, last_seen FROM proxies ORDER BY name")
            .fetch_all(&self.backend.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let addrs: String = r.try_get("addrs")?;
                let last_seen: i64 = r.try_get("last_seen")?;
                Ok(ProxyInfo {
                    id: r.try_get("id")?,
                    name: r.try_get("name")?,
                    addrs: serde_json::from_str(&addrs).unwrap_or_default(),
                    online: last_seen > now - PROXY_TTL_SECS,
                    last_seen,
                })
            })
            .collect()
    }

    /// Removes a proxy (by name or id): its certificate is refused from this moment, and the
    /// agent tunnels and user connections it reported no longer count.
    pub async fn remove_proxy(&self, name_or_id: &str, by: &str) -> Result<(), AuthError> {
        let row = sqlx::query("SELECT id FROM proxies WHERE name = $1 OR id = $1")
            .bind(name_or_id)
            .fetch_optional(&self.backend.pool)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("proxy {name_or_id} does not exist")))?;
        let id: String = row.try_get("id")?;
        sqlx::query("DELETE FROM proxies WHERE id = $1")
            .bind(&id)
            .execute(&self.backend.pool)
            .await?;
        self.proxy_started(&id).await?;
        self.emit(Event::new(EventType::ProxyDelete, Some(by)).with("name", name_or_id))
            .await?;
        Ok(())
    }

    async fn proxy_join_refused(&self, req: &ProxyJoinRequest, remote: &str) -> AuthError {
        let why = "invalid join token: it is unknown, expired or already used; create a new one with `sallyctl tokens add --type=proxy`";
        self.proxy_join_failed(req, remote, why).await;
        AuthError::Unauthenticated(why.into())
    }

    async fn proxy_join_failed(&self, req: &ProxyJoinRequest, remote: &str, why: &str) {
        self.join_refusal(EventType::ProxyJoin, ("name", &req.name), remote, why)
            .await;
    }
}

fn keys(req: &ProxyJoinRequest) -> Result<(Vec<u8>, PublicKey), AuthError> {
    let host_key = PublicKey::from_openssh(req.ssh_host_key.trim()).map_err(|e| {
        AuthError::BadRequest(format!("the host key is not an OpenSSH public key: {e}"))
    })?;
    let spki = base64::engine::general_purpose::STANDARD
        .decode(&req.tls_spki)
        .map_err(|_| AuthError::BadRequest("the TLS key is not base64".into()))?;
    Ok((spki, host_key))
}

/// The names a proxy's certificates are for: host names or addresses, few and short.
fn check_dns_names(names: &[String]) -> Result<Vec<String>, AuthError> {
    if names.len() > MAX_DNS_NAMES {
        return Err(AuthError::BadRequest(format!(
            "at most {MAX_DNS_NAMES} names for a proxy's certificates"
        )));
    }
    // Auth's name and the cluster-internal domain it is in are auth's alone; a wildcard
    // would cover them (or every other proxy), so none is certified.
    let internal = sallyport_core::api::AUTH_SERVER_NAME
        .split_once('.')
        .map_or("", |(_, domain)| domain);
    for n in names {
        let lower = n.to_ascii_lowercase();
        if lower == sallyport_core::api::AUTH_SERVER_NAME
            || lower == internal
            || lower.ends_with(&format!(".{internal}"))
        {
            return Err(AuthError::BadRequest(format!(
                "{n} is auth's own name: no proxy certificate may carry it"
            )));
        }
        if n.contains('*') {
            return Err(AuthError::BadRequest(format!(
                "{n}: a proxy's certificate names hosts, no wildcard"
            )));
        }
        let ok = !n.is_empty()
            && n.len() <= 253
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
        if !ok {
            return Err(AuthError::BadRequest(format!(
                "{:?} is not a host name or address",
                n.chars().take(64).collect::<String>()
            )));
        }
    }
    let mut out = names.to_vec();
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_certificate_never_names_auth_or_a_wildcard() {
        for bad in [
            "auth.sallyport.cluster.local",
            "AUTH.sallyport.cluster.local",
            "sallyport.cluster.local",
            "x.sallyport.cluster.local",
            "*.sallyport.cluster.local",
            "*.cluster.local",
            "*",
            "*.example.com",
            "proxy/evil",
        ] {
            assert!(
                check_dns_names(&[bad.to_string()]).is_err(),
                "{bad} was accepted"
            );
        }
        let ok = check_dns_names(&["proxy.example.com".into(), "127.0.0.2".into(), "::1".into()]);
        assert!(ok.is_ok(), "{ok:?}");
    }
}
