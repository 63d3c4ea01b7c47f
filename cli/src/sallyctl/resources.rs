//! `sallyctl create`, `get`, `rm` and `edit`: resources by kind and name (`role/NAME`,
//! `users`, `oidc/NAME`, ...), read from and printed as YAML, JSON or a table.

use anyhow::{Context, Result, anyhow, bail};
use sallyport_core::api::*;
use sallyport_core::routes;

use super::GetFormat;
use crate::http::Api;
use crate::{print, println};

pub(super) async fn create(api: &Api, file: &std::path::Path, force: bool) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let resources = sallyport_core::resource::parse_all(&text, &file.display().to_string())
        .map_err(anyhow::Error::msg)?;
    for r in resources {
        match r {
            sallyport_core::resource::Resource::Oidc(connector) => {
                let res: PutRoleResult = api
                    .post(
                        routes::auth::CONNECTORS,
                        &PutConnector {
                            connector,
                            overwrite: force,
                        },
                    )
                    .await?;
                println!(
                    "oidc connector {} {}",
                    res.name,
                    if res.created { "created" } else { "updated" }
                );
            }
            sallyport_core::resource::Resource::Role(role) => {
                let res: PutRoleResult = api
                    .post(
                        routes::auth::ROLES,
                        &PutRole {
                            revision: None,
                            role,
                            overwrite: force,
                        },
                    )
                    .await?;
                println!(
                    "role {} {}",
                    res.name,
                    if res.created { "created" } else { "updated" }
                );
            }
        }
    }
    Ok(())
}

/// `role/NAME` → ("role", Some("NAME")); `roles` → ("role", None).
pub(super) fn parse_target(what: &str) -> Result<(&'static str, Option<&str>)> {
    let (kind, name) = match what.split_once('/') {
        Some((k, n)) if !n.is_empty() => (k, Some(n)),
        Some(_) => bail!("{what:?}: give a name after the slash"),
        None => (what, None),
    };
    let kind = match kind {
        "role" | "roles" => "role",
        "user" | "users" => "user",
        "token" | "tokens" => "token",
        "node" | "nodes" => "node",
        "kube_cluster" | "kube_clusters" => "kube_cluster",
        "lock" | "locks" => "lock",
        "oidc" | "connector" | "connectors" => "connector",
        other => bail!(
            "unknown resource {other:?}: use roles, role/NAME, users, user/NAME, tokens, nodes, kube_clusters, locks, connectors or oidc/NAME"
        ),
    };
    Ok((kind, name))
}

pub(super) fn print_yaml<T: serde::Serialize>(items: &[T]) -> Result<()> {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            println!("---");
        }
        print!(
            "{}",
            serde_saphyr::to_string(item).map_err(|e| anyhow!("yaml: {e}"))?
        );
    }
    Ok(())
}

pub(super) fn print_json<T: serde::Serialize>(items: &[T], single: bool) -> Result<()> {
    if single {
        if let Some(first) = items.first() {
            println!("{}", serde_json::to_string_pretty(first)?);
        }
    } else {
        println!("{}", serde_json::to_string_pretty(items)?);
    }
    Ok(())
}

pub(super) async fn get(api: &Api, what: &str, format: GetFormat) -> Result<()> {
    let (kind, name) = parse_target(what)?;
    match kind {
        "role" => {
            let roles: Vec<sallyport_core::role::Role> = match name {
                Some(n) => vec![api.get(&routes::auth::role(n)).await?],
                None => api.get(routes::auth::ROLES).await?,
            };
            match format {
                GetFormat::Yaml => print_yaml(&roles)?,
                GetFormat::Json => print_json(&roles, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<24} DESCRIPTION", "ROLE");
                    for r in &roles {
                        println!(
                            "{:<24} {}",
                            r.metadata.name,
                            r.metadata.description.as_deref().unwrap_or("")
                        );
                    }
                }
            }
        }
        "user" => {
            let users: Vec<UserInfo> = match name {
                Some(n) => vec![api.get(&routes::auth::user(n)).await?],
                None => api.get(routes::auth::USERS).await?,
            };
            match format {
                GetFormat::Yaml => print_yaml(&users)?,
                GetFormat::Json => print_json(&users, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<24} {:<6} {:<8} ROLES", "USER", "TYPE", "STATUS");
                    for u in &users {
                        println!(
                            "{:<24} {:<6} {:<8} {}",
                            u.name,
                            u.user_type,
                            u.status,
                            u.roles.join(",")
                        );
                    }
                }
            }
        }
        "token" => {
            let tokens: Vec<TokenInfo> = api.get(routes::auth::TOKENS).await?;
            match format {
                GetFormat::Yaml => print_yaml(&tokens)?,
                GetFormat::Json => print_json(&tokens, false)?,
                GetFormat::Text => {
                    println!("{:<8} {:<24} EXPIRES", "TYPE", "USER");
                    for t in &tokens {
                        println!(
                            "{:<8} {:<24} {}",
                            // as_str: a Display that writes its word ignores the width.
                            t.kind.as_str(),
                            t.user.as_deref().unwrap_or("-"),
                            t.expires
                        );
                    }
                }
            }
        }
        "kube_cluster" => {
            let all: Vec<KubeClusterInfo> = api.get(routes::auth::KUBE_CLUSTERS).await?;
            let list: Vec<_> = all
                .into_iter()
                .filter(|c| name.is_none_or(|n| c.name == n || c.id == n))
                .collect();
            if let Some(n) = name
                && list.is_empty()
            {
                bail!("Kubernetes cluster {n} does not exist");
            }
            match format {
                GetFormat::Yaml => print_yaml(&list)?,
                GetFormat::Json => print_json(&list, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<24} {:<36} {:<8} LABELS", "KUBE CLUSTER", "ID", "STATUS");
                    for c in &list {
                        let labels: Vec<String> =
                            c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        println!(
                            "{:<24} {:<36} {:<8} {}",
                            c.name,
                            c.id,
                            if c.online { "online" } else { "offline" },
                            labels.join(",")
                        );
                    }
                }
            }
        }
        "connector" => {
            let all: Vec<sallyport_core::oidc::OidcConnector> =
                api.get(routes::auth::CONNECTORS).await?;
            let list: Vec<_> = all
                .into_iter()
                .filter(|c| name.is_none_or(|n| c.metadata.name == n))
                .collect();
            if let Some(n) = name
                && list.is_empty()
            {
                bail!("connector {n} does not exist");
            }
            match format {
                GetFormat::Yaml => print_yaml(&list)?,
                GetFormat::Json => print_json(&list, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<20} {:<6} {:<40} CLIENT", "CONNECTOR", "TYPE", "ISSUER");
                    for c in &list {
                        println!(
                            "{:<20} {:<6} {:<40} {}",
                            c.metadata.name,
                            c.kind.as_str(),
                            c.spec.issuer_url,
                            c.spec.client_id
                        );
                    }
                }
            }
        }
        "lock" => {
            let locks: Vec<LockInfo> = api.get(routes::auth::LOCKS).await?;
            match format {
                GetFormat::Yaml => print_yaml(&locks)?,
                GetFormat::Json => print_json(&locks, false)?,
                GetFormat::Text => {
                    println!("{:<36} {:<20} {:<26} MESSAGE", "ID", "USER", "EXPIRES");
                    for l in &locks {
                        println!(
                            "{:<36} {:<20} {:<26} {}",
                            l.id,
                            l.user,
                            l.expires.as_deref().unwrap_or("(until removed)"),
                            l.message
                        );
                    }
                }
            }
        }
        _ => {
            let nodes: Vec<NodeInfo> = api.get(routes::auth::NODES).await?;
            let nodes: Vec<NodeInfo> = nodes
                .into_iter()
                .filter(|n| name.is_none_or(|x| n.hostname == x || n.id == x))
                .collect();
            if let Some(n) = name
                && nodes.is_empty()
            {
                bail!("node {n} does not exist");
            }
            match format {
                GetFormat::Yaml => print_yaml(&nodes)?,
                GetFormat::Json => print_json(&nodes, name.is_some())?,
                GetFormat::Text => print_nodes(&nodes),
            }
        }
    }
    Ok(())
}

pub(super) fn print_nodes(nodes: &[NodeInfo]) {
    println!("{:<24} {:<36} {:<22} LABELS", "NODE", "ID", "ADDRESS");
    for n in nodes {
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<24} {:<36} {:<22} {}",
            n.hostname,
            n.id,
            n.addr.as_deref().unwrap_or("(tunnel)"),
            labels.join(",")
        );
    }
}

pub(super) async fn rm(api: &Api, what: &str) -> Result<()> {
    let (kind, name) = parse_target(what)?;
    let name = name.ok_or_else(|| anyhow!("say which one: {kind}/NAME"))?;
    let path = match kind {
        "role" => routes::auth::role(name),
        "user" => routes::auth::user(name),
        // One registry: a Kubernetes cluster is removed as a node is.
        "node" | "kube_cluster" => routes::auth::node(name),
        "lock" => routes::auth::lock(name),
        "connector" => routes::auth::connector(name),
        _ => bail!("tokens expire on their own; `sallyctl users reset` replaces a sign-up token"),
    };
    let _: serde_json::Value = api.delete(&path).await?;
    println!("{kind} {name} deleted");
    Ok(())
}

pub(super) async fn edit(api: &Api, what: &str) -> Result<()> {
    let (kind, name) = parse_target(what)?;
    let (Some(name), "role") = (name, kind) else {
        bail!("only role/NAME can be edited")
    };
    let role: sallyport_core::role::Role = api.get(&routes::auth::role(name)).await?;
    let original = serde_saphyr::to_string(&role).map_err(|e| anyhow!("yaml: {e}"))?;
    let path =
        std::env::temp_dir().join(format!("sallyctl-role-{name}-{}.yaml", std::process::id()));
    crate::profile::write_file(&path, original.as_bytes(), 0o600)?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .with_context(|| format!("cannot run the editor {editor:?}"))?;
    if !status.success() {
        bail!(
            "the editor {editor:?} failed; nothing was saved (your edit is in {})",
            path.display()
        );
    }
    let edited = std::fs::read_to_string(&path)?;
    if edited == original {
        let _ = std::fs::remove_file(&path);
        println!("role {name}: no changes");
        return Ok(());
    }
    let parsed = sallyport_core::resource::parse_all(&edited, &path.display().to_string());
    let keep = |e: String| {
        anyhow!(
            "{e}\nnothing was saved; your edit is kept in {} (fix it, then `sallyctl create -f` it)",
            path.display()
        )
    };
    let mut resources = parsed.map_err(keep)?;
    let Some(sallyport_core::resource::Resource::Role(new)) =
        resources.pop().filter(|_| resources.is_empty())
    else {
        return Err(keep("the file must hold exactly one role".into()));
    };
    if new.metadata.name != name {
        return Err(keep(format!(
            "the role's name cannot change in an edit ({name} → {})",
            new.metadata.name
        )));
    }
    let _: PutRoleResult = api
        .post(
            routes::auth::ROLES,
            &PutRole {
                revision: None,
                role: new,
                overwrite: true,
            },
        )
        .await
        .map_err(|e| keep(e.to_string()))?;
    let _ = std::fs::remove_file(&path);
    println!("role {name} updated");
    Ok(())
}

pub(super) fn parse_labels(text: &str) -> Result<std::collections::BTreeMap<String, String>> {
    sallyport_core::names::parse_labels(text).map_err(anyhow::Error::msg)
}
