//! Reading secrets and codes: hidden prompts on a terminal; on a pipe, one value per line of
//! stdin, in the order the command documents.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Result, anyhow};

pub struct Input {
    tty: bool,
    lines: std::io::Lines<std::io::StdinLock<'static>>,
}

impl Input {
    pub fn new() -> Self {
        Input {
            tty: std::io::stdin().is_terminal(),
            lines: std::io::stdin().lock().lines(),
        }
    }

    pub fn is_tty(&self) -> bool {
        self.tty
    }

    fn next_line(&mut self, what: &str) -> Result<String> {
        match self.lines.next() {
            Some(Ok(l)) => Ok(l.trim_end_matches('\r').to_string()),
            Some(Err(e)) => Err(anyhow!("cannot read the {what} from stdin: {e}")),
            None => Err(anyhow!("stdin ended before the {what} was given")),
        }
    }

    /// A secret: hidden on a terminal, the next line otherwise.
    pub fn secret(&mut self, prompt: &str, what: &str) -> Result<String> {
        if self.tty {
            rpassword::prompt_password(prompt).map_err(|e| anyhow!("cannot read the {what}: {e}"))
        } else {
            self.next_line(what)
        }
    }

    /// A visible value: prompted on a terminal (prompt on stderr), the next line otherwise.
    pub fn line(&mut self, prompt: &str, what: &str) -> Result<String> {
        if self.tty {
            eprint!("{prompt}");
            let _ = std::io::stderr().flush();
        }
        self.next_line(what).map(|s| s.trim().to_string())
    }
}

impl Default for Input {
    fn default() -> Self {
        Self::new()
    }
}
