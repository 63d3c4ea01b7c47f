//! `sallyctl`, the admin's client. On the auth host, `--data-dir DIR` (or `--config FILE`) acts
//! as the local admin identity `sallyport start` wrote; anywhere else it acts as the user
//! `sally login` logged in, reaching auth through the proxy, and roles decide what it may do.
//!
//! This module owns the command line (its flags, output and exit codes are a contract the
//! end-to-end tests hold it to); each command group lives in its own module: `connect` (who
//! sallyctl acts as), `cluster` (status, CA export), `users`, `audit`, `resources` (create, get,
//! rm, edit), `access`, `tokens`, `locks` and `nodes`.

mod access;
mod audit;
mod cluster;
mod connect;
mod locks;
mod nodes;
mod resources;
mod tokens;
mod users;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

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
        command: users::UsersCommand,
    },
    /// Certificate authorities.
    Auth {
        #[command(subcommand)]
        command: cluster::AuthCommand,
    },
    /// Search and verify the audit log.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
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
        command: access::AccessCommand,
    },
    /// Join tokens for agents.
    Tokens {
        #[command(subcommand)]
        command: tokens::TokensCommand,
    },
    /// Servers: register agentless OpenSSH nodes, list, remove.
    Nodes {
        #[command(subcommand)]
        command: nodes::NodesCommand,
    },
    /// Proxies: list, remove (a removed proxy's certificate is refused at once).
    Proxies {
        #[command(subcommand)]
        command: nodes::ProxiesCommand,
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
    /// Print a shell completion script, e.g. `source <(sallyctl completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages: sallyctl(1) to stdout, or every page into --dir.
    #[command(hide = true)]
    Man {
        /// A directory for sallyctl.1 and one page per subcommand (sallyctl-users.1, ...).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum GetFormat {
    Text,
    Yaml,
    Json,
}

/// The whole program: parse, run on a one-thread runtime, and map the outcome to an exit code
/// (1 for any failure at run time or a denied `access check`, clap's 2 for bad usage).
pub fn main() -> ExitCode {
    sallyport_core::install_crypto_provider();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(crate::EXIT_FAILURE);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) if crate::output::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(crate::EXIT_FAILURE)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    // What the program says about itself needs no identity.
    match &cli.command {
        Command::Completion { shell } => {
            crate::manual::completion(Cli::command(), *shell)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Man { dir } => {
            crate::manual::man(Cli::command(), dir.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let api = connect::connect(&cli)?;
    match &cli.command {
        Command::Status { format } => cluster::status(&api, *format).await?,
        Command::Users { command } => users::users(&api, command).await?,
        Command::Auth { command } => cluster::auth(&api, command).await?,
        Command::Audit { command } => return audit::audit(&api, command).await,
        Command::Create { force, file } => resources::create(&api, file, *force).await?,
        Command::Get { what, format } => resources::get(&api, what, *format).await?,
        Command::Rm { what } => resources::rm(&api, what).await?,
        Command::Edit { what } => resources::edit(&api, what).await?,
        Command::Access { command } => return access::access(&api, command).await,
        Command::Nodes { command } => nodes::nodes(&api, command).await?,
        Command::Tokens { command } => tokens::tokens(&api, command).await?,
        Command::Proxies { command } => nodes::proxies(&api, command).await?,
        Command::Lock {
            user,
            message,
            ttl,
            format,
        } => locks::lock(&api, user, message.as_deref(), ttl.as_deref(), *format).await?,
        Command::Completion { .. } | Command::Man { .. } => {}
    }
    Ok(ExitCode::SUCCESS)
}
