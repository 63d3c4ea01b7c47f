//! What auth does for SSH access: join tokens and agent joining, node presence, the per-session
//! grant (role decision + per-session certificate + session record) and the session index.

use std::time::Duration;

use base64::Engine;
use russh::keys::ssh_key::PublicKey;
use sallyport_core::api::*;
use sallyport_core::audit::catalogue::Source;
use sallyport_core::audit::{Event, EventType, storable_text};
use sallyport_core::sshcert::{self, Permits, UserCertRequest};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::users::{rfc3339, token_hash};
use crate::{AuthError, AuthServer};

/// A per-session certificate only has to outlive the handshake with the node.
pub(crate) const SESSION_CERT_TTL: Duration = Duration::from_secs(5 * 60);
/// A node whose tunnel reported within this long is online.
pub const PRESENCE_TTL: i64 = 45;

fn session_from_row(r: &AnyRow) -> Result<SessionInfo, AuthError> {
    Ok(SessionInfo {
        session_id: r.try_get("id")?,
        user: r.try_get("user_name")?,
        login: r.try_get("login")?,
        node: r.try_get("node")?,
        start: rfc3339(r.try_get("start")?),
        end: r.try_get::<Option<i64>, _>("end_time")?.map(rfc3339),
        exit_code: r.try_get("exit_code")?,
        status: crate::backend::word(r, "status")?,
        kind: crate::backend::word(r, "kind")?,
        command: r.try_get("command")?,
    })
}

impl AuthServer {
    pub async fn add_join_token(
        &self,
        req: &AddJoinToken,
        by: &str,
    ) -> Result<JoinToken, AuthError> {
        if !matches!(
            req.kind,
            TokenKind::Node | TokenKind::Kube | TokenKind::Proxy
        ) {
            return Err(AuthError::BadRequest(format!(
                "{} tokens come with their user (`sallyctl users add`, `users reset`): use --type=node, --type=kube or --type=proxy",
                req.kind
            )));
        }
        if req.ttl_secs < 60 || req.ttl_secs > 7 * 86400 {
            return Err(AuthError::BadRequest(
                "--ttl must be between 1m and 7d".into(),
            ));
        }
        let token = sallyport_core::random_hex(16);
        let now = sallyport_core::unix_now();
        let expires = now + req.ttl_secs as i64;
        sqlx::query(
            "INSERT INTO join_tokens (token_hash, kind, expires, created) VALUES ($1, $2, $3, $4)",
        )
        .bind(token_hash(&token))
        .bind(req.kind.as_str())
        .bind(expires)
        .bind(now)
        .execute(&self.backend.pool)
        .await?;
        self.emit(
            Event::new(EventType::TokenCreate, Some(by))
                .with("type", req.kind.as_str())
                .with("expires", rfc3339(expires)),
        )
        .await?;
        Ok(JoinToken {
            token,
            expires: rfc3339(expires),
        })
    }

    /// An agent joins: the token is spent, the node registered under a unique name, and the
    /// agent's own keys certified.
    ///
    /// The token is checked before anything else is said: a caller without a valid token
    /// learns nothing about which names exist or are allowed. It is spent only once the request
    /// is known to be good, so a refused name does not cost the operator the token.
    pub async fn join(&self, req: &JoinRequest, remote: &str) -> Result<Joined, AuthError> {
        let now = sallyport_core::unix_now();
        let hash = token_hash(&req.token);
        let kind: Option<TokenKind> = sqlx::query(
            "SELECT kind FROM join_tokens WHERE token_hash = $1 AND used = 0 AND expires > $2 AND kind IN ($3, $4)",
        )
        .bind(&hash)
        .bind(now)
        .bind(TokenKind::Node.as_str())
        .bind(TokenKind::Kube.as_str())
        .fetch_optional(&self.backend.pool)
        .await?
        .map(|r| crate::backend::word(&r, "kind"))
        .transpose()?;
        let Some(token_kind) = kind else {
            return Err(self.join_refused(req, remote).await);
        };
        // A kube token registers a Kubernetes cluster, served by its kube agent.
        let (node_kind, tls_role) = match token_kind {
            TokenKind::Kube => (NodeKind::Kube, "kube"),
            _ => (NodeKind::Agent, "node"),
        };
        let refused = |why: String| async move {
            self.join_failed(req, remote, &why).await;
            why
        };
        if let Err(e) = sallyport_core::names::validate_node(
            &req.nodename,
            &self.config.cluster_name,
            &self.reserved_names().await?,
        )
        .map_err(|e| e.to_string())
        .and_then(|()| sallyport_core::names::validate_labels(&req.labels))
        {
            return Err(AuthError::BadRequest(refused(e).await));
        }
        let host_key = PublicKey::from_openssh(req.ssh_host_key.trim()).map_err(|e| {
            AuthError::BadRequest(format!("the host key is not an OpenSSH public key: {e}"))
        })?;
        let spki = base64::engine::general_purpose::STANDARD
            .decode(&req.tls_spki)
            .map_err(|_| AuthError::BadRequest("the TLS key is not base64".into()))?;
        if let Some(id) = self.name_taken(&req.nodename).await? {
            let why = match node_kind {
                NodeKind::Kube => format!(
                    "name {} is already taken ({id}); start the kube agent with another --kube-cluster",
                    req.nodename
                ),
                _ => format!(
                    "node name {} is already taken (node {id}); start the agent with another --nodename",
                    req.nodename
                ),
            };
            return Err(AuthError::Conflict(refused(why).await));
        }
        // The token is spent and the name taken in one transaction: an agent that loses a
        // race for its name keeps its token, for a retry under another name.
        let mut tx = self.backend.pool.begin().await?;
        let claimed = sqlx::query("UPDATE join_tokens SET used = 1 WHERE token_hash = $1 AND used = 0 AND expires > $2 AND kind = $3")
            .bind(&hash)
            .bind(now)
            .bind(token_kind.as_str())
            .execute(&mut *tx)
            .await?;
        if claimed.rows_affected() != 1 {
            // Spent by a concurrent join since the check above.
            drop(tx);
            return Err(self.join_refused(req, remote).await);
        }
        let id = uuid::Uuid::new_v4().to_string();
        let registered = sqlx::query("INSERT INTO nodes (id, hostname, addr, labels, kind, created, updated, last_seen) VALUES ($1, $2, NULL, $3, $5, $4, $4, 0)")
            .bind(&id)
            .bind(&req.nodename)
            .bind(serde_json::to_string(&req.labels)?)
            .bind(now)
            .bind(node_kind.as_str())
            .execute(&mut *tx)
            .await;
        if registered.is_err() {
            drop(tx);
            let why = format!("node name {} is already taken", req.nodename);
            return Err(AuthError::Conflict(refused(why).await));
        }
        tx.commit().await?;
        let names = vec![
            req.nodename.clone(),
            format!("{}.{}", req.nodename, self.config.cluster_name),
            id.clone(),
        ];
        // A kube agent serves SSH too, inside its tunnel: each `kubectl exec` is a session the
        // proxy opens on it, like a node's.
        let ssh_host_cert = sshcert::issue_host(
            &self.authorities.host_signer().key,
            &host_key,
            &id,
            &names,
            self.config.host_cert_ttl,
        )
        .map_err(|e| AuthError::Internal(e.to_string()))?
        .to_openssh()
        .map_err(|e| AuthError::Internal(e.to_string()))?;
        let tls_cert_pem = self.issue_service_cert(
            &spki,
            &id,
            tls_role,
            vec![],
            self.config.host_cert_ttl,
            false,
        )?;
        self.emit(
            Event::new(EventType::NodeJoin, None)
                .with("success", true)
                .with("kind", node_kind.as_str())
                .with("node_id", id.clone())
                .with("nodename", req.nodename.clone())
                .with("labels", serde_json::to_value(&req.labels)?)
                .with("remote_addr", remote),
        )
        .await?;
        Ok(Joined {
            node_id: id,
            cluster_name: self.config.cluster_name.clone(),
            tls_cert_pem,
            host_ca_pem: self
                .authorities
                .tls_pem(sallyport_core::ca::CaKind::TlsHost),
            ssh_host_cert,
            user_ca_keys: self.user_ca_openssh()?,
        })
    }

    /// An agent's certificates renewed over its keys (asked through the proxy its tunnel is
    /// to, which vouches for the node id from the tunnel's certificate): the same names and
    /// organization as at join, a fresh validity. A removed node gets nothing.
    pub async fn renew_node(
        &self,
        id: &str,
        proxy: &str,
        req: &RenewRequest,
    ) -> Result<Renewed, AuthError> {
        // Only the proxy that holds the node's tunnel now speaks for it.
        let holds = sqlx::query(
            "SELECT 1 AS one FROM node_tunnels WHERE node_id = $1 AND proxy_id = $2 AND last_seen > $3",
        )
        .bind(id)
        .bind(proxy)
        .bind(sallyport_core::unix_now() - PRESENCE_TTL)
        .fetch_optional(&self.backend.pool)
        .await?
        .is_some();
        if !holds {
            // A removed node reads as one.
            let known = self.find_node(id).await?.is_some();
            return Err(if known {
                AuthError::AccessDenied(format!(
                    "proxy {proxy} holds no tunnel of node {id}: only the proxy its tunnel is to may renew it"
                ))
            } else {
                AuthError::NotFound(format!("node {id} is not registered"))
            });
        }
        let node =
            sqlx::query("SELECT hostname, kind FROM nodes WHERE id = $1 AND kind IN ($2, $3)")
                .bind(id)
                .bind(NodeKind::Agent.as_str())
                .bind(NodeKind::Kube.as_str())
                .fetch_optional(&self.backend.pool)
                .await?
                .ok_or_else(|| AuthError::NotFound(format!("node {id} is not registered")))?;
        let hostname: String = node.try_get("hostname")?;
        let kind: NodeKind = crate::backend::word(&node, "kind")?;
        let host_key = PublicKey::from_openssh(req.ssh_host_key.trim()).map_err(|e| {
            AuthError::BadRequest(format!("the host key is not an OpenSSH public key: {e}"))
        })?;
        let spki = base64::engine::general_purpose::STANDARD
            .decode(&req.tls_spki)
            .map_err(|_| AuthError::BadRequest("the TLS key is not base64".into()))?;
        let names = vec![
            hostname.clone(),
            format!("{hostname}.{}", self.config.cluster_name),
            id.to_string(),
        ];
        let ssh_host_cert = sshcert::issue_host(
            &self.authorities.host_signer().key,
            &host_key,
            id,
            &names,
            self.config.host_cert_ttl,
        )
        .map_err(|e| AuthError::Internal(e.to_string()))?
        .to_openssh()
        .map_err(|e| AuthError::Internal(e.to_string()))?;
        let role = if kind == NodeKind::Kube {
            "kube"
        } else {
            "node"
        };
        let tls_cert_pem =
            self.issue_service_cert(&spki, id, role, vec![], self.config.host_cert_ttl, false)?;
        self.emit(
            Event::new(EventType::NodeRenew, None)
                .with("node_id", id)
                .with("nodename", hostname)
                .with("proxy", proxy),
        )
        .await?;
        Ok(Renewed {
            tls_cert_pem,
            ssh_host_cert,
        })
    }

    /// The one answer to a join without a valid token, whatever else the request says.
    async fn join_refused(&self, req: &JoinRequest, remote: &str) -> AuthError {
        let why = "invalid join token: it is unknown, expired or already used; create a new one with `sallyctl tokens add --type=node` (or --type=kube)";
        self.join_failed(req, remote, why).await;
        AuthError::Unauthenticated(why.into())
    }

    /// Audits a refused join (`node.join`, `success: false`), aggregated per address and
    /// reason like every failed authentication: anyone can send joins, so a flood of them must
    /// not flood the log. The name is the caller's, unchecked: clipped.
    async fn join_failed(&self, req: &JoinRequest, remote: &str, why: &str) {
        self.join_refusal(
            EventType::NodeJoin,
            ("nodename", &req.nodename),
            remote,
            why,
        )
        .await;
    }

    /// A refused join of any kind (`node.join`, `proxy.join`) as one aggregated failure, with
    /// the name the caller asked for (`field`), clipped: it is unchecked.
    pub(crate) async fn join_refusal(
        &self,
        event: EventType,
        (field, name): (&str, &str),
        remote: &str,
        why: &str,
    ) {
        let name: String = name
            .chars()
            .take(sallyport_core::names::MAX_NAME + 1)
            .collect();
        self.auth_failed(crate::failures::Failure {
            event,
            door: "join".into(),
            remote_addr: remote.into(),
            reason: why.into(),
            user: None,
            user_exists: false,
            event_fields: vec![
                ("success".into(), false.into()),
                (field.into(), name.into()),
                ("error".into(), why.into()),
            ],
        })
        .await;
    }

    pub fn user_ca_openssh(&self) -> Result<Vec<String>, AuthError> {
        self.authorities
            .ssh_public_keys(sallyport_core::ca::CaKind::User)
            .iter()
            .map(|k| {
                k.to_openssh()
                    .map_err(|e| AuthError::Internal(e.to_string()))
            })
            .collect()
    }

    /// The proxy reports an agent's tunnel; labels the agent sends replace the stored ones.
    /// Labels a node may not set (built-in, oversized) refuse the whole report: the agent
    /// hears why, and a node cannot be online under labels it was refused.
    pub async fn presence(
        &self,
        node_id: &str,
        proxy_id: &str,
        p: &Presence,
    ) -> Result<(), AuthError> {
        if let Some(labels) = &p.labels {
            sallyport_core::names::validate_labels(labels).map_err(AuthError::BadRequest)?;
        }
        let now = sallyport_core::unix_now();
        let mut tx = self.backend.pool.begin().await?;
        // Presence is kept per (agent, proxy): a tunnel that closes on one proxy leaves the
        // node online through the others.
        if p.online {
            sqlx::query(
                "INSERT INTO node_tunnels (node_id, proxy_id, last_seen) VALUES ($1, $2, $3)
                 ON CONFLICT (node_id, proxy_id) DO UPDATE SET last_seen = excluded.last_seen",
            )
            .bind(node_id)
            .bind(proxy_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        } else {
            sqlx::query("DELETE FROM node_tunnels WHERE node_id = $1 AND proxy_id = $2")
                .bind(node_id)
                .bind(proxy_id)
                .execute(&mut *tx)
                .await?;
        }
        let r = match &p.labels {
            Some(labels) => sqlx::query(
                "UPDATE nodes SET last_seen = COALESCE((SELECT MAX(t.last_seen) FROM node_tunnels t WHERE t.node_id = nodes.id), 0), labels = $1
                 WHERE id = $2 AND kind IN ($3, $4)",
            )
            .bind(serde_json::to_string(labels)?)
            .bind(node_id)
            .bind(NodeKind::Agent.as_str())
            .bind(NodeKind::Kube.as_str())
            .execute(&mut *tx)
            .await?,
            None => {
                sqlx::query(
                    "UPDATE nodes SET last_seen = COALESCE((SELECT MAX(t.last_seen) FROM node_tunnels t WHERE t.node_id = nodes.id), 0)
                     WHERE id = $1 AND kind IN ($2, $3)",
                )
                .bind(node_id)
                .bind(NodeKind::Agent.as_str())
                .bind(NodeKind::Kube.as_str())
                .execute(&mut *tx)
                .await?
            }
        };
        if r.rows_affected() == 0 {
            // Not registered (removed): no presence row is left behind for it either.
            return Err(AuthError::NotFound(format!(
                "node {node_id} is not registered"
            )));
        }
        tx.commit().await?;
        Ok(())
    }

    /// Proxy `proxy_id` still holds these nodes' tunnels, their labels unchanged: their presence
    /// through it is refreshed, in one transaction for the lot (a few statements per chunk of
    /// nodes, where a [`presence`](Self::presence) report each was a transaction each). Only
    /// presence rows this proxy already has are refreshed, never made: answers the nodes it
    /// has none for (removed, or dropped when the proxy restarted), which the proxy then
    /// reports one by one, so a removed node is refused exactly as before.
    pub async fn presence_refresh(
        &self,
        proxy_id: &str,
        nodes: &[String],
    ) -> Result<Vec<String>, AuthError> {
        if nodes.len() > sallyport_core::api::MAX_PRESENCE_REFRESH {
            return Err(AuthError::BadRequest(format!(
                "at most {} nodes in one presence refresh",
                sallyport_core::api::MAX_PRESENCE_REFRESH
            )));
        }
        /// Ids bound per statement: far below SQLite's and PostgreSQL's parameter limits.
        const CHUNK: usize = 500;
        let now = sallyport_core::unix_now();
        let mut refreshed = std::collections::HashSet::new();
        let mut tx = self.backend.pool.begin().await?;
        for chunk in nodes.chunks(CHUNK) {
            // Only numbered placeholders are formatted in; every value is bound.
            let list = placeholders(3, chunk.len());
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE node_tunnels SET last_seen = $1 WHERE proxy_id = $2 AND node_id IN ({list})
                 AND node_id IN (SELECT id FROM nodes) RETURNING node_id"
            )))
            .bind(now)
            .bind(proxy_id);
            for id in chunk {
                q = q.bind(id);
            }
            let rows = q.fetch_all(&mut *tx).await?;
            let ids: Vec<String> = rows
                .iter()
                .map(|r| r.try_get::<String, _>("node_id"))
                .collect::<Result<_, _>>()?;
            if ids.is_empty() {
                continue;
            }
            let list = placeholders(4, ids.len());
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE nodes SET last_seen = COALESCE((SELECT MAX(t.last_seen) FROM node_tunnels t WHERE t.node_id = nodes.id), 0)
                 WHERE kind IN ($1, $2) AND last_seen < $3 AND id IN ({list})"
            )))
            .bind(NodeKind::Agent.as_str())
            .bind(NodeKind::Kube.as_str())
            .bind(now);
            for id in &ids {
                q = q.bind(id);
            }
            q.execute(&mut *tx).await?;
            refreshed.extend(ids);
        }
        tx.commit().await?;
        let mut unknown: Vec<String> = nodes
            .iter()
            .filter(|n| !refreshed.contains(*n))
            .cloned()
            .collect();
        unknown.sort();
        unknown.dedup();
        Ok(unknown)
    }

    /// Host certificate for a registered node's names over the proxy's key, so that the proxy
    /// can terminate a client's inner SSH connection as that node.
    pub async fn proxy_host_cert(&self, node: &str, public_key: &str) -> Result<String, AuthError> {
        let n = self
            .find_node(node)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("node {node} is not registered")))?;
        // A node registered before names were checked may carry one the proxy answers to: no
        // host certificate for it, or the proxy would serve sessions under its own name.
        sallyport_core::names::validate_node(
            &n.hostname,
            &self.config.cluster_name,
            &self.reserved_names().await?,
        )
        .map_err(|e| {
            AuthError::AccessDenied(format!(
                "{e}; an administrator must remove node {} (`sallyctl nodes rm {}`) and join it under another name",
                n.hostname, n.id
            ))
        })?;
        let key = PublicKey::from_openssh(public_key.trim())
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        let names = vec![
            n.hostname.clone(),
            format!("{}.{}", n.hostname, self.config.cluster_name),
            n.id.clone(),
        ];
        sshcert::issue_host(
            &self.authorities.host_signer().key,
            &key,
            &n.id,
            &names,
            Duration::from_secs(86400),
        )
        .and_then(|c| c.to_openssh().map_err(Into::into))
        .map_err(|e| AuthError::Internal(e.to_string()))
    }

    /// Decides a session (roles, node labels, login) and, if allowed, certifies the proxy's
    /// per-session key for exactly that login and records the session's start.
    /// `proxy`: the proxy the session runs through (only its restart marks it incomplete).
    pub async fn session_grant(
        &self,
        req: &SessionRequest,
        proxy: &str,
    ) -> Result<SessionGrant, AuthError> {
        if let Some(exec) = &req.kube {
            return self.kube_session_grant(req, exec, proxy).await;
        }
        let reject = |why: String| {
            Event::new(EventType::SessionReject, Some(&req.user))
                .with("login", req.login.clone())
                .with("node", req.node.clone())
                .with("reason", why)
                .with("remote_addr", req.remote_addr.clone())
        };
        let Some(user) = self.get_user(&req.user).await? else {
            let why = format!("user {} no longer exists", req.user);
            self.emit_logged(reject(why.clone())).await;
            return Err(AuthError::AccessDenied(why));
        };
        if let Err(e) = self.check_lock(&user.name).await {
            self.emit_logged(reject(e.to_string())).await;
            return Err(e);
        }
        let Some(node) = self.find_node(&req.node).await? else {
            let why = format!("node {} is not registered", req.node);
            self.emit_logged(reject(why.clone())).await;
            return Err(AuthError::NotFound(why));
        };
        let set = self.role_set(&user.roles, &user.traits).await?;
        let decision = set.check_node(&req.login, &crate::api::node_labels(&node));
        if !decision.allowed {
            self.emit_logged(reject(decision.explanation.clone())).await;
            return Err(AuthError::AccessDenied(format!(
                "{} as {} on {}: {}",
                req.user, req.login, node.hostname, decision.explanation
            )));
        }
        // Read before the connection is registered: nothing after the registration refuses
        // the request as a bad one (the proxy then says when the connection closes).
        let key = PublicKey::from_openssh(req.public_key.trim())
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        let connection_registered = self.within_limits(&set, req, proxy, reject).await?;
        let now = sshcert::now();
        let logins = vec![req.login.clone()];
        // An agentless sshd trusts the OpenSSH CA, which signs nothing but these; agents check
        // the user CA they received at join, inside their mutually authenticated tunnel.
        let signer = if node.kind == NodeKind::Agentless {
            self.authorities.openssh_signer()
        } else {
            self.authorities.user_signer()
        };
        // Host user creation is an agent's: sshd would ignore the extension anyway.
        let host_user = (node.kind == NodeKind::Agent)
            .then(|| set.host_user(&req.login, &crate::api::node_labels(&node)))
            .flatten();
        // The user's address rides in the certificate, so the node's SSH_CONNECTION is the
        // user's and no one but auth can set it. So does the host user decision: the agent
        // acts on it because auth signed it.
        let cert = sshcert::issue_session(
            &signer.key,
            &UserCertRequest {
                public_key: &key,
                user: &user.name,
                roles: &user.roles,
                logins: &logins,
                valid_after: now.saturating_sub(60),
                valid_before: now + SESSION_CERT_TTL.as_secs(),
                permits: Permits {
                    pty: true,
                    port_forwarding: set.port_forwarding(),
                    agent_forwarding: set.forward_agent(),
                    x11_forwarding: set.permit_x11_forwarding(),
                },
            },
            &req.remote_addr,
            host_user.as_ref(),
        )
        .map_err(|e| AuthError::Internal(e.to_string()))?;
        let id = uuid::Uuid::new_v4().to_string();
        sqlx::query("INSERT INTO sessions (id, user_name, login, node, node_id, kind, start, status, proxy) VALUES ($1, $2, $3, $4, $5, $7, $6, $8, $9)")
            .bind(&id)
            .bind(&user.name)
            .bind(&req.login)
            .bind(&node.hostname)
            .bind(&node.id)
            .bind(sallyport_core::unix_now())
            .bind(SessionKind::Ssh.as_str())
            .bind(SessionStatus::Running.as_str())
            .bind(proxy)
            .execute(&self.backend.pool)
            .await?;
        let record = set.record_ssh();
        self.emit(
            Event::new(EventType::SessionStart, Some(&user.name))
                .with("session_id", id.clone())
                .with("login", req.login.clone())
                .with("node", node.hostname.clone())
                .with("node_id", node.id.clone())
                .with("remote_addr", req.remote_addr.clone())
                .with("explanation", decision.explanation.clone()),
        )
        .await?;
        Ok(SessionGrant {
            session_id: id,
            connection_registered,
            ssh_cert: cert
                .to_openssh()
                .map_err(|e| AuthError::Internal(e.to_string()))?,
            record,
            port_forwarding: set.port_forwarding(),
            forward_agent: set.forward_agent(),
            file_copy: set.ssh_file_copy(),
            x11_forwarding: set.permit_x11_forwarding(),
            idle_timeout_secs: set.client_idle_timeout().map(|d| d.as_secs().max(1)),
            disconnect_expired_cert: set.disconnect_expired_cert(),
            record_input: set.record_input(),
            max_sessions: Some(
                set.max_sessions()
                    .unwrap_or(sallyport_core::api::DEFAULT_MAX_SESSIONS),
            ),
            host_user,
            explanation: decision.explanation,
            node,
        })
    }

    /// Checks a running session's grant again, as the user's roles and locks stand now: the
    /// proxy asks before each new connection through a forward, so removing the user, locking
    /// them or taking `port_forwarding` away stops forwards that were opened before.
    pub async fn session_check(
        &self,
        id: &str,
    ) -> Result<sallyport_core::api::GrantCheck, AuthError> {
        let row = sqlx::query("SELECT user_name, login, node_id FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.backend.pool)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("session {id} does not exist")))?;
        let (user_name, login, node_id): (String, String, String) = (
            row.try_get("user_name")?,
            row.try_get("login")?,
            row.try_get("node_id")?,
        );
        let Some(user) = self.get_user(&user_name).await? else {
            return Err(AuthError::AccessDenied(format!(
                "user {user_name} no longer exists"
            )));
        };
        self.check_lock(&user.name).await?;
        let Some(node) = self.find_node(&node_id).await? else {
            return Err(AuthError::NotFound(format!(
                "node {node_id} is not registered"
            )));
        };
        let set = self.role_set(&user.roles, &user.traits).await?;
        let decision = set.check_node(&login, &crate::api::node_labels(&node));
        if !decision.allowed {
            return Err(AuthError::AccessDenied(format!(
                "{user_name} as {login} on {}: {}",
                node.hostname, decision.explanation
            )));
        }
        Ok(sallyport_core::api::GrantCheck {
            port_forwarding: set.port_forwarding(),
            forward_agent: set.forward_agent(),
            x11_forwarding: set.permit_x11_forwarding(),
        })
    }

    pub async fn session_end(&self, id: &str, end: &SessionEnd) -> Result<(), AuthError> {
        let row = sqlx::query("SELECT id, user_name, login, node, start, end_time, exit_code, status, kind, command FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.backend.pool)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("session {id} does not exist")))?;
        let s = session_from_row(&row)?;
        let start: i64 = row.try_get("start")?;
        let now = sallyport_core::unix_now();
        // An end is complete unless the proxy says otherwise.
        let status = match end.status {
            SessionStatus::Incomplete => SessionStatus::Incomplete,
            SessionStatus::Complete | SessionStatus::Running => SessionStatus::Complete,
        };
        sqlx::query("UPDATE sessions SET end_time = $1, exit_code = $2, bytes_in = $3, bytes_out = $4, status = $5, kind = $6, command = $7 WHERE id = $8")
            .bind(now)
            .bind(end.exit_code)
            .bind(end.bytes_in as i64)
            .bind(end.bytes_out as i64)
            .bind(status.as_str())
            .bind(end.kind.unwrap_or(s.kind).as_str())
            .bind(end.command.as_deref().map(|c| storable_text(c).into_owned()))
            .bind(id)
            .execute(&self.backend.pool)
            .await?;
        let mut events = Vec::with_capacity(2);
        if let Some(cmd) = &end.command {
            events.push(
                Event::new(EventType::Exec, Some(&s.user))
                    .with("session_id", id)
                    .with("login", s.login.clone())
                    .with("node", s.node.clone())
                    .with("command", cmd.clone())
                    .with("exit_code", end.exit_code),
            );
        }
        events.push(
            Event::new(EventType::SessionEnd, Some(&s.user))
                .with("session_id", id)
                .with("login", s.login)
                .with("node", s.node)
                .with("exit_code", end.exit_code)
                .with("bytes_in", end.bytes_in)
                .with("bytes_out", end.bytes_out)
                .with("duration_secs", now - start)
                .with("status", status.as_str()),
        );
        // The command and the end in one write.
        self.emit_all(events).await
    }

    /// What a running session is doing (shell or the command), so that even a session whose
    /// proxy dies says what it was.
    pub async fn session_update(
        &self,
        id: &str,
        kind: SessionKind,
        command: Option<&str>,
    ) -> Result<(), AuthError> {
        sqlx::query("UPDATE sessions SET kind = $1, command = $2 WHERE id = $3 AND status = $4")
            .bind(kind.as_str())
            .bind(command.map(|c| storable_text(c).into_owned()))
            .bind(id)
            .bind(SessionStatus::Running.as_str())
            .execute(&self.backend.pool)
            .await?;
        Ok(())
    }

    /// Records what the proxy saw inside session `id`: who, as which login and where come from
    /// the session's own row, never from the report.
    pub async fn session_events(
        &self,
        id: &str,
        events: &[sallyport_core::api::SessionEvent],
    ) -> Result<(), AuthError> {
        if events.len() > 10_000 {
            return Err(AuthError::BadRequest(
                "too many events in one report".into(),
            ));
        }
        let types = events
            .iter()
            .map(|e| {
                EventType::from_name(&e.event)
                    .filter(|t| t.source() != Source::Auth)
                    .ok_or_else(|| {
                        AuthError::BadRequest(format!("{:?} is not a session event", e.event))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let s = self
            .get_session(id)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("session {id} does not exist")))?;
        let mut batch = Vec::with_capacity(events.len());
        for (e, t) in events.iter().zip(types) {
            let mut event = Event::new(t, Some(&s.user));
            for (k, v) in &e.fields {
                if !matches!(
                    k.as_str(),
                    "session_id" | "login" | "node" | "user" | "event" | "time" | "seq"
                ) {
                    event = event.with(k, v.clone());
                }
            }
            event = event
                .with("session_id", s.session_id.clone())
                .with("login", s.login.clone())
                .with("node", s.node.clone());
            batch.push(event);
        }
        self.emit_all(batch).await
    }

    pub async fn list_sessions(
        &self,
        only_user: Option<&str>,
    ) -> Result<Vec<SessionInfo>, AuthError> {
        let rows = sqlx::query(
            "SELECT id, user_name, login, node, start, end_time, exit_code, status, kind, command FROM sessions
             WHERE ($1 = '' OR user_name = $1) ORDER BY start, end_time, id",
        )
        .bind(only_user.unwrap_or(""))
        .fetch_all(&self.backend.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    pub async fn get_session(&self, id: &str) -> Result<Option<SessionInfo>, AuthError> {
        let row = sqlx::query("SELECT id, user_name, login, node, start, end_time, exit_code, status, kind, command FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.backend.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }
}

/// `$first, $first+1, ...`: `n` numbered placeholders for an `IN (...)` list.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
