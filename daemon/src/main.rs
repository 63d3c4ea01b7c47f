//! `sallyport`: the daemon. `start` runs any subset of the auth and proxy services (all-in-one
//! by default); `configure` prints a complete, commented configuration (`--check FILE` checks
//! one without starting anything).

mod config;
mod diag;
mod kube_agent;
mod proxy_join;
mod start;
mod storage;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc, not glibc's malloc: the daemon makes and frees many small allocations per
/// request and per relayed chunk, where glibc's bins cost up to half a listing's time
/// (bench/RESULTS.md, `sally ls` over 10,000 nodes).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sallyport",
    version,
    about = "Sallyport: identity-aware access proxy (auth, proxy and agent services)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of `Start`'s flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start the services named in the config (all-in-one with no config).
    Start {
        /// Configuration file (see `sallyport configure`).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Data directory; overrides `sallyport.data_dir`.
        #[arg(long, short = 'd')]
        data_dir: Option<PathBuf>,
        /// Services to run: auth,proxy,node,kube (default: those enabled in the config;
        /// all-in-one without one). `--roles=node` runs an agent that dials out to --proxy;
        /// `--roles=kube` a kube agent serving one Kubernetes cluster the same way.
        #[arg(long, value_delimiter = ',')]
        roles: Vec<String>,
        /// The proxy's web address (HOST:3080), for an agent.
        #[arg(long)]
        proxy: Option<String>,
        /// Auth's address (HOST:3025), for a proxy on its own host (`--roles=proxy`); several
        /// (repeated or comma-separated) when auth runs as several instances.
        #[arg(long, value_delimiter = ',', value_name = "HOST:PORT")]
        auth_server: Vec<String>,
        /// One-time join token (`sallyctl tokens add --type=node`, `--type=kube` for a kube
        /// agent, `--type=proxy` for a proxy), for its first start.
        #[arg(long)]
        token: Option<String>,
        /// Node labels, k=v,k2=v2 (the kube cluster's too with --roles=kube).
        #[arg(long)]
        labels: Option<String>,
        /// This node's name (default: the system host name).
        #[arg(long)]
        nodename: Option<String>,
        /// The cluster's CA pin, sha256:<hex>, for an agent's or a proxy's first start.
        #[arg(long)]
        ca_pin: Option<String>,
        /// Do not verify the proxy at join (testing only).
        #[arg(long, conflicts_with = "ca_pin")]
        insecure: bool,
        /// The kube agent's kubeconfig: the API server and the agent's credentials, from its
        /// current context (default: the pod's service account).
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// The name of the Kubernetes cluster a kube agent serves (`sally kube login NAME`).
        #[arg(long, value_name = "NAME")]
        kube_cluster: Option<String>,
        /// Serve /healthz, /readyz and /metrics over plain HTTP here (HOST:PORT; port 0 picks
        /// one); overrides `sallyport.diag_addr`. Off unless set.
        #[arg(long, value_name = "HOST:PORT")]
        diag_addr: Option<std::net::SocketAddr>,
    },
    /// Print a complete, commented default configuration; with --check, check config files.
    Configure {
        /// Check these config files as `sallyport start` reads them (every key, type and
        /// value) and print `FILE: ok` for each; the first bad one is named, with the line and
        /// key, and the exit code is 1. Nothing is started or written.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        check: Vec<PathBuf>,
    },
    /// The all-in-one's storage moved to PostgreSQL, for several auth instances.
    Storage {
        #[command(subcommand)]
        command: StorageCommand,
    },
    /// Internal: a node session run through PAM, started by the agent (never by people).
    #[command(hide = true, name = "session-exec")]
    SessionExec {
        /// The inherited pipe the agent writes the session to.
        #[arg(long)]
        spec_fd: i32,
    },
    /// Write the man pages: sallyport(1) to stdout, or every page into --dir.
    #[command(hide = true)]
    Man {
        /// A directory for sallyport.1 and one page per subcommand (sallyport-start.1, ...).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum StorageCommand {
    /// Copy the embedded SQLite database (users, roles, certificate authorities, nodes,
    /// tokens, sessions, the audit chain) into an empty PostgreSQL database, row for row: the
    /// cluster keeps its CA pin, agents and logins keep working, `sallyctl audit verify` still
    /// passes. Stop sallyport first; then point `sallyport.storage` at PostgreSQL.
    Migrate {
        /// Configuration file (its `sallyport.data_dir` holds sallyport.db).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Data directory holding sallyport.db; overrides `sallyport.data_dir`.
        #[arg(long, short = 'd')]
        data_dir: Option<PathBuf>,
        /// The PostgreSQL database to copy into, postgres://USER:PASSWORD@HOST:5432/DB; it
        /// must hold no data (its tables are made if missing).
        #[arg(long, value_name = "URL")]
        to: String,
    },
}

fn main() -> ExitCode {
    sallyport_core::install_crypto_provider();
    let cli = Cli::parse();
    match cli.command {
        Command::SessionExec { spec_fd } => sallyport_agent::session_exec::main(spec_fd),
        Command::Man { dir } => match sallyport_cli::manual::man(Cli::command(), dir.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
        Command::Configure { check } if !check.is_empty() => {
            use std::io::Write;
            for path in &check {
                if let Err(e) = config::Config::load(path) {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
                // The verdict is the exit code: a closed stdout does not change it.
                let _ = writeln!(std::io::stdout(), "{}: ok", path.display());
            }
            ExitCode::SUCCESS
        }
        Command::Configure { .. } => {
            use std::io::Write;
            // A closed pipe (`sallyport configure | head`) is the reader's choice, not an error.
            match std::io::stdout().write_all(config::DEFAULT_CONFIG.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: cannot write the configuration: {e}");
                    ExitCode::from(1)
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Command::Storage {
            command:
                StorageCommand::Migrate {
                    config,
                    data_dir,
                    to,
                },
        } => run(storage::migrate(config, data_dir, to)),
        Command::Start {
            config,
            data_dir,
            roles,
            proxy,
            auth_server,
            token,
            labels,
            nodename,
            ca_pin,
            insecure,
            kubeconfig,
            kube_cluster,
            diag_addr,
        } => {
            let flags = start::Flags {
                roles,
                proxy,
                auth_server,
                token,
                labels,
                nodename,
                ca_pin,
                insecure,
                kubeconfig,
                kube_cluster,
                diag_addr,
            };
            run(start::run(config, data_dir, flags))
        }
    }
}

/// Runs `f` to its end on a new runtime: its error is printed, and is exit code 1.
fn run(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
