//! Kubernetes access, auth's side: the clusters a person's roles reach, kubeconfig
//! certificates (the user TLS CA over the login's own key, naming one cluster, never outliving
//! the login), what the proxy needs to decide each request itself (current roles, traits and
//! the cluster's labels), and the `kube.request` records the proxy reports.

use sallyport_core::api::{
    KubeAccess, KubeAccessRequest, KubeCert, KubeClusterInfo, KubeRequestRecord, NodeInfo,
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

    /// Writes the proxy's `kube.request` records, in the order reported.
    pub async fn kube_requests(&self, records: &[KubeRequestRecord]) -> Result<(), AuthError> {
        if records.len() > MAX_REQUEST_BATCH {
            return Err(AuthError::BadRequest(format!(
                "at most {MAX_REQUEST_BATCH} records a report"
            )));
        }
        for r in records {
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
            self.emit(e).await?;
        }
        Ok(())
    }
}
