//! `sally ls`: the nodes the user's roles reach, and the label selectors `ls` and `ssh` share.

use anyhow::{Result, anyhow};
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use crate::profile::Profile;
use crate::{print, println};

pub(super) fn parse_selector(items: &[String]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in items.iter().flat_map(|i| i.split(',')) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("{item:?} is not a label selector k=v"))?;
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

pub(super) async fn nodes(p: &Profile) -> Result<Vec<NodeInfo>> {
    crate::http::user_api(p)?.get(routes::auth::NODES).await
}

pub(super) fn matches(n: &NodeInfo, sel: &[(String, String)]) -> bool {
    sel.iter().all(|(k, v)| match k.as_str() {
        "hostname" => &n.hostname == v,
        "id" => &n.id == v,
        _ => n.labels.get(k) == Some(v),
    })
}

pub(super) async fn ls(labels: &[String], format: Format) -> Result<()> {
    let p = Profile::require()?;
    let sel = parse_selector(labels)?;
    let list: Vec<NodeInfo> = nodes(&p)
        .await?
        .into_iter()
        .filter(|n| matches(n, &sel))
        .collect();
    if format == Format::Json {
        let v: Vec<serde_json::Value> = list
            .iter()
            .map(|n| serde_json::json!({"hostname": n.hostname, "id": n.id, "labels": n.labels, "online": n.online}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        // The whole table in one write: a line at a time was a system call each (10,000 of
        // them for 10,000 nodes, a good part of the command's time).
        use std::fmt::Write;
        let mut table = format!("{:<24} {:<36} {:<8} LABELS\n", "NODE", "ID", "STATUS");
        for n in &list {
            let _ = write!(
                table,
                "{:<24} {:<36} {:<8} ",
                n.hostname,
                n.id,
                if n.online { "online" } else { "offline" },
            );
            for (i, (k, v)) in n.labels.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(table, "{sep}{k}={v}");
            }
            table.push('\n');
        }
        print!("{table}");
    }
    Ok(())
}
