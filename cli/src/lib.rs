//! What `sally` and `sallyctl` share: the profile under `$SALLY_HOME`, HTTPS clients that trust
//! the cluster by pin or by saved CA, prompts that work on a terminal and on a pipe, and output.

pub mod forward;
pub mod http;
pub mod manual;
pub mod output;
pub mod profile;
pub mod prompt;
pub mod sally;
pub mod sallyctl;
pub mod ssh;
pub mod sso;

/// Exit codes: 1 for anything that failed at run time; clap uses 2 for bad usage.
pub const EXIT_FAILURE: u8 = 1;
