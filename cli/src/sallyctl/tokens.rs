//! `sallyctl tokens`: one-time join tokens for agents, with the command to run on the server.

use anyhow::{Result, anyhow};
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::{Format, GetFormat};
use crate::http::Api;
use crate::println;

#[derive(Subcommand)]
pub(super) enum TokensCommand {
    /// A one-time token an agent joins with, and the command to run on the server.
    Add {
        /// node: an SSH node's agent; kube: a Kubernetes cluster's kube agent; proxy: a proxy
        /// service on a host of its own.
        #[arg(long = "type", value_parser = ["node", "kube", "proxy"])]
        kind: String,
        #[arg(long, default_value = "30m")]
        ttl: String,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

pub(super) async fn tokens(api: &Api, command: &TokensCommand) -> Result<()> {
    match command {
        TokensCommand::Add { kind, ttl, format } => {
            let ttl = sallyport_core::duration::parse(ttl).map_err(|e| anyhow!("--ttl: {e}"))?;
            let t: JoinToken = api
                .post(
                    routes::auth::JOIN_TOKENS,
                    &AddJoinToken {
                        kind: kind.parse()?,
                        ttl_secs: ttl.as_secs(),
                    },
                )
                .await?;
            if *format == Format::Json {
                println!(
                    "{}",
                    serde_json::to_string(
                        &serde_json::json!({"token": t.token, "expires": t.expires})
                    )?
                );
            } else {
                let s: Status = api.get(routes::auth::STATUS).await?;
                let pin = s.ca_pins.first().cloned().unwrap_or_default();
                println!(
                    "The join token {} expires at {} and works once.",
                    t.token, t.expires
                );
                if kind == "proxy" {
                    println!("Run this on the proxy's host:\n");
                    println!(
                        "  sallyport start --roles=proxy --auth-server=AUTH:3025 --token={} --ca-pin={pin} --data-dir /var/lib/sallyport\n",
                        t.token
                    );
                    println!("AUTH is the auth service's address as the proxy reaches it.");
                    return Ok(());
                }
                if kind == "kube" {
                    println!(
                        "Run this where the Kubernetes API is reachable (in the cluster, leave out --kubeconfig: the pod's service account is used):\n"
                    );
                    println!(
                        "  sallyport start --roles=kube --proxy=PROXY:3080 --token={} --ca-pin={pin} --data-dir /var/lib/sallyport --kube-cluster NAME --kubeconfig FILE --labels env=dev\n",
                        t.token
                    );
                } else {
                    println!(
                        "Run this on the server (as root, so sessions can run as any login):\n"
                    );
                    println!(
                        "  sallyport start --roles=node --proxy=PROXY:3080 --token={} --ca-pin={pin} --data-dir /var/lib/sallyport --labels env=dev\n",
                        t.token
                    );
                }
                println!("PROXY is the proxy's address as the server reaches it.");
            }
        }
        TokensCommand::Ls { format } => {
            super::resources::get(
                api,
                "tokens",
                if *format == Format::Json {
                    GetFormat::Json
                } else {
                    GetFormat::Text
                },
            )
            .await?
        }
    }
    Ok(())
}
