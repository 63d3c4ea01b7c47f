//! `sallyctl access check`: would a user be let in, and which role and rule decided. The exit
//! code says it too (0 allowed, 1 denied), for scripts.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use super::resources::parse_labels;
use crate::http::Api;
use crate::println;

#[derive(Subcommand)]
pub(super) enum AccessCommand {
    Check {
        #[arg(long)]
        user: String,
        /// A node's hostname or id.
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        login: Option<String>,
        #[arg(long)]
        kube_cluster: Option<String>,
        /// The cluster's labels, k=v,k2=v2.
        #[arg(long)]
        kube_labels: Option<String>,
        /// kind/namespace/name, e.g. pod/staging-web/web-1.
        #[arg(long)]
        kube_resource: Option<String>,
        #[arg(long)]
        verb: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

pub(super) async fn access(api: &Api, cmd: &AccessCommand) -> Result<ExitCode> {
    let AccessCommand::Check {
        user,
        node,
        login,
        kube_cluster,
        kube_labels,
        kube_resource,
        verb,
        format,
    } = cmd;
    let kube_labels = match kube_labels {
        Some(l) => parse_labels(l)?,
        None => Default::default(),
    };
    let d: sallyport_core::role::Decision = api
        .post(
            routes::auth::ACCESS_CHECK,
            &AccessCheck {
                user: user.clone(),
                node: node.clone(),
                login: login.clone(),
                kube_cluster: kube_cluster.clone(),
                kube_labels,
                kube_resource: kube_resource.clone(),
                verb: verb.clone(),
            },
        )
        .await?;
    if *format == Format::Json {
        println!("{}", serde_json::to_string(&d)?);
    } else {
        println!(
            "{}: {}",
            if d.allowed { "allowed" } else { "denied" },
            d.explanation
        );
    }
    Ok(if d.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::EXIT_FAILURE)
    })
}
