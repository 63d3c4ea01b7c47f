//! `sallyport start`: checks the config and data dir, opens auth, issues the services their
//! certificates, writes the local admin identity for `sallyctl`, and serves until a signal.
//! It prints the addresses it listens on: a port 0 in the config is the one the kernel gave,
//! and only that bound address is used inside (the local agent, the proxy's client for auth,
//! the ports `/v1/webapi/ping` advertises, the admin identity).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rcgen::{KeyPair, PublicKeyData};
use russh::keys::ssh_key::PrivateKey;
use sallyport_auth::{AuthConfig, AuthServer};
use sallyport_core::ca::CaKind;
use sallyport_core::tls::{ClientAuth, private_key_from_pem, server_config};
use sallyport_core::x509::pem_to_ders;
use sallyport_proxy::ServiceIdentity;

use crate::proxy_join::ProxyIdentity;
use tokio::net::TcpListener;

use crate::config::{Config, LogFormat, SecondFactor, Severity};

/// The file `sallyctl --data-dir` reads: the local admin's client certificate and key.
pub const ADMIN_IDENTITY: &str = "admin-identity.json";

/// `sallyport start` flags beyond the config file.
pub struct Flags {
    pub roles: Vec<String>,
    pub proxy: Option<String>,
    /// `--auth-server`: auth's addresses, for a proxy without auth in its process.
    pub auth_server: Vec<String>,
    pub token: Option<String>,
    pub labels: Option<String>,
    pub nodename: Option<String>,
    pub ca_pin: Option<String>,
    pub insecure: bool,
    /// `--kubeconfig`: the kube agent's `kube_service.kubeconfig_file`.
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-cluster`: the kube agent's `kube_service.kube_cluster_name`.
    pub kube_cluster: Option<String>,
    /// `--diag-addr`: `sallyport.diag_addr`.
    pub diag_addr: Option<SocketAddr>,
}

pub async fn run(
    config_path: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    flags: Flags,
) -> Result<()> {
    let mut cfg = config_of(config_path.as_deref(), data_dir)?;
    for r in &flags.roles {
        if !["auth", "proxy", "node", "kube"].contains(&r.as_str()) {
            bail!("unknown role {r:?} in --roles: use auth, proxy, node and/or kube");
        }
    }
    if !flags.roles.is_empty() {
        cfg.auth_service.enabled = flags.roles.iter().any(|r| r == "auth");
        cfg.proxy_service.enabled = flags.roles.iter().any(|r| r == "proxy");
        cfg.ssh_service.enabled = flags.roles.iter().any(|r| r == "node");
        cfg.kube_service.enabled = flags.roles.iter().any(|r| r == "kube");
    }
    if let Some(l) = &flags.labels {
        let extra =
            sallyport_core::names::parse_labels(l).map_err(|e| anyhow::anyhow!("--labels: {e}"))?;
        if flags.roles.iter().any(|r| r == "kube") {
            cfg.kube_service.labels.extend(extra.clone());
        }
        cfg.ssh_service.labels.extend(extra);
    }
    if let Some(k) = &flags.kubeconfig {
        cfg.kube_service.kubeconfig_file = Some(k.clone());
    }
    if let Some(n) = &flags.kube_cluster {
        cfg.kube_service.kube_cluster_name = Some(n.clone());
    }
    if flags.nodename.is_some() {
        cfg.sallyport.nodename = flags.nodename.clone();
    }
    if flags.diag_addr.is_some() {
        cfg.sallyport.diag_addr = flags.diag_addr;
    }
    init_logging(&cfg);
    // PAM that cannot work here stops the start with the reason, before any service runs.
    if cfg.ssh_service.enabled
        && let Some(service) = cfg.ssh_service.pam.service()
    {
        sallyport_agent::pam::check(service)
            .map_err(|e| anyhow::anyhow!("ssh_service.pam: {e}"))?;
    }
    let dir = cfg.sallyport.data_dir.clone();
    prepare_data_dir(&dir)?;
    // Held until the process exits (the kernel lets go of it on any exit, kill -9 too).
    let _running = lock_data_dir(&dir)?;
    if !cfg.auth_service.enabled && !cfg.proxy_service.enabled {
        if let Some(line) = crate::diag::start(cfg.sallyport.diag_addr, agents(&cfg)).await? {
            println!("{line}");
        }
        match (cfg.ssh_service.enabled, cfg.kube_service.enabled) {
            (true, false) => return run_agent(&cfg, &flags).await,
            (false, true) => return crate::kube_agent::run(&cfg, &flags).await,
            (true, true) => {
                tokio::try_join!(
                    run_agent(&cfg, &flags),
                    crate::kube_agent::run(&cfg, &flags)
                )?;
                return Ok(());
            }
            (false, false) => {}
        }
    }
    let auth_servers = auth_servers(&cfg, &flags);
    let names = service_names(&cfg);
    let mut lines = vec![];
    // Auth: here (all-in-one, or `--roles=auth`), or reached at `--auth-server`.
    let auth = if cfg.auth_service.enabled {
        Some(start_auth(&cfg, &dir, &names, &mut lines).await?)
    } else {
        None
    };
    let proxy = if cfg.proxy_service.enabled {
        let boot = match &auth {
            Some(a) => local_proxy(a, &names)?,
            None => {
                if auth_servers.is_empty() {
                    bail!(
                        "a proxy without auth: give --auth-server HOST:3025 (or sallyport.auth_server in the config)"
                    );
                }
                joined_proxy(&cfg, &flags, &dir, &auth_servers, &names).await?
            }
        };
        Some(start_proxy(&cfg, &dir, &names, boot, auth.as_ref(), &mut lines).await?)
    } else {
        None
    };
    if let (Some(a), Some(p)) = (&auth, &proxy) {
        start_local_agents(&cfg, &a.server, connect_addr(p.web_addr), &mut lines)?;
    }
    let mut serves = crate::diag::Serves::default();
    if let Some(a) = &auth {
        serves = serves.auth(&a.server, &a.chain_pem);
    }
    if let Some(p) = &proxy {
        serves = serves.proxy(&p.client, &p.chain_pem, &p.ssh_cert);
    }
    lines.extend(crate::diag::start(cfg.sallyport.diag_addr, serves).await?);

    let pin = match &auth {
        Some(a) => a
            .server
            .authorities
            .pins()?
            .into_iter()
            .next()
            .unwrap_or_default(),
        None => match ProxyIdentity::load(&dir)? {
            Some(id) => sallyport_core::x509::pem_to_ders(&id.joined.host_ca_pem)
                .ok()
                .and_then(|d| {
                    d.first()
                        .and_then(|c| sallyport_core::x509::spki_pin(c).ok())
                })
                .unwrap_or_default(),
            None => String::new(),
        },
    };
    let cluster = match &auth {
        Some(a) => a.server.config.cluster_name.clone(),
        None => ProxyIdentity::load(&dir)?
            .map(|i| i.joined.cluster_name)
            .unwrap_or_default(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "Sallyport {} started", env!("CARGO_PKG_VERSION"))?;
    writeln!(out, "cluster  {cluster}")?;
    for l in &lines {
        writeln!(out, "{l}")?;
    }
    writeln!(out, "data     {}", dir.display())?;
    writeln!(out, "CA pin   {pin}")?;
    if auth.is_some() {
        writeln!(out, "admin    sallyctl --data-dir {} status", dir.display())?;
    }
    out.flush()?;
    drop(out);

    shutdown_signal().await;
    tracing::info!("shutting down");
    if let Some(a) = &auth {
        // Failures counted in windows still open are audited now, not lost with the process.
        a.server.flush_all_failures().await;
        // Anchor what was written since the last checkpoint rather than leave it to the next start.
        if let Err(e) = a.server.anchor_audit().await {
            tracing::error!(error = %e, "no audit checkpoint signed at shutdown");
        }
    }
    Ok(())
}

/// The auth service running in this process.
struct LocalAuth {
    server: Arc<AuthServer>,
    /// Its API, as served on its port; the proxy in this process calls it directly.
    router: axum::Router,
    addr: SocketAddr,
    /// Its TLS chain (for the certificate's expiry in the metrics).
    chain_pem: String,
}

/// A proxy serving in this process.
struct LocalProxy {
    web_addr: SocketAddr,
    client: sallyport_proxy::AuthClient,
    chain_pem: String,
    ssh_cert: russh::keys::ssh_key::Certificate,
}

/// Where a proxy without auth in its process reaches auth: `--auth-server` (repeated or
/// comma-separated) or `sallyport.auth_server`.
fn auth_servers(cfg: &Config, flags: &Flags) -> Vec<String> {
    let given = if flags.auth_server.is_empty() {
        cfg.sallyport
            .auth_server
            .as_deref()
            .map(|s| vec![s.to_string()])
            .unwrap_or_default()
    } else {
        flags.auth_server.clone()
    };
    given
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The names the services' certificates are for: loopback, the proxy's public names, and the
/// addresses they listen on.
fn service_names(cfg: &Config) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    names.extend(
        cfg.proxy_service
            .public_hosts()
            .into_iter()
            .map(|(host, _)| host),
    );
    let mut addrs = vec![];
    if cfg.auth_service.enabled {
        addrs.push(cfg.auth_service.listen_addr);
    }
    if cfg.proxy_service.enabled {
        let p = &cfg.proxy_service;
        addrs.extend([
            p.web_listen_addr,
            p.ssh_listen_addr,
            p.tunnel_listen_addr,
            p.kube_listen_addr,
        ]);
    }
    for addr in addrs {
        if !addr.ip().is_unspecified() {
            names.push(addr.ip().to_string());
        }
    }
    if let Some(t) = &cfg.proxy_service.tunnel_public_addr {
        names.push(
            t.rsplit_once(':')
                .map_or(t.as_str(), |(h, _)| h)
                .trim_matches(['[', ']'])
                .to_string(),
        );
    }
    names.sort();
    names.dedup();
    names
}

/// Where finished recordings are kept: the data dir's `recordings/` unless `recordings:` says.
fn recording_store(cfg: &Config, dir: &Path) -> Result<sallyport_recordings::RecordingStore> {
    match &cfg.recordings {
        Some(r) => sallyport_recordings::RecordingStore::from_config(&r.store_config()),
        None => sallyport_recordings::RecordingStore::local(&dir.join("recordings")),
    }
    .map_err(anyhow::Error::msg)
}

async fn start_auth(
    cfg: &Config,
    dir: &Path,
    names: &[String],
    lines: &mut Vec<String>,
) -> Result<LocalAuth> {
    let a = &cfg.auth_service;
    let mut auth_cfg = AuthConfig::new(&a.cluster_name, &cfg.storage_url());
    // The proxy in this process (all-in-one) writes recordings here while they run; auth on a
    // host of its own has only the store.
    if cfg.proxy_service.enabled {
        auth_cfg.recordings_dir = Some(dir.join("recordings"));
    }
    auth_cfg.recording_store = Some(recording_store(cfg, dir)?);
    // No node may join under a name clients use for the proxy.
    auth_cfg.public_names.extend(
        cfg.proxy_service
            .public_hosts()
            .into_iter()
            .map(|(host, _)| host),
    );
    auth_cfg.second_factor = a.authentication.second_factor == SecondFactor::Otp;
    auth_cfg.max_login_attempts = a.authentication.max_login_attempts;
    auth_cfg.lockout_window = a.authentication.lockout_window.0;
    auth_cfg.lockout_duration = a.authentication.lockout_duration.0;
    // Outside the database, so that a database writer cannot re-sign a rewritten audit chain.
    auth_cfg.audit_checkpoint_key = Some(dir.join("audit-checkpoint.key"));
    auth_cfg.audit_checkpoint_every = a.audit.checkpoint_every;
    auth_cfg.audit_checkpoint_interval = a.audit.checkpoint_interval.0;
    if a.host_cert_ttl.0 < Duration::from_secs(30) {
        bail!("auth_service.host_cert_ttl: at least 30s");
    }
    auth_cfg.host_cert_ttl = a.host_cert_ttl.0;
    let auth = AuthServer::open(auth_cfg)
        .await
        .context("cannot open the auth service")?;
    // The database holds the CA private keys.
    for f in ["sallyport.db", "sallyport.db-wal", "sallyport.db-shm"] {
        let _ = std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600));
    }

    // Auth's own API: mutual TLS for users and services; a proxy that has not joined yet may
    // connect without a certificate, for the one route that takes a token (`/v1/proxies/join`):
    // every other route refuses a caller without one.
    let mut auth_names = names.to_vec();
    auth_names.push(sallyport_core::api::AUTH_SERVER_NAME.into());
    let auth_id = service_identity(&auth, "auth", "auth", auth_names)?;
    let auth_listener = bind(a.listen_addr, "auth").await?;
    // Port 0 asks the kernel for a free port: from here on only the bound address is used.
    let auth_addr = bound(&auth_listener, "auth")?;
    let user_roots = pem_to_ders(&auth.authorities.tls_pem(CaKind::TlsUser))?;
    let host_roots = pem_to_ders(&auth.authorities.tls_pem(CaKind::TlsHost))?;
    let mut auth_tls = server_config(
        pem_to_ders(&auth_id.chain_pem)?,
        private_key_from_pem(&auth_id.key_pem)?,
        ClientAuth::Optional([user_roots, host_roots].concat()),
    )?;
    // Clients that reach auth through the proxy's passthrough offer only this protocol.
    auth_tls
        .alpn_protocols
        .push(sallyport_core::api::AUTH_ALPN.to_vec());
    let router = sallyport_auth::api::router(auth.clone());
    tokio::spawn(sallyport_core::https::serve(
        auth_listener,
        Arc::new(auth_tls),
        router.clone(),
        None,
        // Auth's clients are the proxies, which speak for everyone: a per-address cap here
        // would let one person's flood through a proxy lock out all.
        sallyport_core::door::Limits {
            per_address: None,
            ..Default::default()
        },
    ));
    write_admin_identity(&auth, dir, auth_addr)?;
    lines.push(format!("auth     {auth_addr}"));
    Ok(LocalAuth {
        server: auth,
        router,
        addr: auth_addr,
        chain_pem: auth_id.chain_pem,
    })
}

/// What a proxy needs from auth to serve: its certificates and the CAs' public keys.
struct ProxyBoot {
    /// Its id: its certificate's CN, its row in the proxy registry.
    id: String,
    cluster: String,
    identity: ServiceIdentity,
    ssh_key: PrivateKey,
    ssh_cert: russh::keys::ssh_key::Certificate,
    user_ca_keys: Vec<russh::keys::ssh_key::PublicKey>,
    host_ca_keys: Vec<russh::keys::ssh_key::PublicKey>,
    /// Auth's addresses, comma-separated.
    auth_addr: String,
    /// A joined proxy renews its certificates while it runs: its data dir, auth's addresses,
    /// its name and the names its certificates are for.
    renews: Option<(PathBuf, Vec<String>, String, Vec<String>)>,
}

/// The all-in-one's proxy: certified by the auth in this process.
fn local_proxy(a: &LocalAuth, names: &[String]) -> Result<ProxyBoot> {
    let auth = &a.server;
    let identity = service_identity(
        auth,
        sallyport_auth::proxies::LOCAL_PROXY_ID,
        sallyport_auth::api::PROXY_ROLE,
        names.to_vec(),
    )?;
    let ssh_key = sallyport_core::sshcert::generate_ed25519()?;
    let mut ssh_names = names.to_vec();
    ssh_names.push(auth.config.cluster_name.clone());
    let ssh_cert = sallyport_core::sshcert::issue_host(
        &auth.authorities.host_signer().key,
        ssh_key.public_key(),
        "proxy",
        &ssh_names,
        Duration::from_secs(365 * 86400),
    )?;
    Ok(ProxyBoot {
        id: sallyport_auth::proxies::LOCAL_PROXY_ID.into(),
        cluster: auth.config.cluster_name.clone(),
        identity,
        ssh_key,
        ssh_cert,
        user_ca_keys: auth.authorities.ssh_public_keys(CaKind::User),
        host_ca_keys: auth.authorities.ssh_public_keys(CaKind::Host),
        auth_addr: connect_addr(a.addr),
        // The all-in-one's own certificates are made at every start.
        renews: None,
    })
}

/// A proxy on its own: joined with a `proxy` token (or as it joined before).
async fn joined_proxy(
    cfg: &Config,
    flags: &Flags,
    dir: &Path,
    auth_servers: &[String],
    names: &[String],
) -> Result<ProxyBoot> {
    let joined = ProxyIdentity::load(dir)?.is_some();
    let (_, token, trust) = join_settings(cfg, flags, joined, "a proxy")?;
    let name = local_nodename(cfg)?;
    let id = crate::proxy_join::identity(dir, auth_servers, token.as_deref(), trust, &name, names)
        .await?;
    let parse_keys = |keys: &[String]| -> Result<Vec<russh::keys::ssh_key::PublicKey>> {
        keys.iter()
            .map(|k| {
                russh::keys::ssh_key::PublicKey::from_openssh(k)
                    .context("a CA key from auth is not an OpenSSH public key")
            })
            .collect()
    };
    Ok(ProxyBoot {
        id: id.joined.proxy_id.clone(),
        cluster: id.joined.cluster_name.clone(),
        identity: ServiceIdentity {
            chain_pem: id.joined.tls_chain_pem.clone(),
            key_pem: id.tls_key_pem.clone(),
            host_ca_pem: id.joined.host_ca_pem.clone(),
            user_ca_pem: id.joined.user_ca_pem.clone(),
        },
        ssh_key: id.ssh_key()?,
        ssh_cert: russh::keys::ssh_key::Certificate::from_openssh(&id.joined.ssh_host_cert)
            .context("the proxy's SSH host certificate from auth")?,
        user_ca_keys: parse_keys(&id.joined.user_ca_keys)?,
        host_ca_keys: parse_keys(&id.joined.host_ca_keys)?,
        auth_addr: auth_servers.join(","),
        renews: Some((
            dir.to_path_buf(),
            auth_servers.to_vec(),
            name.clone(),
            names.to_vec(),
        )),
    })
}

/// Starts the proxy's doors; returns the web door's address.
async fn start_proxy(
    cfg: &Config,
    dir: &Path,
    names: &[String],
    boot: ProxyBoot,
    auth: Option<&LocalAuth>,
    lines: &mut Vec<String>,
) -> Result<LocalProxy> {
    let p = &cfg.proxy_service;
    let proxy_id = boot.identity.clone();
    let cluster = boot.cluster.clone();
    let mut client = sallyport_proxy::AuthClient::new(&boot.auth_addr, &proxy_id)?;
    // Auth in this process: its whole requests (every session's grant, end and audit) skip
    // the loopback HTTPS. Streamed reads, sallyctl's passthrough and the browsers' per-user
    // clients still reach it over TLS. `SALLYPORT_AUTH_OVER_HTTPS=1` keeps them on HTTPS: for
    // measuring the difference, and for a suspicion that the two paths decide differently
    // (they run the same router).
    let over_https = std::env::var_os("SALLYPORT_AUTH_OVER_HTTPS").is_some_and(|v| v == "1");
    if let Some(a) = auth.filter(|_| !over_https) {
        client = client.in_process(a.router.clone(), &proxy_id)?;
    }
    let chain = pem_to_ders(&proxy_id.chain_pem)?;
    let user_roots = pem_to_ders(&proxy_id.user_ca_pem)?;
    let host_roots = pem_to_ders(&proxy_id.host_ca_pem)?;
    // Every door presents the proxy's certificate as it is at each handshake: a renewal
    // (below) takes effect without a restart.
    let live = sallyport_core::tls::LiveCert::new(chain, private_key_from_pem(&proxy_id.key_pem)?)?;
    let web_tls = sallyport_core::tls::server_config_live(live.clone(), ClientAuth::None)?;
    // Browsers' certificates (`https_keypairs`): read now, a mistake stops the start; read
    // again as the files change. The names they are for are origins the web UI accepts.
    let public = if p.https_keypairs.is_empty() {
        None
    } else {
        let files = p
            .https_keypairs
            .iter()
            .map(|k| sallyport_core::webcert::Keypair {
                cert_file: k.cert_file.clone(),
                key_file: k.key_file.clone(),
            })
            .collect();
        let certs =
            sallyport_core::webcert::PublicCerts::load(files, web_tls.alpn_protocols.clone())
                .map_err(|e| anyhow::anyhow!("proxy_service.https_keypairs: {e}"))?;
        tokio::spawn(certs.clone().watch());
        Some(certs)
    };
    let mut web_names = names.to_vec();
    if let Some(c) = &public {
        web_names.extend(c.names().iter().cloned());
        web_names.sort();
        web_names.dedup();
    }
    let web_listener = bind(p.web_listen_addr, "proxy web").await?;
    let ssh_listener = bind(p.ssh_listen_addr, "proxy ssh").await?;
    let tunnel_listener = bind(p.tunnel_listen_addr, "proxy tunnel").await?;
    let kube_listener = bind(p.kube_listen_addr, "proxy kube").await?;
    let web_addr = bound(&web_listener, "proxy web")?;
    let ssh_addr = bound(&ssh_listener, "proxy ssh")?;
    let tunnel_addr = bound(&tunnel_listener, "proxy tunnel")?;
    let kube_addr = bound(&kube_listener, "proxy kube")?;
    // sallyctl reaches auth through the web port: its TLS (ALPN sallyport-auth) is piped to auth
    // unterminated, so the user's client certificate is verified by auth itself.
    let passthrough = sallyport_core::https::Passthrough {
        alpn: sallyport_core::api::AUTH_ALPN.to_vec(),
        targets: boot.auth_addr.split(',').map(str::to_string).collect(),
    };
    let doors = sallyport_proxy::web::Doors {
        ssh_port: ssh_addr.port(),
        tunnel_port: tunnel_addr.port(),
        kube_port: Some(kube_addr.port()),
    };
    // Agents' door: only a node certificate from the host CA opens a tunnel.
    let mut tunnel_tls = sallyport_core::tls::server_config_live(
        live.clone(),
        ClientAuth::Required(host_roots.clone()),
    )?;
    tunnel_tls.alpn_protocols = vec![b"sallyport-tunnel".to_vec()];
    // This proxy in the proxy set: registered and heard from before any agent reports here,
    // so that what auth drops for its restart is only what it held before.
    let addrs = sallyport_core::api::ProxyAddrs {
        web: public_or(cfg, web_addr),
        ssh: public_or(cfg, ssh_addr),
        tunnel: p
            .tunnel_public_addr
            .clone()
            .unwrap_or_else(|| public_or(cfg, tunnel_addr)),
        kube: public_or(cfg, kube_addr),
    };
    let set = sallyport_proxy::registry::ProxySet::default();
    match auth {
        Some(a) => {
            a.server.register_local_proxy(&addrs).await?;
            let interrupted = a
                .server
                .proxy_started(sallyport_auth::proxies::LOCAL_PROXY_ID)
                .await?;
            if interrupted > 0 {
                tracing::warn!(
                    sessions = interrupted,
                    "sessions interrupted by the last stop are marked incomplete"
                );
            }
        }
        None => sallyport_proxy::registry::announce(&client, &boot.id, &addrs, &set).await?,
    }
    let beating = tokio::spawn(sallyport_proxy::registry::heartbeat(
        client.clone(),
        boot.id.clone(),
        addrs,
        set.clone(),
    ));
    // The heartbeat ends only when auth no longer knows this proxy (`sallyctl proxies rm`):
    // everything it would serve is refused by auth from now on, so it stops, saying why,
    // rather than look healthy to a load balancer.
    tokio::spawn(async move {
        if beating.await.is_ok() {
            tracing::error!(
                "this proxy was removed from the cluster (sallyctl proxies rm); stopping: join it again with a token from `sallyctl tokens add --type=proxy`"
            );
            std::process::exit(1);
        }
    });
    let tunnels = sallyport_proxy::tunnels::Tunnels::default()
        .with_proxy_set(set)
        .with_proxy_id(boot.id.clone());
    tokio::spawn(sallyport_proxy::tunnels::serve(
        tunnel_listener,
        Arc::new(tunnel_tls),
        tunnels.clone(),
        client.clone(),
        p.door_limits(),
    ));
    // kubectl's door: kubeconfig certificates from the user CA; a request without one is told
    // what to run. Watches are quiet for long stretches: the idle limit is Kubernetes' own
    // request timeout, not the web door's.
    let kube_tls = sallyport_core::tls::server_config_live(
        live.clone(),
        ClientAuth::Optional(user_roots.clone()),
    )?;
    let kube_limits = sallyport_core::door::Limits {
        open: p
            .web_door_limits()
            .open
            .map(|o| sallyport_core::door::OpenLimits {
                idle_timeout: Duration::from_secs(1800),
                ..o
            }),
        ..p.door_limits()
    };
    // Users' SSH door.
    let state = sallyport_proxy::ssh::SshState::new(
        client.clone(),
        cluster.clone(),
        boot.user_ca_keys,
        boot.host_ca_keys,
        boot.ssh_key,
        boot.ssh_cert.clone(),
        tunnels,
        dir.join("recordings"),
    )
    .with_max_recording_size(p.max_recording_size.0)
    .with_uploads(sallyport_proxy::session::record::Uploads::start(
        recording_store(cfg, dir)?,
        dir.join("recordings"),
    ))
    .with_max_jumps_per_connection(p.max_jumps_per_connection);
    let state = Arc::new(state);
    tokio::spawn(state.clone().watch_locks(Duration::from_secs(2)));
    if let Some((dir, auth_addrs, name, dns)) = boot.renews.clone() {
        let (live, client, state) = (live.clone(), client.clone(), state.clone());
        let host_ca_pem = proxy_id.host_ca_pem.clone();
        let user_ca_pem = proxy_id.user_ca_pem.clone();
        tokio::spawn(crate::proxy_join::keep_renewed(
            dir,
            auth_addrs,
            name,
            dns,
            move |id| {
                let chain = pem_to_ders(&id.joined.tls_chain_pem)?;
                live.replace(chain, private_key_from_pem(&id.tls_key_pem)?)?;
                client.renewed(&ServiceIdentity {
                    chain_pem: id.joined.tls_chain_pem.clone(),
                    key_pem: id.tls_key_pem.clone(),
                    host_ca_pem: host_ca_pem.clone(),
                    user_ca_pem: user_ca_pem.clone(),
                })?;
                let cert =
                    russh::keys::ssh_key::Certificate::from_openssh(&id.joined.ssh_host_cert)?;
                use sallyport_core::metrics::{CertificateKind, metrics};
                metrics().certificate_expires(CertificateKind::ProxyTls, id.joined.not_after);
                metrics().certificate_expires(
                    CertificateKind::ProxySshHost,
                    i64::try_from(cert.valid_before()).unwrap_or(i64::MAX),
                );
                state.set_proxy_cert(cert);
                Ok(())
            },
        ));
    }
    // Browsers: web sessions, their API and terminals, on the same port.
    let browser = sallyport_proxy::web::browser::Browser {
        state: state.proxy.clone(),
        sessions: sallyport_proxy::web::sessions::WebSessions::new(
            state.proxy.clone(),
            p.web_idle_timeout.0,
        ),
        origins: web_origins(&web_names, web_addr.port(), &p.public_hosts()),
    };
    tokio::spawn(sallyport_core::https::serve(
        web_listener,
        sallyport_core::https::Certs::new(Arc::new(web_tls), public),
        sallyport_proxy::web::router(state.proxy.auth.clone(), doors, browser),
        Some(passthrough),
        p.web_door_limits(),
    ));
    tokio::spawn(sallyport_core::https::serve(
        kube_listener,
        Arc::new(kube_tls),
        sallyport_proxy::kube::router(sallyport_proxy::kube::KubeDoor::new(state.proxy.clone())),
        None,
        kube_limits,
    ));
    let admission = sallyport_proxy::ssh::accept::Admission {
        limits: p.door_limits(),
        login_grace: p.ssh_login_grace.0,
    };
    tokio::spawn(sallyport_proxy::ssh::accept::serve(
        ssh_listener,
        state,
        admission,
    ));
    lines.push(format!("web      https://{web_addr}"));
    lines.push(format!("ssh      {ssh_addr}"));
    lines.push(format!("tunnel   {tunnel_addr}"));
    lines.push(format!("kube     https://{kube_addr}"));

    Ok(LocalProxy {
        web_addr,
        client,
        chain_pem: proxy_id.chain_pem,
        ssh_cert: boot.ssh_cert,
    })
}

/// The all-in-one's own node and kube agents, joined with tokens minted in-process.
fn start_local_agents(
    cfg: &Config,
    auth: &Arc<AuthServer>,
    web: String,
    lines: &mut Vec<String>,
) -> Result<()> {
    let cluster = auth.config.cluster_name.clone();
    if cfg.ssh_service.enabled {
        // The local node: an agent like any other, joined with a token minted in-process.
        let agent_cfg = cfg.clone();
        let web = web.clone();
        let host_ca = auth.authorities.tls_pem(CaKind::TlsHost);
        let auth2 = auth.clone();
        let nodename = local_nodename(cfg)?;
        // The local agent joins in the background, where a name auth refuses would only be a
        // log line: refuse it here, before the cluster claims to serve it.
        sallyport_core::names::validate_node(&nodename, &cluster, &auth.config.public_names)
            .map_err(|e| anyhow::anyhow!("{e}; pick one with --nodename"))?;
        lines.push(format!("node     {nodename} (local agent)"));
        tokio::spawn(async move {
            let token = match sallyport_agent::AgentIdentity::load(&agent_cfg.sallyport.data_dir) {
                Ok(Some(_)) => None,
                _ => auth2
                    .add_join_token(
                        &sallyport_core::api::AddJoinToken {
                            kind: sallyport_core::api::TokenKind::Node,
                            ttl_secs: 600,
                        },
                        "@local",
                    )
                    .await
                    .ok()
                    .map(|t| t.token),
            };
            let trust = match sallyport_core::x509::pem_to_ders(&host_ca) {
                Ok(cas) => sallyport_core::tls::Trust::Roots(cas),
                Err(_) => return,
            };
            if let Err(e) = agent_main(&agent_cfg, Some(web), token, trust, nodename, true).await {
                tracing::error!(error = %e, "the local agent stopped");
            }
        });
    }
    if cfg.kube_service.enabled {
        // The local kube agent: joined like the local node, with a kube token.
        lines.push(crate::kube_agent::start_local(cfg, auth, web)?);
    }
    Ok(())
}

/// The address other hosts reach a door at: the first `public_addr` name with the door's
/// port, else the address it listens on (loopback for 0.0.0.0).
fn public_or(cfg: &Config, addr: SocketAddr) -> String {
    match cfg.proxy_service.public_hosts().into_iter().next() {
        Some((host, _)) if host.contains(':') => format!("[{host}]:{}", addr.port()),
        Some((host, _)) => format!("{host}:{}", addr.port()),
        None => connect_addr(addr),
    }
}

/// The configuration a command runs with: the file (all-in-one without one), `--data-dir`
/// over its data dir.
pub(crate) fn config_of(path: Option<&Path>, data_dir: Option<PathBuf>) -> Result<Config> {
    let mut cfg = match path {
        Some(p) => Config::load(p).map_err(anyhow::Error::msg)?,
        None => Config::all_in_one(default_data_dir()),
    };
    if let Some(d) = data_dir {
        cfg.sallyport.data_dir = d;
    }
    Ok(cfg)
}

fn default_data_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".local/share/sallyport"))
        .unwrap_or_else(|| PathBuf::from("/var/lib/sallyport"))
}

fn init_logging(cfg: &Config) {
    let level = match cfg.sallyport.log.severity {
        Severity::Debug => "debug",
        Severity::Info => "info",
        Severity::Warn => "warn",
        Severity::Error => "error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SALLYPORT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},sqlx=warn")));
    // Colour is for a person at a terminal: a log file or a pipe gets plain text, and NO_COLOR
    // (set and not empty, https://no-color.org) turns it off on a terminal too.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match cfg.sallyport.log.format {
        LogFormat::Json => b.json().try_init(),
        LogFormat::Text => b.try_init(),
    };
}

/// Creates the data dir (0700) and proves it is writable before anything else starts.
fn prepare_data_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("data dir {} cannot be created", dir.display()))?;
    let probe = dir.join(".write-test");
    std::fs::write(&probe, b"ok").with_context(|| {
        format!(
            "data dir {} is not writable; pick another with --data-dir",
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(probe);
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    Ok(())
}

/// The data dir's `sallyport.lock`, held exclusively by the one process that uses the data dir
/// (`start`, `storage migrate`): two daemons would share its database and identities, and a
/// migration would miss what a running daemon writes after it began.
pub(crate) fn lock_data_dir(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join("sallyport.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "another sallyport is running on data dir {} (it holds {}); stop it first",
            dir.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for {what}; is another sallyport running?")
    })
}

/// The address a listener got: the configured one, with the kernel's port where it said 0.
fn bound(listener: &TcpListener, what: &str) -> Result<SocketAddr> {
    listener
        .local_addr()
        .with_context(|| format!("cannot read the address {what} listens on"))
}

/// The proxy's own origins, which a browser's requests and WebSocket upgrades must come
/// from exactly (browsers send them lowercase): `https://NAME:PORT` for each name of the
/// proxy's certificates on the port it listens on, and for each `public_addr` with its own port
/// (the one a load balancer takes); without the port when it is 443.
fn web_origins(names: &[String], port: u16, public: &[(String, Option<u16>)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |name: &str, port: u16| {
        let name = name.to_ascii_lowercase();
        let host = if name.contains(':') {
            format!("[{name}]")
        } else {
            name
        };
        out.push(format!("https://{host}:{port}"));
        if port == 443 {
            out.push(format!("https://{host}"));
        }
    };
    for n in names {
        add(n, port);
    }
    for (n, p) in public {
        if let Some(p) = p {
            add(n, *p);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Where to dial a listener that may be bound to 0.0.0.0.
fn connect_addr(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("127.0.0.1:{}", addr.port())
    } else {
        addr.to_string()
    }
}

/// A fresh key for a service of this process, certified by the host TLS CA.
fn service_identity(
    auth: &AuthServer,
    name: &str,
    role: &str,
    dns: Vec<String>,
) -> Result<ServiceIdentity> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = auth.issue_service_cert(
        &key.subject_public_key_info(),
        name,
        role,
        dns,
        Duration::from_secs(365 * 86400),
        false,
    )?;
    let host_ca_pem = auth.authorities.tls_pem(CaKind::TlsHost);
    Ok(ServiceIdentity {
        chain_pem: format!("{cert}{}", auth.authorities.tls_host_signer().cert_pem),
        key_pem: key.serialize_pem(),
        host_ca_pem,
        user_ca_pem: auth.authorities.tls_pem(CaKind::TlsUser),
    })
}

/// Writes the local admin identity (mode 0600 from creation) that `sallyctl --data-dir` uses.
fn write_admin_identity(auth: &AuthServer, dir: &Path, auth_addr: SocketAddr) -> Result<()> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = auth.issue_service_cert(
        &key.subject_public_key_info(),
        sallyport_auth::api::ADMIN,
        "editor",
        vec![],
        Duration::from_secs(365 * 86400),
        true,
    )?;
    let doc = serde_json::json!({
        "auth_addr": connect_addr(auth_addr),
        "cluster_name": auth.config.cluster_name,
        "cert_pem": cert,
        "key_pem": key.serialize_pem(),
        "host_ca_pem": auth.authorities.tls_pem(CaKind::TlsHost),
    });
    write_secret(&dir.join(ADMIN_IDENTITY), doc.to_string().as_bytes())
}

/// Writes a file that only its owner may read, replacing any earlier one atomically.
pub fn write_secret(path: &Path, data: &[u8]) -> Result<()> {
    sallyport_core::files::replace_private(path, data)
        .with_context(|| format!("cannot write {}", path.display()))
}

pub(crate) async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

pub(crate) fn local_nodename(cfg: &Config) -> Result<String> {
    let name = match &cfg.sallyport.nodename {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into()),
    };
    sallyport_core::names::validate("node", &name)
        .map_err(|e| anyhow::anyhow!("{e}; pick one with --nodename"))?;
    Ok(name)
}

/// What the diagnostics listener checks for a process of agents only: each one's tunnel.
fn agents(cfg: &Config) -> crate::diag::Serves {
    use sallyport_core::metrics::TunnelKind;
    let mut serves = crate::diag::Serves::default();
    if cfg.ssh_service.enabled {
        serves = serves.agent(TunnelKind::Node);
    }
    if cfg.kube_service.enabled {
        serves = serves.agent(TunnelKind::Kube);
    }
    serves
}

/// `sallyport start --roles=node`: join once, then keep the tunnel to the proxy.
async fn run_agent(cfg: &Config, flags: &Flags) -> Result<()> {
    let nodename = local_nodename(cfg)?;
    let joined = sallyport_agent::AgentIdentity::load(&cfg.sallyport.data_dir)?.is_some();
    let (proxy, token, trust) = join_settings(cfg, flags, joined, "an agent")?;
    agent_main(cfg, proxy, token, trust, nodename, false).await
}

/// What an agent (`what`) joins with: the proxy, the token and how to trust the proxy, from
/// the flags or the config. An agent that `joined` already trusts the CA in its identity.
pub fn join_settings(
    cfg: &Config,
    flags: &Flags,
    joined: bool,
    what: &str,
) -> Result<(Option<String>, Option<String>, sallyport_core::tls::Trust)> {
    let proxy = flags
        .proxy
        .clone()
        .or_else(|| cfg.sallyport.proxy_server.clone());
    let token = flags
        .token
        .clone()
        .or_else(|| cfg.sallyport.auth_token.clone());
    let pin = flags
        .ca_pin
        .clone()
        .or_else(|| cfg.sallyport.ca_pin.clone());
    let trust = match (flags.insecure, pin) {
        (true, _) => {
            eprintln!("WARNING: --insecure: the proxy's identity is not checked at join");
            sallyport_core::tls::Trust::Insecure
        }
        (false, Some(p)) => sallyport_core::tls::Trust::Pin(p.to_ascii_lowercase()),
        (false, None) if !joined => bail!(
            "first start of {what}: give --ca-pin sha256:... (from `sallyctl status`) to verify the proxy, or --insecure"
        ),
        // Joined already: the identity carries the CA; the join trust is not used.
        (false, None) => sallyport_core::tls::Trust::Insecure,
    };
    Ok((proxy, token, trust))
}

async fn agent_main(
    cfg: &Config,
    proxy: Option<String>,
    token: Option<String>,
    trust: sallyport_core::tls::Trust,
    nodename: String,
    quiet: bool,
) -> Result<()> {
    let dir = &cfg.sallyport.data_dir;
    // PAM that cannot work here stops the agent at once, with the reason, rather than every
    // session later.
    let pam = match cfg.ssh_service.pam.service() {
        Some(service) => Some(
            sallyport_agent::session_exec::PamExec::new(service)
                .map_err(|e| anyhow::anyhow!("ssh_service.pam: {e}"))?,
        ),
        None => None,
    };
    sallyport_agent::host_user::keep_state_in(dir).map_err(|e| anyhow::anyhow!(e))?;
    let identity = match sallyport_agent::AgentIdentity::load(dir)? {
        Some(id) => id,
        None => {
            let proxy = proxy.ok_or_else(|| {
                anyhow::anyhow!("first start of an agent: give --proxy HOST:3080 and --token")
            })?;
            let token = token.ok_or_else(|| {
                anyhow::anyhow!(
                    "first start of an agent: give --token (from `sallyctl tokens add --type=node`)"
                )
            })?;
            let params = sallyport_agent::join::JoinParams {
                proxy,
                token,
                kind: sallyport_core::api::TokenKind::Node,
                nodename: nodename.clone(),
                labels: cfg.ssh_service.labels.clone(),
                trust,
            };
            let id = sallyport_agent::join::join(&params).await?;
            id.save(dir)?;
            id
        }
    };
    if !quiet {
        println!(
            "node {} ({}) joined cluster {}; tunnel to {}",
            identity.nodename, identity.node_id, identity.cluster_name, identity.tunnel_addr
        );
    }
    let labels: sallyport_agent::tunnel::Labels =
        Arc::new(std::sync::Mutex::new(cfg.ssh_service.labels.clone()));
    for c in &cfg.ssh_service.commands {
        sallyport_agent::tunnel::spawn_label_command(
            labels.clone(),
            c.name.clone(),
            c.command.clone(),
            c.period.0,
        );
    }
    let server = Arc::new(sallyport_agent::ssh::NodeServer::new(&identity)?.with_pam(pam));
    let identity = Arc::new(identity);
    let dir = dir.clone();
    let keep: sallyport_agent::tunnel::Keep = Arc::new(move |id| id.save(&dir));
    tokio::select! {
        _ = sallyport_agent::tunnel::run(identity, labels, server, keep) => Ok(()),
        _ = shutdown_signal() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_lowercase_with_the_listening_port_and_each_public_port() {
        let o = web_origins(
            &["Localhost".into(), "::1".into(), "proxy.example.com".into()],
            3080,
            &[
                ("proxy.example.com".into(), None),
                ("lb.example.com".into(), Some(443)),
            ],
        );
        assert_eq!(
            o,
            vec![
                "https://[::1]:3080",
                "https://lb.example.com",
                "https://lb.example.com:443",
                "https://localhost:3080",
                "https://proxy.example.com:3080",
            ]
        );
    }
}
