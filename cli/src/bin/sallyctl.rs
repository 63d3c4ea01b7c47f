//! `sallyctl`: the admin's client. On the auth host, `--data-dir DIR` (or `--config FILE`) acts
//! as the local admin identity `sallyport start` wrote; anywhere else it acts as the user
//! `sally login` logged in, reaching auth through the proxy, and roles decide what it may do.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use sallyport_cli::http::Api;
use sallyport_cli::profile::Profile;
use sallyport_core::api::*;
use sallyport_core::tls::{Trust, private_key_from_pem};
use sallyport_core::x509::pem_to_ders;
use serde::Deserialize;

#[derive(Parser)]
#[command(
    name = "sallyctl",
    version,
    about = "Sallyport administration: users, roles, tokens, CAs, audit"
)]
struct Cli {
    /// The daemon's config file (to find its data dir and admin identity).
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    /// The daemon's data dir (to use the admin identity written there).
    #[arg(long, short = 'd', global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Cluster name, CA pins and counts.
    Status {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Manage local users.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
    /// Certificate authorities.
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Search and verify the audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Subcommand)]
enum UsersCommand {
    /// Create a user and print a one-time sign-up token (valid 1h).
    Add {
        name: String,
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        logins: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// List users.
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Remove a user.
    Rm { name: String },
    /// Clear a user's password and authenticator and print a new sign-up token.
    Reset {
        name: String,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Print a CA's public part: `user` for sshd's TrustedUserCAKeys, `host` as a known_hosts
    /// line, `tls-user` / `tls-host` as PEM.
    Export {
        #[arg(long = "type", value_parser = ["user", "host", "tls-user", "tls-host"])]
        kind: String,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Audit events, oldest first, as JSON lines (or a table with --format text).
    Search {
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        user: Option<String>,
        /// How far back, e.g. 1h or 7d.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
    /// Check the hash chain; names the first record that was edited or removed.
    Verify,
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
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(sallyport_cli::EXIT_FAILURE)
        }
    }
}

#[derive(Deserialize)]
struct AdminIdentity {
    auth_addr: String,
    cert_pem: String,
    key_pem: String,
    host_ca_pem: String,
}

#[derive(Deserialize)]
struct LooseConfig {
    #[serde(default)]
    sallyport: LooseGlobal,
}

#[derive(Deserialize, Default)]
struct LooseGlobal {
    data_dir: Option<PathBuf>,
}

/// Connects to auth as the local admin (data dir) or as the logged-in user (through the proxy).
fn connect(cli: &Cli) -> Result<Api> {
    let dir = match (&cli.data_dir, &cli.config) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(c)) => {
            let text = std::fs::read_to_string(c)
                .with_context(|| format!("cannot read config {}", c.display()))?;
            let cfg: LooseConfig = serde_saphyr::from_str(&text)
                .map_err(|e| anyhow!("config {}: {e}", c.display()))?;
            Some(
                cfg.sallyport
                    .data_dir
                    .unwrap_or_else(|| PathBuf::from("/var/lib/sallyport")),
            )
        }
        (None, None) => None,
    };
    if let Some(dir) = dir {
        let path = dir.join("admin-identity.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow!("cannot read the admin identity {}: {e}; run sallyctl on the auth host as the user that runs `sallyport start`, after it started once", path.display())
        })?;
        let id: AdminIdentity = serde_json::from_str(&text)
            .with_context(|| format!("{} is unreadable", path.display()))?;
        let identity = (
            pem_to_ders(&id.cert_pem)?,
            private_key_from_pem(&id.key_pem)?,
        );
        return Api::new(
            &id.auth_addr,
            "the auth service",
            Trust::Roots(pem_to_ders(&id.host_ca_pem)?),
            Some(identity),
            None,
        );
    }
    let p = Profile::load()?.ok_or_else(|| {
        anyhow!("no identity: pass --data-dir DIR (or --config FILE) on the auth host, or log in with `sally login`")
    })?;
    if p.expires().is_some_and(|e| e <= sallyport_core::unix_now()) {
        bail!(
            "your certificates expired at {}; run `sally login --proxy {} --user {}`",
            p.valid_until,
            p.proxy,
            p.user
        );
    }
    let paths = p.paths();
    let cert = std::fs::read_to_string(&paths.tls_cert)
        .with_context(|| format!("cannot read {}", paths.tls_cert.display()))?;
    let key = std::fs::read_to_string(&paths.tls_key)
        .with_context(|| format!("cannot read {}", paths.tls_key.display()))?;
    let identity = (pem_to_ders(&cert)?, private_key_from_pem(&key)?);
    Api::new(
        &p.proxy,
        "the auth service via the proxy",
        Trust::Roots(pem_to_ders(&p.tls_host_ca_pem)?),
        Some(identity),
        Some(AUTH_ALPN),
    )
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let api = connect(&cli)?;
    match &cli.command {
        Command::Status { format } => {
            let s: Status = api.get("/v1/status").await?;
            if *format == Format::Json {
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
            }
        }
        Command::Users { command } => users(&api, command).await?,
        Command::Auth {
            command: AuthCommand::Export { kind },
        } => {
            let e: CaExport = api.get(&format!("/v1/ca/{kind}")).await?;
            print!("{}", e.text);
        }
        Command::Audit { command } => return audit(&api, command).await,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_token(t: &SignupToken, format: Format, what: &str) -> Result<()> {
    if format == Format::Json {
        println!(
            "{}",
            serde_json::to_string(
                &serde_json::json!({"user": t.user, "token": t.token, "expires": t.expires})
            )?
        );
    } else {
        println!(
            "User {} {what}. The sign-up token expires at {}.",
            t.user, t.expires
        );
        println!("Send them this command (the token works once):\n");
        println!(
            "  sally signup --proxy PROXY:3080 --token {} --ca-pin PIN\n",
            t.token
        );
        println!("PROXY is the proxy's address and PIN the CA pin `sallyctl status` shows.");
    }
    Ok(())
}

async fn users(api: &Api, cmd: &UsersCommand) -> Result<()> {
    match cmd {
        UsersCommand::Add {
            name,
            roles,
            logins,
            format,
        } => {
            let t: SignupToken = api
                .post(
                    "/v1/users",
                    &AddUser {
                        name: name.clone(),
                        roles: roles.clone(),
                        logins: logins.clone(),
                    },
                )
                .await?;
            print_token(&t, *format, "was created")?;
        }
        UsersCommand::Ls { format } => {
            let users: Vec<UserInfo> = api.get("/v1/users").await?;
            if *format == Format::Json {
                println!("{}", serde_json::to_string_pretty(&users)?);
            } else {
                println!(
                    "{:<24} {:<6} {:<8} {:<28} LOGINS",
                    "USER", "TYPE", "STATUS", "ROLES"
                );
                for u in users {
                    let logins = u
                        .traits
                        .get("internal.logins")
                        .map(|l| l.join(","))
                        .unwrap_or_default();
                    let status = if u.locked_until.is_some() {
                        "locked"
                    } else {
                        u.status.as_str()
                    };
                    println!(
                        "{:<24} {:<6} {:<8} {:<28} {}",
                        u.name,
                        u.user_type,
                        status,
                        u.roles.join(","),
                        logins
                    );
                }
            }
        }
        UsersCommand::Rm { name } => {
            let _: serde_json::Value = api.delete(&format!("/v1/users/{name}")).await?;
            println!("User {name} removed.");
        }
        UsersCommand::Reset { name, format } => {
            let t: SignupToken = api
                .post(&format!("/v1/users/{name}/reset"), &serde_json::json!({}))
                .await?;
            print_token(&t, *format, "was reset: password and authenticator cleared")?;
        }
    }
    Ok(())
}

async fn audit(api: &Api, cmd: &AuditCommand) -> Result<ExitCode> {
    match cmd {
        AuditCommand::Search {
            event_type,
            user,
            since,
            limit,
            format,
        } => {
            let since = since
                .as_deref()
                .map(|s| {
                    sallyport_core::duration::parse(s)
                        .map(|d| sallyport_core::unix_now() - d.as_secs() as i64)
                })
                .transpose()
                .map_err(|e| anyhow!("--since: {e}"))?;
            let mut query = vec![format!("limit={limit}")];
            if let Some(t) = event_type {
                query.push(format!("type={}", urlencode(t)));
            }
            if let Some(u) = user {
                query.push(format!("user={}", urlencode(u)));
            }
            if let Some(s) = since {
                query.push(format!("since={s}"));
            }
            let events: Vec<serde_json::Value> =
                api.get(&format!("/v1/audit?{}", query.join("&"))).await?;
            for e in events {
                if *format == Format::Json {
                    println!("{e}");
                } else {
                    let get =
                        |k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
                    let ok = match e.get("success").and_then(|v| v.as_bool()) {
                        Some(true) => "ok",
                        Some(false) => "FAILED",
                        None => "",
                    };
                    println!(
                        "{:>6} {} {:<16} {:<20} {}",
                        e["seq"],
                        get("time"),
                        get("event"),
                        get("user"),
                        ok
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify => {
            let v: AuditVerify = api.get("/v1/audit/verify").await?;
            if v.ok {
                println!("audit log intact: {}", v.message);
                Ok(ExitCode::SUCCESS)
            } else {
                println!(
                    "audit log TAMPERED: {} (first bad record: {})",
                    v.message,
                    v.first_bad_seq.unwrap_or(0)
                );
                Ok(ExitCode::from(sallyport_cli::EXIT_FAILURE))
            }
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
