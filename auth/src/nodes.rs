//! The node registry: agentless nodes registered by admins (agents register themselves at join,
//! in `ssh_access`). Names and labels follow `sallyport_core::names`: no name the proxy answers
//! to, no built-in label.

use std::collections::BTreeMap;

use sallyport_core::api::{AddNode, NodeInfo, NodeKind};
use sallyport_core::audit::{Event, EventType};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::backend::Kind;
use crate::{AuthError, AuthServer};

fn node_from_row(r: &AnyRow) -> Result<NodeInfo, AuthError> {
    let labels: String = r.try_get("labels")?;
    let kind: NodeKind = crate::backend::word(r, "kind")?;
    Ok(NodeInfo {
        id: r.try_get("id")?,
        hostname: r.try_get("hostname")?,
        addr: r.try_get("addr")?,
        labels: serde_json::from_str(&labels)?,
        online: node_online(
            kind,
            r.try_get("last_seen")?,
            sallyport_core::unix_now() - crate::ssh_access::PRESENCE_TTL,
        ),
        logins: None,
        kind,
    })
}

/// Online: heard from since `since` through a tunnel. Agentless nodes have no tunnel to lose:
/// they are as reachable as their address.
fn node_online(kind: NodeKind, last_seen: i64, since: i64) -> bool {
    kind == NodeKind::Agentless || last_seen > since
}

pub use sallyport_core::names::parse_labels;

impl AuthServer {
    pub async fn add_node(&self, req: &AddNode, by: &str) -> Result<NodeInfo, AuthError> {
        // An agentless node gets host certificates for its names too (the proxy terminates
        // SSH as it): the same names are reserved as for agents.
        sallyport_core::names::validate_node(
            &req.name,
            &self.config.cluster_name,
            &self.reserved_names().await?,
        )
        .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        sallyport_core::names::validate_labels(&req.labels).map_err(AuthError::BadRequest)?;
        if req.addr.parse::<std::net::SocketAddr>().is_err() && !req.addr.contains(':') {
            return Err(AuthError::BadRequest(format!(
                "node address {:?} must be HOST:PORT",
                req.addr
            )));
        }
        let node = NodeInfo {
            id: uuid::Uuid::new_v4().to_string(),
            hostname: req.name.clone(),
            addr: Some(req.addr.clone()),
            labels: req.labels.clone(),
            kind: NodeKind::Agentless,
            online: true,
            logins: None,
        };
        let now = sallyport_core::unix_now();
        let r = sqlx::query(
            "INSERT INTO nodes (id, hostname, addr, labels, kind, created, updated) VALUES ($1, $2, $3, $4, $5, $6, $6)
             ON CONFLICT (hostname) DO NOTHING",
        )
        .bind(&node.id)
        .bind(&node.hostname)
        .bind(req.addr.clone())
        .bind(serde_json::to_string(&node.labels)?)
        .bind(node.kind.as_str())
        .bind(now)
        .execute(&self.backend.pool)
        .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::Conflict(format!(
                "a node named {} already exists",
                req.name
            )));
        }
        self.emit(
            Event::new(EventType::NodeCreate, Some(by))
                .with("name", req.name.clone())
                .with("addr", req.addr.clone()),
        )
        .await?;
        Ok(node)
    }

    /// Every node people reach by SSH (Kubernetes clusters are listed by `kube`), by hostname.
    ///
    /// The database hands the whole list over as one JSON document (one row), each node's
    /// labels in it as an object: 10,000 rows through the driver one at a time (each converted,
    /// sent from SQLite's worker thread and decoded column by column) took 60-100 ms, most of a
    /// `sally ls` over them. The sort is ours: sorting inside the aggregate cost SQLite more.
    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>, AuthError> {
        let sql = match self.backend.kind {
            Kind::Sqlite => {
                "SELECT json_group_array(json_array(id, hostname, addr, json(labels), kind, last_seen)) AS nodes
                 FROM nodes WHERE kind <> $1"
            }
            Kind::Postgres => {
                "SELECT COALESCE(json_agg(json_build_array(id, hostname, addr, labels::json, kind, last_seen))::text, '[]') AS nodes
                 FROM nodes WHERE kind <> $1"
            }
        };
        let row = sqlx::query(sql)
            .bind(NodeKind::Kube.as_str())
            .fetch_one(&self.backend.pool)
            .await?;
        let text: String = row.try_get("nodes")?;
        type Listed = (
            String,
            String,
            Option<String>,
            BTreeMap<String, String>,
            NodeKind,
            i64,
        );
        let listed: Vec<Listed> = serde_json::from_str(&text)
            .map_err(|e| AuthError::Internal(format!("the nodes table's listing: {e}")))?;
        let online_since = sallyport_core::unix_now() - crate::ssh_access::PRESENCE_TTL;
        let mut nodes: Vec<NodeInfo> = listed
            .into_iter()
            .map(|(id, hostname, addr, labels, kind, last_seen)| NodeInfo {
                id,
                hostname,
                addr,
                labels,
                online: node_online(kind, last_seen, online_since),
                logins: None,
                kind,
            })
            .collect();
        nodes.sort_unstable_by(|a, b| a.hostname.cmp(&b.hostname));
        Ok(nodes)
    }

    /// A node by hostname or id (never a Kubernetes cluster: no SSH reaches one).
    pub async fn find_node(&self, name_or_id: &str) -> Result<Option<NodeInfo>, AuthError> {
        let row = sqlx::query(
            "SELECT id, hostname, addr, labels, kind, last_seen FROM nodes WHERE (hostname = $1 OR id = $1) AND kind <> $2",
        )
        .bind(name_or_id)
        .bind(NodeKind::Kube.as_str())
        .fetch_optional(&self.backend.pool)
        .await?;
        row.as_ref().map(node_from_row).transpose()
    }

    /// The id of whatever is registered under `name` (node or Kubernetes cluster): one name
    /// space for both.
    pub async fn name_taken(&self, name: &str) -> Result<Option<String>, AuthError> {
        let row = sqlx::query("SELECT id FROM nodes WHERE hostname = $1")
            .bind(name)
            .fetch_optional(&self.backend.pool)
            .await?;
        Ok(row.map(|r| r.try_get("id")).transpose()?)
    }

    /// Kubernetes clusters, registered by their kube agents' joins.
    pub async fn list_kube_clusters(&self) -> Result<Vec<NodeInfo>, AuthError> {
        let rows = sqlx::query(
            "SELECT id, hostname, addr, labels, kind, last_seen FROM nodes WHERE kind = $1 ORDER BY hostname",
        )
        .bind(NodeKind::Kube.as_str())
        .fetch_all(&self.backend.pool)
        .await?;
        rows.iter().map(node_from_row).collect()
    }

    /// A Kubernetes cluster by name or id.
    pub async fn find_kube_cluster(&self, name_or_id: &str) -> Result<Option<NodeInfo>, AuthError> {
        let row = sqlx::query(
            "SELECT id, hostname, addr, labels, kind, last_seen FROM nodes WHERE (hostname = $1 OR id = $1) AND kind = $2",
        )
        .bind(name_or_id)
        .bind(NodeKind::Kube.as_str())
        .fetch_optional(&self.backend.pool)
        .await?;
        row.as_ref().map(node_from_row).transpose()
    }

    pub async fn remove_node(&self, name_or_id: &str, by: &str) -> Result<(), AuthError> {
        // The node and its presence rows go together: a presence refresh checks both anyway.
        let mut tx = self.backend.pool.begin().await?;
        let r = sqlx::query("DELETE FROM nodes WHERE hostname = $1 OR id = $1")
            .bind(name_or_id)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!(
                "node {name_or_id} does not exist"
            )));
        }
        sqlx::query("DELETE FROM node_tunnels WHERE node_id NOT IN (SELECT id FROM nodes)")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.emit(Event::new(EventType::NodeDelete, Some(by)).with("name", name_or_id))
            .await
    }

    /// Pins `key` as an agentless node's host key if none is pinned; returns the pinned key.
    pub async fn pin_host_key(&self, id: &str, key: &str) -> Result<String, AuthError> {
        sqlx::query(
            "UPDATE nodes SET host_key = $1 WHERE id = $2 AND host_key IS NULL AND kind = $3",
        )
        .bind(key)
        .bind(id)
        .bind(NodeKind::Agentless.as_str())
        .execute(&self.backend.pool)
        .await?;
        let row = sqlx::query("SELECT host_key FROM nodes WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.backend.pool)
            .await?;
        row.and_then(|r| r.try_get::<Option<String>, _>(0).ok().flatten())
            .ok_or_else(|| AuthError::NotFound(format!("node {id} is not registered")))
    }
}
