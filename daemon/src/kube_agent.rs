//! The kube agent in the daemon: `sallyport start --roles=kube` on its own, and the local kube
//! agent an all-in-one daemon starts when `kube_service` is enabled. Either joins once with a
//! kube token (`kube-agent-identity.json` in the data dir afterwards), then keeps its tunnel to
//! the proxy and forwards what arrives in it to the API server (`sallyport_agent::kube`).
//!
//! The kubeconfig (or the service account) is read before joining: one the agent cannot use
//! stops the start with the reason, before a token is spent or the cluster is announced.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Result, bail};
use sallyport_agent::AgentIdentity;
use sallyport_agent::kube::{KubeServer, KubeUpstream};
use sallyport_auth::AuthServer;
use sallyport_core::api::{AddJoinToken, TokenKind};
use sallyport_core::tls::Trust;

use crate::config::Config;
use crate::start::{Flags, shutdown_signal};

/// The API server this daemon's kube agent forwards to.
fn upstream(cfg: &Config) -> Result<KubeUpstream> {
    Ok(KubeUpstream::load(
        cfg.kube_service.kubeconfig_file.as_deref(),
    )?)
}

/// `sallyport start --roles=kube`: join once, then keep the tunnel to the proxy.
pub async fn run(cfg: &Config, flags: &Flags) -> Result<()> {
    let name = cfg
        .kube_service
        .cluster_name()
        .map_err(anyhow::Error::msg)?
        .to_string();
    let upstream = upstream(cfg)?;
    let joined = AgentIdentity::load_kube(&cfg.sallyport.data_dir)?.is_some();
    let (proxy, token, trust) = crate::start::join_settings(cfg, flags, joined, "a kube agent")?;
    kube_agent_main(
        &cfg.sallyport.data_dir,
        cfg,
        upstream,
        Join {
            proxy,
            token,
            trust,
            local: false,
        },
        name,
        false,
    )
    .await
}

/// An all-in-one daemon's own kube agent, joined through the proxy's web address `web` with a
/// token minted in-process. Returns the line `sallyport start` prints for it.
pub fn start_local(cfg: &Config, auth: &Arc<AuthServer>, web: String) -> Result<String> {
    let name = cfg
        .kube_service
        .cluster_name()
        .map_err(anyhow::Error::msg)?
        .to_string();
    // The agent joins in the background, where a name auth refuses would only be a log line:
    // refuse it here, before the cluster claims to serve it.
    sallyport_core::names::validate_node(
        &name,
        &auth.config.cluster_name,
        &auth.config.public_names,
    )
    .map_err(|e| anyhow::anyhow!("kube_service.kube_cluster_name: {e}"))?;
    if cfg.ssh_service.enabled && crate::start::local_nodename(cfg).ok().as_deref() == Some(&name) {
        bail!(
            "kube_service.kube_cluster_name: {name} is the local node's name too; give the cluster another"
        );
    }
    let upstream = upstream(cfg)?;
    let host_ca = auth
        .authorities
        .tls_pem(sallyport_core::ca::CaKind::TlsHost);
    let trust = Trust::Roots(sallyport_core::x509::pem_to_ders(&host_ca)?);
    let agent_cfg = cfg.clone();
    let auth = auth.clone();
    let line = format!("kube-agent {name} (local kube agent)");
    tokio::spawn(async move {
        let dir = &agent_cfg.sallyport.data_dir;
        let token = match AgentIdentity::load_kube(dir) {
            Ok(Some(_)) => None,
            _ => auth
                .add_join_token(
                    &AddJoinToken {
                        kind: TokenKind::Kube,
                        ttl_secs: 600,
                    },
                    "@local",
                )
                .await
                .map_err(|e| tracing::error!(error = %e, "no join token for the local kube agent"))
                .ok()
                .map(|t| t.token),
        };
        let join = Join {
            proxy: Some(web),
            token,
            trust,
            local: true,
        };
        if let Err(e) = kube_agent_main(dir, &agent_cfg, upstream, join, name, true).await {
            tracing::error!(error = format!("{e:#}"), "the local kube agent stopped");
        }
    });
    Ok(line)
}

/// How a kube agent joins when it has no identity yet.
struct Join {
    proxy: Option<String>,
    token: Option<String>,
    trust: Trust,
    /// The all-in-one's own agent, joining through this process's proxy.
    local: bool,
}

async fn kube_agent_main(
    dir: &Path,
    cfg: &Config,
    upstream: KubeUpstream,
    join: Join,
    name: String,
    quiet: bool,
) -> Result<()> {
    let identity = match AgentIdentity::load_kube(dir)? {
        Some(mut id) => {
            if join.local
                && let Some(web) = &join.proxy
            {
                // This process's own tunnel door may listen on another port than at the last
                // start (port 0 in the config): ask the web door where it is now.
                let http = sallyport_agent::join::http_client(join.trust.clone())?;
                match sallyport_agent::join::tunnel_addr(&http, web).await {
                    Ok(addr) if addr != id.tunnel_addr => {
                        id.tunnel_addr = addr;
                        id.save_kube(dir)?;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "the local kube agent keeps its saved tunnel address")
                    }
                }
            }
            if id.nodename != name {
                tracing::warn!(
                    joined = %id.nodename,
                    configured = %name,
                    "this kube agent joined as {} and keeps that name; remove {} to join again as {name}",
                    id.nodename,
                    sallyport_agent::identity::kube_path(dir).display()
                );
            }
            id
        }
        None => {
            let proxy = join.proxy.ok_or_else(|| {
                anyhow::anyhow!("first start of a kube agent: give --proxy HOST:3080 and --token")
            })?;
            let token = join.token.ok_or_else(|| {
                anyhow::anyhow!(
                    "first start of a kube agent: give --token (from `sallyctl tokens add --type=kube`)"
                )
            })?;
            let params = sallyport_agent::join::JoinParams {
                proxy,
                token,
                kind: TokenKind::Kube,
                nodename: name,
                labels: cfg.kube_service.labels.clone(),
                trust: join.trust,
            };
            let id = sallyport_agent::join::join(&params).await?;
            id.save_kube(dir)?;
            id
        }
    };
    if !quiet {
        println!(
            "kube cluster {} ({}) joined cluster {}; tunnel to {}",
            identity.nodename, identity.node_id, identity.cluster_name, identity.tunnel_addr
        );
    }
    tracing::info!(kube_cluster = %identity.nodename, api_server = %upstream.server(), "kube agent forwarding");
    let labels: sallyport_agent::tunnel::Labels =
        Arc::new(std::sync::Mutex::new(cfg.kube_service.labels.clone()));
    for c in &cfg.kube_service.commands {
        sallyport_agent::tunnel::spawn_label_command(
            labels.clone(),
            c.name.clone(),
            c.command.clone(),
            c.period.0,
        );
    }
    let server = Arc::new(KubeServer::new(upstream).with_exec(&identity)?);
    let dir = cfg.sallyport.data_dir.clone();
    let keep: sallyport_agent::tunnel::Keep = Arc::new(move |id| id.save_kube(&dir));
    tokio::select! {
        _ = sallyport_agent::tunnel::run(Arc::new(identity), labels, server, keep) => Ok(()),
        _ = shutdown_signal() => Ok(()),
    }
}
