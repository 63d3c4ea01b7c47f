//! Standard output for the command-line programs, as Unix tools treat it: a reader that went
//! away (`sally recordings ls | head -3`) ends the program quietly with status 0.
//!
//! Rust ignores SIGPIPE, so a write to a closed pipe returns `BrokenPipe`, on which std's
//! `println!` panics with a backtrace. The binaries import this module's `println!` and
//! `print!` in place of std's (`use sallyport_cli::{print, println};`), so every line they
//! print goes through [`write`] without a change at each call site. Writes that propagate their
//! errors instead (`sally play` streaming a recording, an SSH session's output) end in `main`,
//! where [`is_closed_pipe`] tells a closed pipe from a real failure.

use std::io::Write;

/// Writes to standard output; on a closed pipe, exits quietly with status 0. Any other write
/// failure (a full disk) is reported on stderr with status 1 rather than a panic.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(i32::from(crate::EXIT_FAILURE));
    }
}

/// Whether `e` (an error that ended the program) is only its reader closing standard output.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` through [`write`].
#[macro_export]
macro_rules! println {
    () => {
        $crate::output::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*), true)
    };
}

/// `print!` through [`write`].
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*), false)
    };
}
