//! `sally`, the user's client: sign up, log in once, and hold short-lived certificates. This
//! module owns the command line (its flags, output and exit codes are a contract the end-to-end
//! tests hold it to); each command group lives in its own module, in the order a user meets
//! them: `login` (signup, login, status, logout), `nodes` (ls), `ssh`, `openssh` (config, scp,
//! the ProxyCommand), `play` (recordings) and `kube` (kubectl through the proxy).

mod bench;
mod kube;
mod login;
mod nodes;
mod openssh;
mod play;
mod ssh;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

// Output that ends quietly on a closed pipe (`sally recordings ls | head`), not std's panic.
use crate::println;
use crate::profile;

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
        local: Vec<crate::forward::Spec>,
        /// Forward a port on the node back here: [bind_address:]port:host:hostport.
        #[arg(short = 'R', value_name = "SPEC")]
        remote: Vec<crate::forward::Spec>,
        /// A local SOCKS proxy whose connections leave from the node: [bind_address:]port.
        #[arg(short = 'D', value_name = "SPEC")]
        dynamic: Vec<crate::forward::DynamicSpec>,
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
        command: openssh::ProxyCommand,
    },
    /// Kubernetes clusters through the proxy: list them, point kubectl at one.
    Kube {
        #[command(subcommand)]
        command: kube::KubeCommand,
    },
    /// Recorded sessions.
    Recordings {
        #[command(subcommand)]
        command: play::RecordingsCommand,
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
    /// Measure the proxy: sessions per second and their latency (`bench ssh`).
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Print a shell completion script, e.g. `source <(sally completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages: sally(1) to stdout, or every page into --dir.
    #[command(hide = true)]
    Man {
        /// A directory for sally.1 and one page per subcommand (sally-login.1, ...).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// The whole program: parse, run on a one-thread runtime, and map the outcome to an exit code
/// (1 for any failure at run time, clap's 2 for bad usage, 0 when the reader closed stdout).
pub fn main() -> ExitCode {
    sallyport_core::install_crypto_provider();
    let cli = Cli::parse();
    // A benchmark keeps hundreds of connections busy at once: every core; the rest one thread.
    let rt = if matches!(cli.command, Command::Bench { .. }) {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(crate::EXIT_FAILURE);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if crate::output::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(crate::EXIT_FAILURE)
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Signup {
            proxy,
            token,
            trust,
        } => login::signup(&proxy, &token, &trust).await,
        Command::Login {
            proxy,
            user,
            auth,
            browser,
            ttl,
            trust,
        } => {
            login::login(
                &proxy,
                user,
                auth,
                browser == "none",
                ttl.as_deref(),
                &trust,
            )
            .await
        }
        Command::Status { format } => login::status(format),
        Command::Ls { labels, format } => nodes::ls(&labels, format).await,
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
            let fwd = ssh::Forwards {
                local,
                remote,
                dynamic,
                agent: forward_agent,
                no_command,
            };
            let code = ssh::ssh(tty, no_tty, login, &target, command, fwd).await?;
            std::process::exit(code);
        }
        Command::Scp {
            recursive,
            port,
            quiet,
            paths,
        } => {
            let code = openssh::scp(recursive, port, quiet, &paths).await?;
            std::process::exit(code);
        }
        Command::Config => openssh::config(),
        Command::Proxy {
            command: openssh::ProxyCommand::Ssh { target },
        } => openssh::proxy_ssh(&target).await,
        Command::Kube { command } => kube::run(command).await,
        Command::Recordings {
            command: play::RecordingsCommand::Ls { format },
        } => play::recordings(format).await,
        Command::Play {
            session_id,
            speed,
            format,
        } => play::play(&session_id, speed, format.as_deref()).await,
        Command::Logout => {
            // Before the profile goes: it names the cluster whose kubeconfig entries go too.
            // A kubeconfig that cannot be cleaned does not keep the keys on disk.
            if let Some(p) = profile::Profile::load().ok().flatten() {
                match kube::forget(&p) {
                    Ok(Some((path, names))) => println!(
                        "Removed Kubernetes context{} {} from {}",
                        if names.len() == 1 { "" } else { "s" },
                        names.join(", "),
                        path.display()
                    ),
                    Ok(None) => {}
                    Err(e) => eprintln!("warning: the kubeconfig is unchanged: {e:#}"),
                }
            }
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
        Command::Bench { command } => bench::run(command).await,
        Command::Completion { shell } => crate::manual::completion(Cli::command(), shell),
        Command::Man { dir } => crate::manual::man(Cli::command(), dir.as_deref()),
    }
}
