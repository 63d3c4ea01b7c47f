//! What people expect of a command-line program besides `--help`: shell completion scripts
//! (`completion bash|zsh|fish|elvish|powershell`) and man pages, both generated from the same
//! clap definitions the program parses with, so they cannot drift from its real flags. Used by
//! `sally`, `sallyctl` and the daemon `sallyport`; `scripts/man` writes every page to
//! `target/man/`.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// Writes `cmd`'s completion script for `shell` to stdout (`source <(sally completion bash)`).
pub fn completion(mut cmd: clap::Command, shell: clap_complete::Shell) -> Result<()> {
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    write_stdout(&out)
}

/// Writes `cmd`'s man page to stdout (`sally man | man -l -`), or with `dir`, its page and one
/// per subcommand, as `man` names them (`sally.1`, `sally-login.1`, `sally-proxy-ssh.1`, ...).
/// Hidden subcommands (the `man` command itself, the daemon's internal `session-exec`) and
/// clap's `help` get none.
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> Result<()> {
    let Some(dir) = dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        return write_stdout(&out);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // Subcommands are named after their parents (`sally-proxy-ssh`) and carry the version and
    // the parent's global flags only once the command is built.
    let mut cmd = cmd;
    cmd.build();
    write_pages(cmd, dir)
}

fn write_pages(cmd: clap::Command, dir: &Path) -> Result<()> {
    let subcommands: Vec<clap::Command> = cmd
        .get_subcommands()
        // clap's own `help` subcommand is no command of ours: `--help` is in every page.
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .cloned()
        .collect();
    let man = clap_mangen::Man::new(cmd);
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    for sub in subcommands {
        write_pages(sub, dir)?;
    }
    Ok(())
}

/// Standard output as the rest of the clients treat it: a closed pipe (`... | head`) is the
/// reader's choice and ends the program quietly (see `crate::output`).
fn write_stdout(bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}
