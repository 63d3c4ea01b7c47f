//! `sally ssh`: a shell, a command (on one node or every node a label selector matches) and
//! port or agent forwarding, through the proxy with the client's own SSH stack.

use anyhow::{Result, anyhow, bail};
use sallyport_core::api::*;
use sallyport_core::routes;

use super::nodes::{matches, nodes, parse_selector};
use crate::profile::Profile;

/// The proxy's SSH port, as its ping says (the web port is the one the profile names).
pub(super) async fn ssh_port(p: &Profile) -> Result<u16> {
    let ping: serde_json::Value = crate::http::proxy_api(p)?.get(routes::web::PING).await?;
    ping["ssh_port"]
        .as_u64()
        .and_then(|v| u16::try_from(v).ok())
        .ok_or_else(|| anyhow!("the proxy serves no SSH port"))
}

/// The login when none is given: `$USER` when the roles allow it, else the first they allow.
pub(super) fn default_login(p: &Profile) -> Result<String> {
    let local = std::env::var("USER").unwrap_or_default();
    if p.logins.contains(&local) {
        return Ok(local);
    }
    p.logins
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("your roles allow no logins; ask an admin"))
}

/// `sally ssh`'s forwarding flags.
pub(super) struct Forwards {
    pub(super) local: Vec<crate::forward::Spec>,
    pub(super) remote: Vec<crate::forward::Spec>,
    pub(super) dynamic: Vec<crate::forward::DynamicSpec>,
    pub(super) agent: bool,
    pub(super) no_command: bool,
}

impl Forwards {
    fn any(&self) -> bool {
        !self.local.is_empty() || !self.remote.is_empty() || !self.dynamic.is_empty() || self.agent
    }
}

pub(super) async fn ssh(
    tty: bool,
    no_tty: bool,
    login: Option<String>,
    target: &str,
    command: Vec<String>,
    fwd: Forwards,
) -> Result<i32> {
    use std::io::IsTerminal;
    let p = Profile::require()?;
    let keys = crate::ssh::Keys::load(&p)?;
    let (login, target) = match target.split_once('@') {
        Some((l, t)) => (l.to_string(), t.to_string()),
        None => (
            match login {
                Some(l) => l,
                None => default_login(&p)?,
            },
            target.to_string(),
        ),
    };
    let command = (!command.is_empty()).then(|| command.join(" "));
    let port = ssh_port(&p).await?;
    let proxy = crate::ssh::connect_proxy(&p, &keys, port).await?;
    if fwd.no_command && command.is_some() {
        bail!("-N runs no command; drop the command or -N");
    }
    if target.contains('=') && (fwd.any() || fwd.no_command) {
        bail!("forwarding (-L, -R, -D, -A, -N) needs one node, not a label selector");
    }
    if target.contains('=') {
        // A label selector: run on every matching node, output prefixed by node name.
        let sel = parse_selector(std::slice::from_ref(&target))?;
        let targets: Vec<NodeInfo> = nodes(&p)
            .await?
            .into_iter()
            .filter(|n| matches(n, &sel))
            .collect();
        if targets.is_empty() {
            bail!("no node you can reach matches {target}");
        }
        let command = command.ok_or_else(|| anyhow!("a label selector needs a command to run"))?;
        let runs = targets.iter().map(|n| {
            let (proxy, keys, login, command) = (&proxy, &keys, &login, command.clone());
            async move {
                let r = async {
                    let (h, f) = crate::ssh::connect_node(
                        proxy,
                        keys,
                        &n.hostname,
                        login,
                        Default::default(),
                    )
                    .await?;
                    crate::ssh::run_session(
                        &h,
                        &f,
                        Some(command),
                        false,
                        false,
                        crate::ssh::Output::Prefixed(n.hostname.clone()),
                        false,
                    )
                    .await
                }
                .await;
                match r {
                    Ok(code) => code,
                    Err(e) => {
                        eprintln!("[{}] error: {e:#}", n.hostname);
                        255
                    }
                }
            }
        });
        let codes = futures::future::join_all(runs).await;
        return Ok(codes.into_iter().find(|&c| c != 0).unwrap_or(0));
    }
    let tty = !no_tty && (tty || (command.is_none() && std::io::stdin().is_terminal()));
    let mut incoming = crate::forward::Incoming::default();
    let mut forward_agent = false;
    if fwd.agent {
        match std::env::var_os("SSH_AUTH_SOCK") {
            Some(sock) => {
                incoming.agent = Some(sock.into());
                forward_agent = true;
            }
            None => eprintln!("sally: -A: no agent to forward ($SSH_AUTH_SOCK is not set)"),
        }
    }
    let (h, f) = crate::ssh::connect_node(&proxy, &keys, &target, &login, incoming.clone()).await?;
    let h = std::sync::Arc::new(h);
    for spec in fwd.local {
        crate::forward::local(h.clone(), f.clone(), spec).await?;
    }
    for spec in fwd.dynamic {
        crate::forward::dynamic(h.clone(), f.clone(), spec).await?;
    }
    for spec in fwd.remote {
        crate::forward::remote(&h, &incoming, spec).await?;
    }
    if fwd.no_command {
        // Forward until interrupted or the connection ends.
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(0),
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                    if h.is_closed() {
                        eprintln!("sally: connection to {target} closed");
                        return Ok(255);
                    }
                }
            }
        }
    }
    match crate::ssh::run_session(
        &h,
        &f,
        command,
        tty,
        true,
        crate::ssh::Output::Direct,
        forward_agent,
    )
    .await
    {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(255)
        }
    }
}
