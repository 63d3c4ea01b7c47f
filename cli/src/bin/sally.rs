//! `sally`: the user's client. Sign up, log in once, and hold short-lived certificates.

use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_cli::http::Api;
// Output that ends quietly on a closed pipe (`sally recordings ls | head`), not std's panic;
// `print!` too, for the next call that needs it.
#[allow(unused_imports)]
use sallyport_cli::{print, println};
use sallyport_cli::profile::{self, Profile};
use sallyport_cli::prompt::Input;
use sallyport_core::api::*;
#[allow(unused_imports)]
use sallyport_core::api::{NodeInfo, SessionInfo};
use sallyport_core::tls::Trust;

#[derive(Parser)]
#[command(
    name = "sally",
    version,
    about = "Sallyport client: log in once, reach every server you are allowed to"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

#[derive(clap::Args)]
struct Trusting {
    /// Pin of the cluster's CA (`sha256:<hex>`, printed by `sallyport start`).
    #[arg(long)]
    ca_pin: Option<String>,
    /// Do not verify the proxy's certificate (only for testing).
    #[arg(long, conflicts_with = "ca_pin")]
    insecure: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Set your password and enroll your authenticator with a sign-up token.
    Signup {
        #[arg(long)]
        proxy: String,
        #[arg(long)]
        token: String,
        #[command(flatten)]
        trust: Trusting,
    },
    /// Log in and receive short-lived SSH and X.509 certificates.
    Login {
        #[arg(long)]
        proxy: String,
        /// A local user (password and one-time code).
        #[arg(long, conflicts_with = "auth")]
        user: Option<String>,
        /// Sign in with this SSO connector instead (a browser opens at your identity provider).
        #[arg(long)]
        auth: Option<String>,
        /// `none`: print the sign-in URL instead of opening a browser.
        #[arg(long, value_parser = ["default", "none"], default_value = "default")]
        browser: String,
        /// Certificate lifetime, e.g. 8h (capped by your roles' max_session_ttl).
        #[arg(long)]
        ttl: Option<String>,
        #[command(flatten)]
        trust: Trusting,
    },
    /// Show who you are logged in as and until when.
    Status {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Remove your keys and certificates.
    Logout,
    /// List the nodes your roles reach (filter with k=v labels).
    Ls {
        labels: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Open a shell or run a command on a node (a name, an id, or a label selector k=v[,k2=v2]).
    Ssh {
        /// Force a terminal.
        #[arg(short = 't', conflicts_with = "no_tty")]
        tty: bool,
        /// Never allocate a terminal.
        #[arg(short = 'T')]
        no_tty: bool,
        #[arg(short = 'l')]
        login: Option<String>,
        /// Forward a local port: [bind_address:]port:host:hostport.
        #[arg(short = 'L', value_name = "SPEC")]
        local: Vec<sallyport_cli::forward::Spec>,
        /// Forward a port on the node back here: [bind_address:]port:host:hostport.
        #[arg(short = 'R', value_name = "SPEC")]
        remote: Vec<sallyport_cli::forward::Spec>,
        /// A local SOCKS proxy whose connections leave from the node: [bind_address:]port.
        #[arg(short = 'D', value_name = "SPEC")]
        dynamic: Vec<sallyport_cli::forward::DynamicSpec>,
        /// Forward your SSH agent ($SSH_AUTH_SOCK) to the node.
        #[arg(short = 'A')]
        forward_agent: bool,
        /// Run no command: only forward.
        #[arg(short = 'N')]
        no_command: bool,
        /// [LOGIN@]TARGET
        target: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Copy files to and from nodes (remote side LOGIN@NODE:PATH), with OpenSSH's scp through
    /// the proxy: a progress bar on a terminal, quiet otherwise.
    Scp {
        /// Copy directories recursively.
        #[arg(short = 'r')]
        recursive: bool,
        /// Port on the node (agentless nodes).
        #[arg(short = 'P')]
        port: Option<u16>,
        /// Quiet: no progress bar.
        #[arg(short = 'q')]
        quiet: bool,
        /// SRC... DST
        #[arg(required = true, num_args = 2..)]
        paths: Vec<String>,
    },
    /// Print an ssh_config block that sends plain ssh, scp, sftp and rsync through the proxy.
    Config,
    /// Plumbing for OpenSSH: `sally proxy ssh %r@%h:%p` as a ProxyCommand.
    Proxy {
        #[command(subcommand)]
        command: ProxyCommand,
    },
    /// Recorded sessions.
    Recordings {
        #[command(subcommand)]
        command: RecordingsCommand,
    },
    /// Replay a recorded session.
    Play {
        session_id: String,
        /// Playback speed multiplier.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// asciicast: the raw recording; text: the output without timing. Default: replay.
        #[arg(long, value_parser = ["asciicast", "text"])]
        format: Option<String>,
    },
}

#[derive(Subcommand)]
enum ProxyCommand {
    /// Pipe stdin/stdout to [USER@]HOST:PORT through the proxy.
    Ssh { target: String },
}

#[derive(Subcommand)]
enum RecordingsCommand {
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

fn main() -> ExitCode {
    sallyport_core::install_crypto_provider();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(sallyport_cli::EXIT_FAILURE);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if sallyport_cli::output::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(sallyport_cli::EXIT_FAILURE)
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Signup {
            proxy,
            token,
            trust,
        } => signup(&proxy, &token, &trust).await,
        Command::Login {
            proxy,
            user,
            auth,
            browser,
            ttl,
            trust,
        } => {
            login(
                &proxy,
                user,
                auth,
                browser == "none",
                ttl.as_deref(),
                &trust,
            )
            .await
        }
        Command::Status { format } => status(format),
        Command::Ls { labels, format } => ls(&labels, format).await,
        Command::Ssh {
            tty,
            no_tty,
            login,
            local,
            remote,
            dynamic,
            forward_agent,
            no_command,
            target,
            command,
        } => {
            let fwd = Forwards {
                local,
                remote,
                dynamic,
                agent: forward_agent,
                no_command,
            };
            let code = ssh(tty, no_tty, login, &target, command, fwd).await?;
            std::process::exit(code);
        }
        Command::Scp {
            recursive,
            port,
            quiet,
            paths,
        } => {
            let code = scp(recursive, port, quiet, &paths).await?;
            std::process::exit(code);
        }
        Command::Config => config(),
        Command::Proxy {
            command: ProxyCommand::Ssh { target },
        } => proxy_ssh(&target).await,
        Command::Recordings {
            command: RecordingsCommand::Ls { format },
        } => recordings(format).await,
        Command::Play {
            session_id,
            speed,
            format,
        } => play(&session_id, speed, format.as_deref()).await,
        Command::Logout => {
            if profile::remove_all()? {
                println!(
                    "Logged out: keys and certificates removed from {}",
                    profile::home().display()
                );
            } else {
                println!("Not logged in.");
            }
            Ok(())
        }
    }
}

/// How to trust the proxy: the pin or `--insecure` given now, else the CA saved at a login.
fn trust_for(proxy: &str, t: &Trusting) -> Result<Trust> {
    if t.insecure {
        eprintln!("WARNING: --insecure: the proxy's identity is not checked");
        return Ok(Trust::Insecure);
    }
    if let Some(pin) = &t.ca_pin {
        let hex = pin.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("--ca-pin must look like sha256:<64 hex digits>, as `sallyport start` prints it");
        }
        return Ok(Trust::Pin(pin.to_ascii_lowercase()));
    }
    if let Some(p) = Profile::load()?.filter(|p| p.proxy == proxy) {
        let cas = sallyport_core::x509::pem_to_ders(&p.tls_host_ca_pem)?;
        return Ok(Trust::Roots(cas));
    }
    // A sign-up checked this proxy against a pin: the login it printed trusts the same.
    if let Some(pin) = sallyport_cli::profile::saved_pin(proxy)?.filter(|p| {
        p.strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    }) {
        return Ok(Trust::Pin(pin));
    }
    bail!(
        "first contact with {proxy}: pass --ca-pin sha256:... (printed by `sallyport start` and `sallyctl status`), or --insecure for a test cluster"
    )
}

async fn signup(proxy: &str, token: &str, t: &Trusting) -> Result<()> {
    let trust = trust_for(proxy, t)?;
    let pinned = match &trust {
        Trust::Pin(pin) => Some(pin.clone()),
        _ => None,
    };
    let api = Api::new(proxy, "the proxy", trust, None, None)?;
    let ping: Ping = api.get("/v1/webapi/ping").await?;
    let mut input = Input::new();
    // Check the token before asking for anything.
    let started: SignupStarted = api
        .post(
            "/v1/webapi/signup/start",
            &SignupStart {
                token: token.into(),
            },
        )
        .await?;
    let password = if input.is_tty() {
        eprintln!(
            "Signing up {} on cluster {}",
            started.user, ping.cluster_name
        );
        let p = input.secret("New password: ", "password")?;
        let again = input.secret("Repeat password: ", "password")?;
        if p != again {
            bail!("the passwords differ; nothing was changed");
        }
        p
    } else {
        input.secret("", "password")?
    };
    let mut otp_code = None;
    if let Some(uri) = &started.otpauth_uri {
        if input.is_tty() {
            eprintln!("\nScan this code with your authenticator app (or enter the URI below):\n");
            if let Ok(qr) = qrcode::QrCode::new(uri.as_bytes()) {
                eprintln!(
                    "{}",
                    qr.render::<qrcode::render::unicode::Dense1x2>()
                        .quiet_zone(true)
                        .build()
                );
            }
        }
        println!("{uri}");
        otp_code = Some(input.line("Code from your authenticator: ", "one-time code")?);
    }
    let _: serde_json::Value = api
        .post(
            "/v1/webapi/signup/finish",
            &SignupFinish {
                token: token.into(),
                password,
                otp_code,
            },
        )
        .await?;
    // The pin verified this proxy for the sign-up; the login below trusts it the same way.
    if let Some(pin) = pinned {
        sallyport_cli::profile::save_pin(proxy, &pin)?;
    }
    eprintln!(
        "Signed up as {}. Log in with:\n  sally login --proxy {proxy} --user {}",
        started.user, started.user
    );
    Ok(())
}

async fn login(
    proxy: &str,
    user: Option<String>,
    auth: Option<String>,
    no_browser: bool,
    ttl: Option<&str>,
    t: &Trusting,
) -> Result<()> {
    let ttl_secs = ttl
        .map(|s| sallyport_core::duration::parse(s).map(|d| d.as_secs()))
        .transpose()
        .map_err(|e| anyhow!("--ttl: {e}"))?;
    let api = Api::new(proxy, "the proxy", trust_for(proxy, t)?, None, None)?;
    let ping: Ping = api.get("/v1/webapi/ping").await?;
    let user = match (user, auth) {
        (Some(u), _) => u,
        (None, Some(connector)) => {
            return sso_login(&api, proxy, &connector, no_browser, ttl_secs).await;
        }
        (None, None) => match ping.auth_connectors.as_slice() {
            [only] if !ping.local_users => {
                return sso_login(&api, proxy, only, no_browser, ttl_secs).await;
            }
            [] => bail!("give --user NAME"),
            names => bail!(
                "give --user NAME for a local login, or --auth with one of: {}",
                names.join(", ")
            ),
        },
    };
    let user = user.as_str();
    let mut input = Input::new();
    let password = input.secret(&format!("Password for {user}: "), "password")?;
    let otp_code = if ping.second_factor == "otp" {
        Some(input.line("One-time code: ", "one-time code")?)
    } else {
        None
    };
    // The private key is made here and never leaves this machine.
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)
        .context("cannot generate a key")?;
    let public = key.public_key().to_openssh()?;
    let certs: Certs = api
        .post(
            "/v1/webapi/login",
            &LoginRequest {
                user: user.into(),
                password,
                otp_code,
                ssh_public_key: public.clone(),
                ttl_secs,
                remote_addr: None,
            },
        )
        .await?;
    finish_login(proxy, &key, &public, &certs)
}

/// `sally login --auth=NAME`: the authorization-code flow through the proxy, finished by the
/// browser at this machine's loopback listener.
async fn sso_login(
    api: &Api,
    proxy: &str,
    connector: &str,
    no_browser: bool,
    ttl_secs: Option<u64>,
) -> Result<()> {
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)
        .context("cannot generate a key")?;
    let public = key.public_key().to_openssh()?;
    let listener = sallyport_cli::sso::Listener::bind().await?;
    let client_key = sallyport_core::random_hex(32);
    let started: serde_json::Value = api
        .post(
            "/v1/webapi/oidc/login/start",
            &serde_json::json!({
                "connector": connector,
                "client_redirect_url": listener.redirect_url,
                "ssh_public_key": public,
                "ttl_secs": ttl_secs,
                "client_key": client_key,
            }),
        )
        .await?;
    let url = started["auth_url"]
        .as_str()
        .ok_or_else(|| anyhow!("the proxy gave no sign-in URL"))?;
    if no_browser || sallyport_cli::sso::open_browser(url).is_err() {
        eprintln!("Open this URL in a browser to sign in:\n");
    } else {
        eprintln!("A browser opened to sign in; if it did not, open this URL:\n");
    }
    // On stdout alone, so scripts (and tests) can read it.
    println!("{url}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let outcome = listener
        .wait(std::time::Duration::from_secs(login_timeout()))
        .await?;
    let response = match outcome {
        sallyport_cli::sso::Outcome::Response(r) => r,
        sallyport_cli::sso::Outcome::Error(e) => bail!("sign-in failed: {e}"),
    };
    let certs: Certs = api
        .post(
            "/v1/webapi/oidc/login/finish",
            &serde_json::json!({"response": response, "client_key": client_key}),
        )
        .await?;
    finish_login(proxy, &key, &public, &certs)
}

/// Saves what a login (local or SSO) brought: keys, certificates and the profile.
fn finish_login(proxy: &str, key: &PrivateKey, public: &str, certs: &Certs) -> Result<()> {
    let profile = Profile {
        proxy: proxy.into(),
        user: certs.user.clone(),
        cluster: certs.cluster_name.clone(),
        roles: certs.roles.clone(),
        logins: certs.logins.clone(),
        valid_until: certs.valid_until.clone(),
        tls_host_ca_pem: certs.tls_host_ca_pem.clone(),
    };
    save_keys(&profile, key, public, certs)?;
    profile.save()?;
    print_status(&profile);
    Ok(())
}

fn save_keys(p: &Profile, key: &PrivateKey, public: &str, certs: &Certs) -> Result<()> {
    let paths = p.paths();
    let _ = profile::remove_all();
    profile::ensure_private_dir(&profile::home())?;
    profile::ensure_private_dir(&profile::home().join("keys"))?;
    profile::ensure_private_dir(&paths.dir)?;
    let seed = key
        .key_data()
        .ed25519()
        .map(|k| k.private.to_bytes())
        .ok_or_else(|| anyhow!("generated key is not Ed25519"))?;
    let pkcs8 = sallyport_core::x509::ed25519_pkcs8(&seed);
    profile::write_file(
        &paths.key,
        key.to_openssh(LineEnding::LF)?.as_bytes(),
        0o600,
    )?;
    profile::write_file(&paths.public, format!("{public}\n").as_bytes(), 0o644)?;
    profile::write_file(
        &paths.ssh_cert,
        format!("{}\n", certs.ssh_cert.trim_end()).as_bytes(),
        0o644,
    )?;
    profile::write_file(
        &paths.tls_key,
        sallyport_core::x509::to_pem("PRIVATE KEY", &pkcs8).as_bytes(),
        0o600,
    )?;
    profile::write_file(&paths.tls_cert, certs.tls_cert_pem.as_bytes(), 0o644)?;
    let known: String = certs.known_hosts.iter().map(|l| format!("{l}\n")).collect();
    profile::write_file(
        &profile::home().join("known_hosts"),
        known.as_bytes(),
        0o644,
    )?;
    Ok(())
}

fn print_status(p: &Profile) {
    let paths = p.paths();
    let left = p
        .expires()
        .map(|e| e - sallyport_core::unix_now())
        .unwrap_or(0);
    let validity = if left > 0 {
        format!(
            "valid until {} ({} left)",
            p.valid_until,
            sallyport_core::duration::format(std::time::Duration::from_secs(left as u64))
        )
    } else {
        format!("EXPIRED at {}; run `sally login`", p.valid_until)
    };
    println!("> Profile: {}", p.proxy);
    println!("  Logged in as: {}", p.user);
    println!("  Cluster:      {}", p.cluster);
    println!("  Roles:        {}", p.roles.join(", "));
    println!(
        "  Logins:       {}",
        if p.logins.is_empty() {
            "(none)".into()
        } else {
            p.logins.join(", ")
        }
    );
    println!("  Valid:        {validity}");
    println!("  Key:          {}", paths.key.display());
    println!("  SSH cert:     {}", paths.ssh_cert.display());
    println!("  X.509 cert:   {}", paths.tls_cert.display());
}

fn status(format: Format) -> Result<()> {
    let p = Profile::require()?;
    if format == Format::Json {
        let paths = p.paths();
        let v = serde_json::json!({
            "user": p.user,
            "roles": p.roles,
            "logins": p.logins,
            "valid_until": p.valid_until,
            "proxy": p.proxy,
            "cluster": p.cluster,
            "key_path": paths.key,
            "ssh_cert_path": paths.ssh_cert,
            "tls_cert_path": paths.tls_cert,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_status(&p);
    }
    Ok(())
}

fn parse_selector(items: &[String]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in items.iter().flat_map(|i| i.split(',')) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("{item:?} is not a label selector k=v"))?;
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

async fn nodes(p: &Profile) -> Result<Vec<NodeInfo>> {
    sallyport_cli::http::user_api(p)?.get("/v1/nodes").await
}

fn matches(n: &NodeInfo, sel: &[(String, String)]) -> bool {
    sel.iter().all(|(k, v)| match k.as_str() {
        "hostname" => &n.hostname == v,
        "id" => &n.id == v,
        _ => n.labels.get(k) == Some(v),
    })
}

async fn ls(labels: &[String], format: Format) -> Result<()> {
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
        println!("{:<24} {:<36} {:<8} LABELS", "NODE", "ID", "STATUS");
        for n in &list {
            let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!(
                "{:<24} {:<36} {:<8} {}",
                n.hostname,
                n.id,
                if n.online { "online" } else { "offline" },
                labels.join(",")
            );
        }
    }
    Ok(())
}

async fn ssh_port(p: &Profile) -> Result<u16> {
    let ping: serde_json::Value = sallyport_cli::http::proxy_api(p)?
        .get("/v1/webapi/ping")
        .await?;
    ping["ssh_port"]
        .as_u64()
        .and_then(|v| u16::try_from(v).ok())
        .ok_or_else(|| anyhow!("the proxy serves no SSH port"))
}

fn default_login(p: &Profile) -> Result<String> {
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
struct Forwards {
    local: Vec<sallyport_cli::forward::Spec>,
    remote: Vec<sallyport_cli::forward::Spec>,
    dynamic: Vec<sallyport_cli::forward::DynamicSpec>,
    agent: bool,
    no_command: bool,
}

impl Forwards {
    fn any(&self) -> bool {
        !self.local.is_empty() || !self.remote.is_empty() || !self.dynamic.is_empty() || self.agent
    }
}

async fn ssh(
    tty: bool,
    no_tty: bool,
    login: Option<String>,
    target: &str,
    command: Vec<String>,
    fwd: Forwards,
) -> Result<i32> {
    use std::io::IsTerminal;
    let p = Profile::require()?;
    let keys = sallyport_cli::ssh::Keys::load(&p)?;
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
    let proxy = sallyport_cli::ssh::connect_proxy(&p, &keys, port).await?;
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
                    let (h, f) = sallyport_cli::ssh::connect_node(
                        proxy,
                        keys,
                        &n.hostname,
                        login,
                        Default::default(),
                    )
                    .await?;
                    sallyport_cli::ssh::run_session(
                        &h,
                        &f,
                        Some(command),
                        false,
                        false,
                        sallyport_cli::ssh::Output::Prefixed(n.hostname.clone()),
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
    let mut incoming = sallyport_cli::forward::Incoming::default();
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
    let (h, f) =
        sallyport_cli::ssh::connect_node(&proxy, &keys, &target, &login, incoming.clone()).await?;
    let h = std::sync::Arc::new(h);
    for spec in fwd.local {
        sallyport_cli::forward::local(h.clone(), f.clone(), spec).await?;
    }
    for spec in fwd.dynamic {
        sallyport_cli::forward::dynamic(h.clone(), f.clone(), spec).await?;
    }
    for spec in fwd.remote {
        sallyport_cli::forward::remote(&h, &incoming, spec).await?;
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
    match sallyport_cli::ssh::run_session(
        &h,
        &f,
        command,
        tty,
        true,
        sallyport_cli::ssh::Output::Direct,
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

async fn proxy_ssh(target: &str) -> Result<()> {
    let p = Profile::require()?;
    let keys = sallyport_cli::ssh::Keys::load(&p)?;
    let host_port = target.rsplit_once('@').map_or(target, |(_, h)| h);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, port)) => (h.to_string(), port.parse::<u32>().unwrap_or(22)),
        None => (host_port.to_string(), 22),
    };
    let port_num = ssh_port(&p).await?;
    let proxy = sallyport_cli::ssh::connect_proxy(&p, &keys, port_num).await?;
    sallyport_cli::ssh::pipe(&proxy, &host, port).await
}

/// Ciphers for OpenSSH through the proxy. With ProxyJump the client encrypts every byte twice
/// (the outer connection and the inner one), so the hardware-accelerated AES-GCM comes before
/// OpenSSH's default, chacha20-poly1305 (which is still offered).
const CIPHERS: &str =
    "aes256-gcm@openssh.com,aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-ctr";

/// `sally scp`: OpenSSH's scp with ProxyJump through the proxy's SSH port, this profile's
/// certificate and the cluster's host CA, whatever ~/.ssh/config says. A generated ssh_config
/// (0600, removed afterwards) carries the settings, since OpenSSH does not pass command-line
/// options on to the jump host.
async fn scp(recursive: bool, port: Option<u16>, quiet: bool, paths: &[String]) -> Result<i32> {
    let p = Profile::require()?;
    if p.expires().is_some_and(|e| e <= sallyport_core::unix_now()) {
        bail!(
            "your certificate expired at {}; run `sally login --proxy {} --user {}`",
            p.valid_until,
            p.proxy,
            p.user
        );
    }
    if !paths.iter().any(|a| is_remote(a)) {
        bail!("neither side is remote: name one as LOGIN@NODE:PATH");
    }
    let paths_ = p.paths();
    let home = sallyport_cli::profile::home();
    let ssh_port = ssh_port(&p).await?;
    let proxy_host = p
        .proxy
        .rsplit_once(':')
        .map_or(p.proxy.as_str(), |(h, _)| h)
        .to_string();
    let q = |path: &std::path::Path| format!("\"{}\"", path.display());
    let config = format!(
        "Host sallyport-proxy\n  HostName {proxy_host}\n  Port {ssh_port}\n  User {user}\nHost *\n  UserKnownHostsFile {kh}\n  IdentityFile {key}\n  CertificateFile {cert}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n  BatchMode yes\n  Ciphers {CIPHERS}\n",
        user = p.user,
        kh = q(&home.join("known_hosts")),
        key = q(&paths_.key),
        cert = q(&paths_.ssh_cert),
    );
    let cfg_path = home.join(format!("scp-config-{}", std::process::id()));
    sallyport_cli::profile::write_file(&cfg_path, config.as_bytes(), 0o600)?;
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _cleanup = Remove(cfg_path.clone());
    let mut cmd = std::process::Command::new("scp");
    cmd.arg("-F")
        .arg(&cfg_path)
        .args(["-o", "ProxyJump=sallyport-proxy"]);
    if recursive {
        cmd.arg("-r");
    }
    if quiet {
        cmd.arg("-q");
    }
    if let Some(port) = port {
        cmd.arg("-P").arg(port.to_string());
    }
    // A remote side without LOGIN@ gets the profile's default login.
    let default = default_login(&p).ok();
    for a in paths {
        if is_remote(a) && !a.split(':').next().unwrap_or("").contains('@') {
            match &default {
                Some(l) => cmd.arg(format!("{l}@{a}")),
                None => cmd.arg(a),
            };
        } else {
            cmd.arg(a);
        }
    }
    let status = cmd.status().map_err(|e| {
        anyhow!("cannot run OpenSSH's scp ({e}); `sally scp` needs the OpenSSH client installed")
    })?;
    Ok(status.code().unwrap_or(255))
}

/// `[LOGIN@]NODE:PATH` (a colon before any slash), as scp decides.
fn is_remote(arg: &str) -> bool {
    match arg.find(':') {
        Some(i) => !arg[..i].contains('/') && i > 0,
        None => false,
    }
}

fn config() -> Result<()> {
    let p = Profile::require()?;
    let paths = p.paths();
    let home = sallyport_cli::profile::home();
    let me = std::env::current_exe().context("cannot find the sally binary")?;
    let proxy_host = p
        .proxy
        .rsplit_once(':')
        .map_or(p.proxy.as_str(), |(h, _)| h);
    let known = home.join("known_hosts");
    println!(
        "# Sallyport cluster {} via {} (generated by `sally config`)",
        p.cluster, p.proxy
    );
    println!("Host *.{cluster} {proxy_host}", cluster = p.cluster);
    println!("    UserKnownHostsFile \"{}\"", known.display());
    println!("    IdentityFile \"{}\"", paths.key.display());
    println!("    CertificateFile \"{}\"", paths.ssh_cert.display());
    println!("    IdentitiesOnly yes");
    println!("    StrictHostKeyChecking yes");
    println!("    # AES-GCM first: through the proxy every byte is encrypted twice by ssh itself");
    println!("    Ciphers {CIPHERS}");
    println!("Host *.{} !{proxy_host}", p.cluster);
    println!("    Port 22");
    println!(
        "    ProxyCommand env SALLY_HOME=\"{}\" \"{}\" proxy ssh %r@%h:%p",
        home.display(),
        me.display()
    );
    Ok(())
}

async fn recordings(format: Format) -> Result<()> {
    let p = Profile::require()?;
    let list: Vec<SessionInfo> = sallyport_cli::http::user_api(&p)?
        .get("/v1/sessions")
        .await?;
    if format == Format::Json {
        let v: Vec<serde_json::Value> = list
            .iter()
            .map(|s| {
                serde_json::json!({"session_id": s.session_id, "user": s.user, "login": s.login, "node": s.node,
                    "start": s.start, "end": s.end, "exit_code": s.exit_code, "status": s.status, "kind": s.kind, "command": s.command})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{:<36} {:<12} {:<10} {:<16} {:<20} {:<5} {:<10} COMMAND",
            "SESSION", "USER", "LOGIN", "NODE", "START", "EXIT", "STATUS"
        );
        for s in &list {
            let code = s
                .exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into());
            // Every field a user or a node chose is shown with its control bytes escaped: a
            // command such as `echo \e]52;…` must not act on the terminal listing it.
            let esc = sallyport_core::terminal::escape_controls;
            println!(
                "{:<36} {:<12} {:<10} {:<16} {:<20} {:<5} {:<10} {}",
                esc(&s.session_id),
                esc(&s.user),
                esc(&s.login),
                esc(&s.node),
                s.start,
                code,
                esc(&s.status),
                s.command.as_deref().map_or("(shell)".into(), esc)
            );
        }
    }
    Ok(())
}

async fn play(id: &str, speed: f64, format: Option<&str>) -> Result<()> {
    let p = Profile::require()?;
    let api = sallyport_cli::http::user_api(&p)?;
    // Read as it arrives, never whole: a recording may be a GiB.
    let mut body = api
        .get_body(&format!(
            "/v1/sessions/{}/recording",
            sallyport_core::api::path_segment(id)
        ))
        .await?;
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    if format == Some("asciicast") {
        while let Some(chunk) = body.chunk().await? {
            out.write_all(&chunk)?;
        }
        out.flush()?;
        return Ok(());
    }
    let speed = if speed > 0.0 { speed } else { 1.0 };
    let mut last = 0.0f64;
    // One filter for the whole replay: a sequence split across two events is still caught.
    let mut filter = sallyport_core::terminal::Filter::new();
    let mut shown = String::new();
    let mut header = true;
    while let Some(line) = body.line().await? {
        if std::mem::take(&mut header) {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<(f64, String, String)>(&line) else {
            continue;
        };
        if ev.1 != "o" {
            continue;
        }
        if format.is_none() {
            let wait = ((ev.0 - last) / speed).clamp(0.0, 5.0);
            if wait > 0.0 {
                out.flush()?;
                std::thread::sleep(std::time::Duration::from_secs_f64(wait));
            }
            last = ev.0;
        }
        shown.clear();
        filter.feed(&ev.2, &mut shown);
        out.write_all(shown.as_bytes())?;
    }
    // A replay cut short may leave colours or a hidden cursor behind on the viewer's terminal.
    if format.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        out.write_all(sallyport_core::terminal::RESET.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// How long `sally login --auth` waits for the browser (`SALLY_LOGIN_TIMEOUT` seconds; 300).
fn login_timeout() -> u64 {
    std::env::var("SALLY_LOGIN_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}
