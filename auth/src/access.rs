//! What the doors would decide for a person, explained (`sallyctl access check`), and the labels
//! a node is matched by. The decisions themselves are `sallyport_core::role`'s; this module
//! only finds the user, their roles and the node to decide on.

use std::collections::BTreeMap;

use sallyport_core::api::{AccessCheck, NodeInfo};
use sallyport_core::role::{Decision, KubeRequest};

use crate::{AuthError, AuthServer};

/// A node's labels as roles see them: its own, then the built-in ones from the registry
/// (`hostname` and `id`, as Teleport does), which win over anything stored (a row written
/// before labels were checked cannot override them).
pub fn node_labels(n: &NodeInfo) -> BTreeMap<String, String> {
    let mut l = n.labels.clone();
    l.insert("hostname".into(), n.hostname.clone());
    l.insert("id".into(), n.id.clone());
    l
}

impl AuthServer {
    /// The decision the doors would make for `req`, with the role and rule that decide it.
    pub async fn access_check(&self, req: &AccessCheck) -> Result<Decision, AuthError> {
        let user = self
            .get_user(&req.user)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("user {} does not exist", req.user)))?;
        let set = self.role_set(&user.roles, &user.traits).await?;
        if let Some(node) = &req.node {
            let login = req
                .login
                .as_deref()
                .ok_or_else(|| AuthError::BadRequest("--node needs --login".into()))?;
            let n = self
                .find_node(node)
                .await?
                .ok_or_else(|| AuthError::NotFound(format!("node {node} is not registered")))?;
            return Ok(set.check_node(login, &node_labels(&n)));
        }
        if let Some(resource) = &req.kube_resource {
            let parts: Vec<&str> = resource.split('/').collect();
            let [kind, namespace, name] = parts[..] else {
                return Err(AuthError::BadRequest(format!(
                    "--kube-resource {resource:?} must be kind/namespace/name"
                )));
            };
            let verb = req
                .verb
                .as_deref()
                .ok_or_else(|| AuthError::BadRequest("--kube-resource needs --verb".into()))?;
            // A registered cluster is checked with its own labels, as the kube door does.
            let mut labels = req.kube_labels.clone();
            if let Some(c) = &req.kube_cluster {
                if req.kube_labels.is_empty()
                    && let Some(n) = self.find_kube_cluster(c).await?
                {
                    labels = crate::kube::kube_labels(&n);
                }
                labels.insert("kube_cluster".into(), c.clone());
            }
            return Ok(set.check_kube(
                &labels,
                &KubeRequest {
                    kind,
                    namespace,
                    name,
                    verb,
                },
            ));
        }
        Err(AuthError::BadRequest("say what to check: --node NODE --login LOGIN, or --kube-resource kind/ns/name --verb VERB".into()))
    }
}
