//! Kubernetes access, auth's side: the clusters a person's roles reach, kubeconfig
//! certificates (the user TLS CA over the login's own key, naming one cluster, never outliving
//! the login), what the proxy needs to decide each request itself (current roles, traits and
//! the cluster's labels), and the `kube.request` records the proxy reports.

use sallyport_core::api::{
    KubeAccess, KubeAccessRequest, KubeCert, KubeClusterInfo, KubeRecord, NodeInfo,
};
use sallyport_core::audit::{Event, EventType};
use sallyport_core::kube::{KubeCertExt, cluster_labels};
use sallyport_core::role::RoleSet;
use time::OffsetDateTime;

use crate::{AuthError, AuthServer};

/// At most this many records in one report.
pub const MAX_REQUEST_BATCH: usize = 1024;

pub fn cluster_info(n: &NodeInfo) -> KubeClusterInfo {
    KubeClusterInfo {
        name: n.hostname.clone(),
        id: n.id.clone(),
        labels: n.labels.clone(),
        online: n.online,
    }
}

/// The labels roles match a cluster on: its agent's plus `kube_cluster: NAME`.
pub fn kube_labels(n: &NodeInfo) -> std::collections::BTreeMap<String, String> {
    cluster_labels(&n.hostname, &n.labels)
}

impl AuthServer {
    /// The clusters `set` reaches (all of them for `all`: an admin who may list clusters).
    pub async fn kube_clusters_for(
        &self,
        set: Option<&RoleSet>,
    ) -> Result<Vec<KubeClusterInfo>, AuthError> {
        Ok(self
            .list_kube_clusters()
            .await?
            .iter()
            .filter(|n| set.is_none_or(|s| s.can_see_kube(&kube_labels(n))))
            .map(cluster_info)
            .collect())
    }

    /// A kubeconfig certificate for `user` on `cluster`, over the public key of the login
    /// certificate they called with (`spki`), expiring with it (`not_after`, Unix seconds).
    pub async fn kube_cert(
        &self,
        user: &str,
        cluster: &str,
        spki: &[u8],
        not_after: i64,
    ) -> Result<KubeCert, AuthError> {
        let u = self
            .get_user(user)
            .await?
            .ok_or_else(|| AuthError::AccessDenied(format!("user {user} no longer exists")))?;
        self.check_lock(&u.name).await?;
        let set = self.role_set(&u.roles, &u.traits).await?;
        // One answer for a cluster that does not exist and one the roles do not reach: a
        // person learns no cluster's name they could not use.
        let unknown = || {
            AuthError::AccessDenied(format!(
                "no Kubernetes cluster {cluster} that your roles allow; see `sally kube ls`"
            ))
        };
        let n = self.find_kube_cluster(cluster).await?.ok_or_else(unknown)?;
        let labels = kube_labels(&n);
        if !set.can_see_kube(&labels) {
            return Err(unknown());
        }
        let (groups, users) = set.kube_principals(&labels);
        let now = OffsetDateTime::now_utc();
        let not_after = OffsetDateTime::from_unix_timestamp(not_after).map_err(|_| {
            AuthError::BadRequest("the login certificate's expiry is out of range".into())
        })?;
        if not_after <= now {
            return Err(AuthError::Unauthenticated(
                "the login has expired: run `sally login`".into(),
            ));
        }
        let ext = KubeCertExt {
            kube_cluster: n.hostname.clone(),
            kube_users: users.clone(),
            kube_groups: groups.clone(),
        };
        let subject = sallyport_core::x509::Subject {
            common_name: u.name.clone(),
            organizations: u.roles.clone(),
            dns_names: vec![],
            server: false,
            not_before: now - time::Duration::minutes(1),
            not_after,
        };
        let cert_pem = self
            .authorities
            .tls_user_signer()
            .sign_with(spki, &subject, Some(&ext))
            .map_err(|e| AuthError::BadRequest(format!("cannot certify that key: {e}")))?;
        Ok(KubeCert {
            cert_pem,
            expires: sallyport_core::rfc3339(not_after.unix_timestamp()),
            kube_users: users,
            kube_groups: groups,
        })
    }

    /// What the proxy needs to decide requests of `user` on `cluster`: the user's current
    /// roles and traits (unlocked, existing) and the cluster's labels.
    pub async fn kube_access(&self, req: &KubeAccessRequest) -> Result<KubeAccess, AuthError> {
        let n = self.find_kube_cluster(&req.cluster).await?.ok_or_else(|| {
            AuthError::NotFound(format!(
                "Kubernetes cluster {} is not registered",
                req.cluster
            ))
        })?;
        let u = self.get_user(&req.user).await?.ok_or_else(|| {
            AuthError::AccessDenied(format!("user {} no longer exists", req.user))
        })?;
        self.check_lock(&u.name).await?;
        let mut roles = Vec::with_capacity(u.roles.len());
        for name in &u.roles {
            if let Some(r) = self.get_role(name).await? {
                roles.push(r);
            }
        }
        Ok(KubeAccess {
            user: u.name,
            roles,
            traits: u.traits,
            cluster: cluster_info(&n),
        })
    }

    /// Writes the proxy's `kube.request` and `kube.port_forward` records, in the order
    /// reported.
    pub async fn kube_records(&self, records: &[KubeRecord]) -> Result<(), AuthError> {
        if records.len() > MAX_REQUEST_BATCH {
            return Err(AuthError::BadRequest(format!(
                "at most {MAX_REQUEST_BATCH} records a report"
            )));
        }
        let mut events = Vec::with_capacity(records.len());
        for r in records {
            let e = match r {
                KubeRecord::Request(r) => {
                    let mut e = Event::new(EventType::KubeRequest, Some(&r.user))
                        .with("kube_cluster", r.kube_cluster.clone())
                        .with("method", r.method.clone())
                        .with("path", r.path.clone())
                        .with("verb", r.verb.clone())
                        .with("kind", r.kind.clone())
                        .with("namespace", r.namespace.clone())
                        .with("name", r.name.clone())
                        .with("response_code", r.response_code)
                        .with("allowed", r.allowed)
                        .with("reason", r.reason.clone())
                        .with("kube_users", r.kube_users.clone())
                        .with("kube_groups", r.kube_groups.clone())
                        .with("remote_addr", r.remote_addr.clone());
                    if let Some(c) = &r.kubectl_command {
                        e = e.with("kubectl_command", c.clone());
                    }
                    e
                }
                KubeRecord::PortForward(p) => {
                    let mut e = Event::new(EventType::KubePortForward, Some(&p.user))
                        .with("action", p.action.clone())
                        .with("kube_cluster", p.kube_cluster.clone())
                        .with("namespace", p.namespace.clone())
                        .with("pod", p.pod.clone())
                        .with("ports", p.ports.clone())
                        .with("kube_users", p.kube_users.clone())
                        .with("kube_groups", p.kube_groups.clone())
                        .with("remote_addr", p.remote_addr.clone());
                    if let Some(d) = p.duration_secs {
                        e = e.with("duration_secs", d);
                    }
                    if let Some(r) = &p.reason {
                        e = e.with("reason", r.clone());
                    }
                    e
                }
            };
            events.push(e);
        }
        // One write for the report, all or nothing: a report auth fails is sent again whole.
        self.emit_all(events).await
    }
}

impl AuthServer {
    /// Decides one `kubectl exec` or `attach` (the door's choice of principals decided again
    /// with the user's current roles), certifies the proxy's per-session key for the kube
    /// agent with exactly that exec signed in, and records the session's start.
    pub(crate) async fn kube_session_grant(
        &self,
        req: &sallyport_core::api::SessionRequest,
        exec: &sallyport_core::kube::KubeExec,
        proxy: &str,
    ) -> Result<sallyport_core::api::SessionGrant, AuthError> {
        use russh::keys::ssh_key::PublicKey;
        use sallyport_core::api::{SessionGrant, SessionKind, SessionStatus};
        use sallyport_core::sshcert::{self, Permits, UserCertRequest};

        let reject = |why: String| {
            Event::new(EventType::SessionReject, Some(&req.user))
                .with("login", exec.kube_user.clone())
                .with("node", req.node.clone())
                .with("kube_cluster", req.node.clone())
                .with("namespace", exec.namespace.clone())
                .with("pod", exec.pod.clone())
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
        let Some(cluster) = self.find_kube_cluster(&req.node).await? else {
            let why = format!("Kubernetes cluster {} is not registered", req.node);
            self.emit_logged(reject(why.clone())).await;
            return Err(AuthError::NotFound(why));
        };
        let set = self.role_set(&user.roles, &user.traits).await?;
        let labels = kube_labels(&cluster);
        let request = sallyport_core::role::KubeRequest {
            kind: "pod",
            namespace: &exec.namespace,
            name: &exec.pod,
            verb: "exec",
        };
        let decision = set.check_kube(&labels, &request);
        let principals = if decision.allowed {
            let (groups, users) = set.kube_principals_for(&labels, Some(&request));
            let asked = sallyport_core::kube::AskedImpersonation {
                users: vec![exec.kube_user.clone()],
                groups: exec.kube_groups.clone(),
                other: vec![],
            };
            sallyport_core::kube::impersonate(&user.name, &users, &groups, &asked)
        } else {
            Err(decision.explanation.clone())
        };
        let principals = match principals {
            Ok(p) => p,
            Err(why) => {
                self.emit_logged(reject(why.clone())).await;
                return Err(AuthError::AccessDenied(format!(
                    "{} may not exec in pod {} in namespace {}: {why}",
                    user.name, exec.pod, exec.namespace
                )));
            }
        };
        // Read before the connection is registered: nothing after the registration refuses
        // the request as a bad one (the proxy then says when the connection closes).
        let key = PublicKey::from_openssh(req.public_key.trim())
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        let connection_registered = self.within_limits(&set, req, proxy, reject).await?;
        let exec = sallyport_core::kube::KubeExec {
            kube_user: principals.user.clone(),
            kube_groups: principals.groups.clone(),
            ..exec.clone()
        };
        let now = sshcert::now();
        let logins = vec![principals.user.clone()];
        let cert = sshcert::issue_kube_session(
            &self.authorities.user_signer().key,
            &UserCertRequest {
                public_key: &key,
                user: &user.name,
                roles: &user.roles,
                logins: &logins,
                valid_after: now.saturating_sub(60),
                valid_before: now + crate::ssh_access::SESSION_CERT_TTL.as_secs(),
                permits: Permits {
                    pty: true,
                    ..Default::default()
                },
            },
            &req.remote_addr,
            &exec,
        )
        .map_err(|e| AuthError::Internal(e.to_string()))?;
        let id = uuid::Uuid::new_v4().to_string();
        let command = exec.command_line();
        sqlx::query("INSERT INTO sessions (id, user_name, login, node, node_id, kind, command, start, status, proxy) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
            .bind(&id)
            .bind(&user.name)
            .bind(&principals.user)
            .bind(format!("{}/{}/{}", cluster.hostname, exec.namespace, exec.pod))
            .bind(&cluster.id)
            .bind(SessionKind::Exec.as_str())
            .bind(&command)
            .bind(sallyport_core::unix_now())
            .bind(SessionStatus::Running.as_str())
            .bind(proxy)
            .execute(&self.backend.pool)
            .await?;
        self.emit(
            Event::new(EventType::SessionStart, Some(&user.name))
                .with("session_id", id.clone())
                .with("login", principals.user.clone())
                .with("node", cluster.hostname.clone())
                .with("node_id", cluster.id.clone())
                .with("kube_cluster", cluster.hostname.clone())
                .with("namespace", exec.namespace.clone())
                .with("pod", exec.pod.clone())
                .with("container", exec.container.clone())
                .with("command", command)
                .with("tty", exec.tty)
                .with("protocol", exec.protocol.clone())
                .with("kube_users", vec![principals.user.clone()])
                .with("kube_groups", principals.groups.clone())
                .with("remote_addr", req.remote_addr.clone())
                .with("explanation", decision.explanation.clone()),
        )
        .await?;
        Ok(SessionGrant {
            session_id: id,
            connection_registered,
            node: cluster,
            ssh_cert: cert
                .to_openssh()
                .map_err(|e| AuthError::Internal(e.to_string()))?,
            record: set.record_ssh(),
            port_forwarding: false,
            forward_agent: false,
            file_copy: false,
            x11_forwarding: false,
            idle_timeout_secs: set.client_idle_timeout().map(|d| d.as_secs().max(1)),
            disconnect_expired_cert: set.disconnect_expired_cert(),
            record_input: set.record_input(),
            max_sessions: Some(
                set.max_sessions()
                    .unwrap_or(sallyport_core::api::DEFAULT_MAX_SESSIONS),
            ),
            host_user: None,
            explanation: decision.explanation,
        })
    }
}
