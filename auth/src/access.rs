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

/// `f` over the labels [`node_labels`] gives, without a copy of the map: the built-in labels
/// are put into the node's own map for the call, and what they replaced is put back after.
/// For listings: 10,000 nodes' copies were 10,000 maps and 40,000 strings made and freed.
pub fn with_node_labels<T>(n: &mut NodeInfo, f: impl FnOnce(&BTreeMap<String, String>) -> T) -> T {
    let hostname = n.labels.insert("hostname".into(), n.hostname.clone());
    let id = n.labels.insert("id".into(), n.id.clone());
    let out = f(&n.labels);
    for (key, before) in [("id", id), ("hostname", hostname)] {
        match before {
            Some(v) => n.labels.insert(key.into(), v),
            None => n.labels.remove(key),
        };
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use sallyport_core::api::NodeKind;

    fn node(labels: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            id: "5f0c".into(),
            hostname: "web1".into(),
            addr: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            kind: NodeKind::Agent,
            online: true,
            logins: None,
        }
    }

    /// The listing's labels are the ones a session's decision uses, and the node is left as it
    /// was, a stored `hostname` or `id` label (rows written before labels were checked) too.
    #[test]
    fn labels_lent_for_a_listing_are_those_a_session_sees_and_the_node_is_unchanged() {
        for labels in [
            &[("env", "prod")][..],
            &[("env", "prod"), ("hostname", "forged"), ("id", "forged")][..],
            &[][..],
        ] {
            let mut n = node(labels);
            let before = n.labels.clone();
            let seen = with_node_labels(&mut n, |l| l.clone());
            assert_eq!(seen, node_labels(&n));
            assert_eq!(seen.get("hostname").map(String::as_str), Some("web1"));
            assert_eq!(seen.get("id").map(String::as_str), Some("5f0c"));
            assert_eq!(n.labels, before);
        }
    }
}
