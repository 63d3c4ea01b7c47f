//! `sallyctl status` (cluster name, CA pins, counts, whether the audit log is still anchored)
//! and `sallyctl auth export` (a CA's public part).

use anyhow::Result;
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use crate::http::Api;
use crate::{print, println};

#[derive(Subcommand)]
pub(super) enum AuthCommand {
    /// Print a CA's public part: `openssh` for an agentless node's sshd (TrustedUserCAKeys: it
    /// signs only the proxy's per-session certificates), `user` for what checks people's login
    /// certificates, `host` as a known_hosts line, `tls-user` / `tls-host` as PEM.
    Export {
        #[arg(long = "type", value_parser = ["user", "host", "openssh", "tls-user", "tls-host"])]
        kind: String,
    },
}

pub(super) async fn status(api: &Api, format: Format) -> Result<()> {
    let s: Status = api.get(routes::auth::STATUS).await?;
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("Cluster:       {}", s.cluster_name);
        println!(
            "CA pin:        {}",
            s.ca_pins.first().map(String::as_str).unwrap_or("-")
        );
        for (kind, fps) in &s.ssh_ca_fingerprints {
            println!("{:<14} {}", format!("SSH {kind} CA:"), fps.join(", "));
        }
        println!("Users:         {}", s.users);
        println!("Roles:         {}", s.roles);
        println!("Audit events:  {}", s.audit_events);
        if let Some(why) = &s.audit_anchoring_stopped {
            println!("Audit anchor:  STOPPED: {why}");
        }
    }
    Ok(())
}

pub(super) async fn auth(api: &Api, command: &AuthCommand) -> Result<()> {
    let AuthCommand::Export { kind } = command;
    let e: CaExport = api.get(&routes::auth::ca(kind)).await?;
    print!("{}", e.text);
    Ok(())
}
