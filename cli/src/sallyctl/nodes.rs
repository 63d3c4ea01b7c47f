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
