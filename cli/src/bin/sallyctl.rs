//! `sallyctl`: the admin's client. On the auth host, `--data-dir DIR` (or `--config FILE`) acts
//! as the local admin identity `sallyport start` wrote; anywhere else it acts as the user
//! `sally login` logged in, reaching auth through the proxy, and roles decide what it may do.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use sallyport_cli::http::Api;
// Output that ends quietly on a closed pipe (`sallyctl audit search | head`), not std's panic.
use sallyport_cli::{print, println};
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
    /// Create resources (roles, oidc connectors) from a YAML file with one or more documents.
    Create {
        /// Overwrite resources that already exist.
        #[arg(short = 'f', long = "force")]
        force: bool,
        file: PathBuf,
    },
    /// Show resources: roles, role/NAME, users, user/NAME, tokens, nodes, locks, connectors,
    /// oidc/NAME.
    Get {
        what: String,
        #[arg(long, value_enum, default_value = "text")]
        format: GetFormat,
    },
    /// Delete a resource: role/NAME, user/NAME, node/NAME, lock/ID or oidc/NAME.
    Rm { what: String },
    /// Edit a role in $EDITOR; it is validated before it is saved.
    Edit { what: String },
    /// Would a user be let in? Prints allowed or denied and the role and rule that decided.
    Access {
        #[command(subcommand)]
        command: AccessCommand,
    },
    /// Join tokens for agents.
    Tokens {
        #[command(subcommand)]
        command: TokensCommand,
    },
    /// Servers: register agentless OpenSSH nodes, list, remove.
    Nodes {
        #[command(subcommand)]
        command: NodesCommand,
    },
    /// Lock a user now: no login, no new session, no API call, and their live SSH connections
    /// are ended. `sallyctl get locks` lists locks; `sallyctl rm lock/ID` lifts one.
    Lock {
        #[arg(long)]
        user: String,
        /// Shown to the user with every refusal.
        #[arg(long)]
        message: Option<String>,
        /// For how long (e.g. 1h); until removed when not given.
        #[arg(long)]
        ttl: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum GetFormat {
    Text,
    Yaml,
    Json,
}

#[derive(Subcommand)]
enum AccessCommand {
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

#[derive(Subcommand)]
enum TokensCommand {
    /// A one-time token an agent joins with, and the command to run on the server.
    Add {
        #[arg(long = "type", value_parser = ["node"])]
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

#[derive(Subcommand)]
enum NodesCommand {
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
    /// Replace a user's roles and/or logins.
    Update {
        name: String,
        #[arg(long, value_delimiter = ',')]
        set_roles: Option<Vec<String>>,
        #[arg(long, value_delimiter = ',', num_args = 0..)]
        set_logins: Option<Vec<String>>,
    },
    /// Clear a user's password and authenticator and print a new sign-up token.
    Reset {
        name: String,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Print a CA's public part: `openssh` for an agentless node's sshd (TrustedUserCAKeys: it
    /// signs only the proxy's per-session certificates), `user` for what checks people's login
    /// certificates, `host` as a known_hosts line, `tls-user` / `tls-host` as PEM.
    Export {
        #[arg(long = "type", value_parser = ["user", "host", "openssh", "tls-user", "tls-host"])]
        kind: String,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Audit events, oldest first, as JSON lines (or a table with --format text). Each result
    /// is checked against the signed chain first (a rewritten one fails the search); results
    /// no checkpoint covers yet are named in a warning on stderr.
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
    /// Check the hash chain and its signed checkpoints; names the first record that was edited
    /// or removed, and how many records are anchored. Anchored records cannot be rewritten by a
    /// database writer unseen; the ones after the last checkpoint (at most a minute's) can, and
    /// whoever holds the data dir's audit-checkpoint.key could sign a rewritten chain.
    Verify {
        /// The checkpoint key's fingerprint (SHA256:...) to insist on, e.g. from
        /// `ssh-keygen -lf <data>/audit-checkpoint.key` when the cluster was set up.
        #[arg(long)]
        key: Option<String>,
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
        Ok(code) => code,
        Err(e) if sallyport_cli::output::is_closed_pipe(&e) => ExitCode::SUCCESS,
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
    sallyport_cli::http::user_api(&p)
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
                if let Some(why) = &s.audit_anchoring_stopped {
                    println!("Audit anchor:  STOPPED: {why}");
                }
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
        Command::Create { force, file } => create(&api, file, *force).await?,
        Command::Get { what, format } => get(&api, what, *format).await?,
        Command::Rm { what } => rm(&api, what).await?,
        Command::Edit { what } => edit(&api, what).await?,
        Command::Access { command } => return access(&api, command).await,
        Command::Nodes { command } => nodes(&api, command).await?,
        Command::Tokens {
            command: TokensCommand::Add { kind, ttl, format },
        } => {
            let ttl = sallyport_core::duration::parse(ttl).map_err(|e| anyhow!("--ttl: {e}"))?;
            let t: JoinToken = api
                .post(
                    "/v1/tokens/join",
                    &AddJoinToken {
                        kind: kind.clone(),
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
                let s: Status = api.get("/v1/status").await?;
                let pin = s.ca_pins.first().cloned().unwrap_or_default();
                println!(
                    "The join token {} expires at {} and works once.",
                    t.token, t.expires
                );
                println!("Run this on the server (as root, so sessions can run as any login):\n");
                println!(
                    "  sallyport start --roles=node --proxy=PROXY:3080 --token={} --ca-pin={pin} --data-dir /var/lib/sallyport --labels env=dev\n",
                    t.token
                );
                println!("PROXY is the proxy's address as the server reaches it.");
            }
        }
        Command::Lock {
            user,
            message,
            ttl,
            format,
        } => {
            let ttl_secs = match ttl {
                Some(t) => Some(
                    sallyport_core::duration::parse(t)
                        .map_err(|e| anyhow!("--ttl: {e}"))?
                        .as_secs(),
                ),
                None => None,
            };
            let l: LockInfo = api
                .post(
                    "/v1/locks",
                    &AddLock {
                        user: user.clone(),
                        message: message.clone(),
                        ttl_secs,
                    },
                )
                .await?;
            if *format == Format::Json {
                println!("{}", serde_json::to_string(&l)?);
            } else {
                println!(
                    "User {} is locked ({}) until {}; lift with `sallyctl rm lock/{}`",
                    l.user,
                    l.message,
                    l.expires.as_deref().unwrap_or("removed"),
                    l.id
                );
            }
        }
        Command::Tokens {
            command: TokensCommand::Ls { format },
        } => {
            get(
                &api,
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
        UsersCommand::Update {
            name,
            set_roles,
            set_logins,
        } => {
            if set_roles.is_none() && set_logins.is_none() {
                bail!("nothing to update: give --set-roles and/or --set-logins");
            }
            let u: UserInfo = api
                .put(
                    &format!("/v1/users/{name}"),
                    &UpdateUser {
                        roles: set_roles.clone(),
                        logins: set_logins.clone(),
                    },
                )
                .await?;
            let logins = u
                .traits
                .get("internal.logins")
                .map(|l| l.join(","))
                .unwrap_or_default();
            println!(
                "User {} updated: roles {}; logins {}",
                u.name,
                u.roles.join(","),
                if logins.is_empty() { "(none)" } else { &logins }
            );
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
            let (events, unanchored_from): (Vec<serde_json::Value>, _) = api
                .get_with_header(
                    &format!("/v1/audit?{}", query.join("&")),
                    sallyport_core::audit::UNANCHORED_HEADER,
                )
                .await?;
            let unanchored = unanchored_from
                .and_then(|s| s.parse::<i64>().ok())
                .map(|from| {
                    let n = events
                        .iter()
                        .filter(|e| e["seq"].as_i64().is_some_and(|s| s >= from))
                        .count();
                    (from, n)
                });
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
            // After the records (stdout stays what scripts parse), and only for what the
            // search returned: checked to link to the chain head, but no signature covers
            // them yet.
            if let Some((from, n)) = unanchored {
                eprintln!(
                    "warning: records from seq {from} on ({n} of these) are not yet anchored by a signed checkpoint: they link to the chain head, but a database writer could still rewrite them until auth signs one (within its checkpoint_interval)"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify { key } => {
            let v: AuditVerify = api.get("/v1/audit/verify").await?;
            if let Some(pin) = key
                && v.checkpoint_key.as_deref() != Some(pin.as_str())
            {
                println!(
                    "audit log NOT VERIFIED: its checkpoints are checked with key {}, not the pinned {pin}",
                    v.checkpoint_key.as_deref().unwrap_or("(none)")
                );
                return Ok(ExitCode::from(sallyport_cli::EXIT_FAILURE));
            }
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

async fn create(api: &Api, file: &std::path::Path, force: bool) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let resources = sallyport_core::resource::parse_all(&text, &file.display().to_string())
        .map_err(anyhow::Error::msg)?;
    for r in resources {
        match r {
            sallyport_core::resource::Resource::Oidc(connector) => {
                let res: PutRoleResult = api
                    .post(
                        "/v1/connectors",
                        &PutConnector {
                            connector,
                            overwrite: force,
                        },
                    )
                    .await?;
                println!(
                    "oidc connector {} {}",
                    res.name,
                    if res.created { "created" } else { "updated" }
                );
            }
            sallyport_core::resource::Resource::Role(role) => {
                let res: PutRoleResult = api
                    .post(
                        "/v1/roles",
                        &PutRole {
                            role,
                            overwrite: force,
                        },
                    )
                    .await?;
                println!(
                    "role {} {}",
                    res.name,
                    if res.created { "created" } else { "updated" }
                );
            }
        }
    }
    Ok(())
}

/// `role/NAME` → ("role", Some("NAME")); `roles` → ("role", None).
fn parse_target(what: &str) -> Result<(&'static str, Option<&str>)> {
    let (kind, name) = match what.split_once('/') {
        Some((k, n)) if !n.is_empty() => (k, Some(n)),
        Some(_) => bail!("{what:?}: give a name after the slash"),
        None => (what, None),
    };
    let kind = match kind {
        "role" | "roles" => "role",
        "user" | "users" => "user",
        "token" | "tokens" => "token",
        "node" | "nodes" => "node",
        "lock" | "locks" => "lock",
        "oidc" | "connector" | "connectors" => "connector",
        other => bail!(
            "unknown resource {other:?}: use roles, role/NAME, users, user/NAME, tokens, nodes, locks, connectors or oidc/NAME"
        ),
    };
    Ok((kind, name))
}

fn print_yaml<T: serde::Serialize>(items: &[T]) -> Result<()> {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            println!("---");
        }
        print!(
            "{}",
            serde_saphyr::to_string(item).map_err(|e| anyhow!("yaml: {e}"))?
        );
    }
    Ok(())
}

fn print_json<T: serde::Serialize>(items: &[T], single: bool) -> Result<()> {
    if single {
        if let Some(first) = items.first() {
            println!("{}", serde_json::to_string_pretty(first)?);
        }
    } else {
        println!("{}", serde_json::to_string_pretty(items)?);
    }
    Ok(())
}

async fn get(api: &Api, what: &str, format: GetFormat) -> Result<()> {
    let (kind, name) = parse_target(what)?;
    match kind {
        "role" => {
            let roles: Vec<sallyport_core::role::Role> = match name {
                Some(n) => vec![api.get(&format!("/v1/roles/{n}")).await?],
                None => api.get("/v1/roles").await?,
            };
            match format {
                GetFormat::Yaml => print_yaml(&roles)?,
                GetFormat::Json => print_json(&roles, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<24} DESCRIPTION", "ROLE");
                    for r in &roles {
                        println!(
                            "{:<24} {}",
                            r.metadata.name,
                            r.metadata.description.as_deref().unwrap_or("")
                        );
                    }
                }
            }
        }
        "user" => {
            let users: Vec<UserInfo> = match name {
                Some(n) => vec![api.get(&format!("/v1/users/{n}")).await?],
                None => api.get("/v1/users").await?,
            };
            match format {
                GetFormat::Yaml => print_yaml(&users)?,
                GetFormat::Json => print_json(&users, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<24} {:<6} {:<8} ROLES", "USER", "TYPE", "STATUS");
                    for u in &users {
                        println!(
                            "{:<24} {:<6} {:<8} {}",
                            u.name,
                            u.user_type,
                            u.status,
                            u.roles.join(",")
                        );
                    }
                }
            }
        }
        "token" => {
            let tokens: Vec<TokenInfo> = api.get("/v1/tokens").await?;
            match format {
                GetFormat::Yaml => print_yaml(&tokens)?,
                GetFormat::Json => print_json(&tokens, false)?,
                GetFormat::Text => {
                    println!("{:<8} {:<24} EXPIRES", "TYPE", "USER");
                    for t in &tokens {
                        println!(
                            "{:<8} {:<24} {}",
                            t.kind,
                            t.user.as_deref().unwrap_or("-"),
                            t.expires
                        );
                    }
                }
            }
        }
        "connector" => {
            let all: Vec<sallyport_core::oidc::OidcConnector> = api.get("/v1/connectors").await?;
            let list: Vec<_> = all
                .into_iter()
                .filter(|c| name.is_none_or(|n| c.metadata.name == n))
                .collect();
            if let Some(n) = name
                && list.is_empty()
            {
                bail!("connector {n} does not exist");
            }
            match format {
                GetFormat::Yaml => print_yaml(&list)?,
                GetFormat::Json => print_json(&list, name.is_some())?,
                GetFormat::Text => {
                    println!("{:<20} {:<6} {:<40} CLIENT", "CONNECTOR", "TYPE", "ISSUER");
                    for c in &list {
                        println!(
                            "{:<20} {:<6} {:<40} {}",
                            c.metadata.name, c.kind, c.spec.issuer_url, c.spec.client_id
                        );
                    }
                }
            }
        }
        "lock" => {
            let locks: Vec<LockInfo> = api.get("/v1/locks").await?;
            match format {
                GetFormat::Yaml => print_yaml(&locks)?,
                GetFormat::Json => print_json(&locks, false)?,
                GetFormat::Text => {
                    println!("{:<36} {:<20} {:<26} MESSAGE", "ID", "USER", "EXPIRES");
                    for l in &locks {
                        println!(
                            "{:<36} {:<20} {:<26} {}",
                            l.id,
                            l.user,
                            l.expires.as_deref().unwrap_or("(until removed)"),
                            l.message
                        );
                    }
                }
            }
        }
        _ => {
            let nodes: Vec<NodeInfo> = api.get("/v1/nodes").await?;
            let nodes: Vec<NodeInfo> = nodes
                .into_iter()
                .filter(|n| name.is_none_or(|x| n.hostname == x || n.id == x))
                .collect();
            if let Some(n) = name
                && nodes.is_empty()
            {
                bail!("node {n} does not exist");
            }
            match format {
                GetFormat::Yaml => print_yaml(&nodes)?,
                GetFormat::Json => print_json(&nodes, name.is_some())?,
                GetFormat::Text => print_nodes(&nodes),
            }
        }
    }
    Ok(())
}

fn print_nodes(nodes: &[NodeInfo]) {
    println!("{:<24} {:<36} {:<22} LABELS", "NODE", "ID", "ADDRESS");
    for n in nodes {
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<24} {:<36} {:<22} {}",
            n.hostname,
            n.id,
            n.addr.as_deref().unwrap_or("(tunnel)"),
            labels.join(",")
        );
    }
}

async fn rm(api: &Api, what: &str) -> Result<()> {
    let (kind, name) = parse_target(what)?;
    let name = name.ok_or_else(|| anyhow!("say which one: {kind}/NAME"))?;
    let path = match kind {
        "role" => format!("/v1/roles/{name}"),
        "user" => format!("/v1/users/{name}"),
        "node" => format!("/v1/nodes/{name}"),
        "lock" => format!("/v1/locks/{name}"),
        "connector" => format!("/v1/connectors/{name}"),
        _ => bail!("tokens expire on their own; `sallyctl users reset` replaces a sign-up token"),
    };
    let _: serde_json::Value = api.delete(&path).await?;
    println!("{kind} {name} deleted");
    Ok(())
}

async fn edit(api: &Api, what: &str) -> Result<()> {
    let (kind, name) = parse_target(what)?;
    let (Some(name), "role") = (name, kind) else {
        bail!("only role/NAME can be edited")
    };
    let role: sallyport_core::role::Role = api.get(&format!("/v1/roles/{name}")).await?;
    let original = serde_saphyr::to_string(&role).map_err(|e| anyhow!("yaml: {e}"))?;
    let path =
        std::env::temp_dir().join(format!("sallyctl-role-{name}-{}.yaml", std::process::id()));
    sallyport_cli::profile::write_file(&path, original.as_bytes(), 0o600)?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .with_context(|| format!("cannot run the editor {editor:?}"))?;
    if !status.success() {
        bail!(
            "the editor {editor:?} failed; nothing was saved (your edit is in {})",
            path.display()
        );
    }
    let edited = std::fs::read_to_string(&path)?;
    if edited == original {
        let _ = std::fs::remove_file(&path);
        println!("role {name}: no changes");
        return Ok(());
    }
    let parsed = sallyport_core::resource::parse_all(&edited, &path.display().to_string());
    let keep = |e: String| {
        anyhow!(
            "{e}\nnothing was saved; your edit is kept in {} (fix it, then `sallyctl create -f` it)",
            path.display()
        )
    };
    let mut resources = parsed.map_err(keep)?;
    let Some(sallyport_core::resource::Resource::Role(new)) =
        resources.pop().filter(|_| resources.is_empty())
    else {
        return Err(keep("the file must hold exactly one role".into()));
    };
    if new.metadata.name != name {
        return Err(keep(format!(
            "the role's name cannot change in an edit ({name} → {})",
            new.metadata.name
        )));
    }
    let _: PutRoleResult = api
        .post(
            "/v1/roles",
            &PutRole {
                role: new,
                overwrite: true,
            },
        )
        .await
        .map_err(|e| keep(e.to_string()))?;
    let _ = std::fs::remove_file(&path);
    println!("role {name} updated");
    Ok(())
}

async fn access(api: &Api, cmd: &AccessCommand) -> Result<ExitCode> {
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
            "/v1/access/check",
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
        ExitCode::from(sallyport_cli::EXIT_FAILURE)
    })
}

fn parse_labels(text: &str) -> Result<std::collections::BTreeMap<String, String>> {
    sallyport_core::names::parse_labels(text).map_err(anyhow::Error::msg)
}

async fn nodes(api: &Api, cmd: &NodesCommand) -> Result<()> {
    match cmd {
        NodesCommand::Add { name, addr, labels } => {
            let n: NodeInfo = api
                .post(
                    "/v1/nodes",
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
            let nodes: Vec<NodeInfo> = api.get("/v1/nodes").await?;
            if *format == Format::Json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
            } else {
                print_nodes(&nodes);
            }
        }
        NodesCommand::Rm { name } => {
            let _: serde_json::Value = api.delete(&format!("/v1/nodes/{name}")).await?;
            println!("node {name} removed");
        }
    }
    Ok(())
}
