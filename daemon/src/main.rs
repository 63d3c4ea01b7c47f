//! `sallyport`: the daemon. `start` runs any subset of the auth and proxy services (all-in-one
//! by default); `configure` prints a complete, commented configuration.

mod config;
mod start;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    },
    /// Print a complete, commented default configuration.
    Configure,
}

fn main() -> ExitCode {
    sallyport_core::install_crypto_provider();
    let cli = Cli::parse();
    match cli.command {
        Command::Configure => {
            print!("{}", config::DEFAULT_CONFIG);
            ExitCode::SUCCESS
        }
        Command::Start { config, data_dir } => {
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            match rt.block_on(start::run(config, data_dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
