//! `sallyctl nodes`: register agentless OpenSSH nodes, list and remove nodes.

use anyhow::Result;
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use super::resources::{parse_labels, print_nodes};
use crate::http::Api;
use crate::println;

#[derive(Subcommand)]
pub(super) enum NodesCommand {
    /// Register an OpenSSH server that trusts `sallyctl auth export --type=user`.
    Add {
        #[arg(long)]
        name: String,
        #[arg(long)]
        addr: String,
        #[arg(long, default_value = "")]
        labels: String,
    },
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    Rm {
        name: String,
    },
}

pub(super) async fn nodes(api: &Api, cmd: &NodesCommand) -> Result<()> {
    match cmd {
        NodesCommand::Add { name, addr, labels } => {
            let n: NodeInfo = api
                .post(
                    routes::auth::NODES,
                    &AddNode {
                        name: name.clone(),
                        addr: addr.clone(),
                        labels: parse_labels(labels)?,
                    },
                )
                .await?;
            println!("node {} registered at {} (id {})", n.hostname, addr, n.id);
        }
        NodesCommand::Ls { format } => {
            let nodes: Vec<NodeInfo> = api.get(routes::auth::NODES).await?;
            if *format == Format::Json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
            } else {
                print_nodes(&nodes);
            }
        }
        NodesCommand::Rm { name } => {
            let _: serde_json::Value = api.delete(&routes::auth::node(name)).await?;
            println!("node {name} removed");
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub(super) enum ProxiesCommand {
    /// The cluster's proxies: name, id, addresses, online (heard from within 30 s).
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Remove a proxy: its certificate is refused at once; it must join again with a new token.
    Rm { name: String },
}

pub(super) async fn proxies(api: &Api, cmd: &ProxiesCommand) -> Result<()> {
    match cmd {
        ProxiesCommand::Ls { format } => {
            let proxies: Vec<ProxyInfo> = api.get(routes::auth::PROXIES).await?;
            if *format == Format::Json {
                println!("{}", serde_json::to_string_pretty(&proxies)?);
            } else {
                println!(
                    "{:<24} {:<36} {:<8} {:<22} TUNNEL",
                    "NAME", "ID", "STATUS", "WEB"
                );
                for p in &proxies {
                    println!(
                        "{:<24} {:<36} {:<8} {:<22} {}",
                        p.name,
                        p.id,
                        if p.online { "online" } else { "offline" },
                        p.addrs.web,
                        p.addrs.tunnel
                    );
                }
            }
        }
        ProxiesCommand::Rm { name } => {
            let _: serde_json::Value = api.delete(&routes::auth::proxy(name)).await?;
            println!("proxy {name} removed: its certificate is refused from now on");
        }
    }
    Ok(())
}
