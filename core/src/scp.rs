//! File copies that run as commands: which commands are copies (legacy `scp -t/-f`,
//! `rsync --server`, a direct `sftp-server`) — exactly what the real clients send, read as the
//! shell reads it, since a copy is audited per file instead of recorded and anything else must
//! be recorded — which merely mention one (refused under `ssh_file_copy: false`), and the
//! legacy scp protocol's file headers, read from the sending side to audit each file.

/// Which way the bytes go, seen from the person's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Upload,
    Download,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileCopy {
    /// Legacy scp: the remote end runs `scp -t PATH` (upload) or `scp -f PATH` (download).
    Scp { direction: Direction, path: String },
    /// `rsync -e ssh`: the remote end runs `rsync --server [--sender] ... . PATH`.
    Rsync { direction: Direction, path: String },
    /// The SFTP server run as a command instead of a subsystem.
    SftpServer,
}

/// The system `sftp-server` binaries `sftp -s PATH` names: root-owned paths, so the program
/// is the real server, not something the login put there.
pub const SFTP_SERVERS: &[&str] = &[
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/sftp-server",
];

/// One word of a command, as the shell would pass it to the program.
struct Word {
    text: String,
    /// An unquoted `*`, `?` or `[`: the shell may turn the word into other words.
    glob: bool,
    /// The first character is an unquoted `~` (the shell's tilde expansion).
    tilde: bool,
}

/// The words of `command` as any POSIX-like login shell (sh, bash, dash, zsh, fish) runs it,
/// or `None` unless the shell would run exactly one program with literal arguments: any
/// unquoted `; | & $ \` ( ) < > { } ! #`, a `$` or `` ` `` or `\` or `!` inside double quotes,
/// a `\` inside single quotes (shells disagree on it), a line break or another control
/// character, an unquoted `~` after `=` or `:` (bash expands some of those, other shells do
/// not), or an unclosed quote, and the answer is `None`.
fn shell_words(command: &str) -> Option<Vec<Word>> {
    let mut words = Vec::new();
    let mut cur: Option<Word> = None;
    let mut chars = command.chars();
    fn push(cur: &mut Option<Word>, c: char, glob: bool) {
        let w = cur.get_or_insert_with(|| Word {
            text: String::new(),
            glob: false,
            tilde: false,
        });
        w.text.push(c);
        w.glob |= glob;
    }
    fn start(cur: &mut Option<Word>) {
        cur.get_or_insert_with(|| Word {
            text: String::new(),
            glob: false,
            tilde: false,
        });
    }
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '\\' => match chars.next() {
                Some(e) if !e.is_control() => push(&mut cur, e, false),
                _ => return None,
            },
            '\'' => {
                start(&mut cur);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        '\\' => return None,
                        e if e.is_control() => return None,
                        e => push(&mut cur, e, false),
                    }
                }
            }
            '"' => {
                start(&mut cur);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '$' | '`' | '\\' | '!' => return None,
                        e if e.is_control() => return None,
                        e => push(&mut cur, e, false),
                    }
                }
            }
            '#' if cur.is_none() => return None,
            ';' | '|' | '&' | '$' | '`' | '(' | ')' | '<' | '>' | '{' | '}' | '!' => {
                return None;
            }
            c if c.is_control() => return None,
            '*' | '?' | '[' => push(&mut cur, c, true),
            '~' if cur.is_none() => {
                push(&mut cur, c, false);
                if let Some(w) = cur.as_mut() {
                    w.tilde = true;
                }
            }
            '~' if cur.as_ref().is_some_and(|w| w.text.ends_with(['=', ':'])) => {
                return None;
            }
            c => push(&mut cur, c, false),
        }
    }
    if let Some(w) = cur.take() {
        words.push(w);
    }
    Some(words)
}

/// Whether `command` is a file copy: exactly what the real clients send, the whole command read
/// as the shell would read it. Anything else (`echo x; : rsync --server`, `scp -t a b`,
/// `./scp -t x`) is not a copy, and so a recorded session.
///
/// - OpenSSH's legacy scp (`scp -O`): `scp [-r] [-p] [-d] [-v] [-q] -t|-f [--] PATH`.
/// - rsync: `rsync --server [--sender] OPTIONS . PATH...`, without the options that make the
///   server run a daemon with a config file of the login's choosing (which can run programs).
/// - `sftp -s`: one of [`SFTP_SERVERS`], alone.
///
/// A word the shell would glob (`/var/log/*.log`) or whose `~` names another login's home
/// (`~bob/x`) makes it not a copy: an agent node runs copies without a shell (see
/// [`CopyCommand`]), so it could not expand them as the shell would.
pub fn classify(command: &str) -> Option<FileCopy> {
    parse(command).map(|c| c.copy)
}

/// A file copy command and its words, for running it without a shell: a login's shell (its
/// rc files, a function named `rsync`) could make `rsync` mean anything, and a copy runs
/// unrecorded, so an agent node runs the real program with these words itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyCommand {
    pub copy: FileCopy,
    /// Each word as the shell would pass it, and whether it starts with a `~` to expand.
    words: Vec<(String, bool)>,
}

impl CopyCommand {
    /// The program as named in the command: `scp`, `rsync`, or an absolute sftp-server path
    /// (one of [`SFTP_SERVERS`]); whoever runs it resolves a bare name in system directories.
    pub fn program(&self) -> &str {
        self.words.first().map_or("", |(w, _)| w.as_str())
    }

    /// The arguments after the program, as the shell would pass them with `$HOME` = `home`:
    /// a leading unquoted `~` (alone or before `/`) becomes `home`.
    pub fn args(&self, home: &str) -> Vec<String> {
        self.words
            .iter()
            .skip(1)
            .map(|(w, tilde)| match w.strip_prefix('~') {
                Some(rest) if *tilde => format!("{home}{rest}"),
                _ => w.clone(),
            })
            .collect()
    }
}

/// [`classify`], with the words to run the copy by (see [`CopyCommand`]).
pub fn parse(command: &str) -> Option<CopyCommand> {
    let words = shell_words(command)?;
    // Globs are the shell's to expand, not ours: such a command is not a copy (a recorded
    // session, which still works). Only `~` and `~/...` are expanded, by [`CopyCommand::args`].
    if words
        .iter()
        .any(|w| w.glob || (w.tilde && w.text != "~" && !w.text.starts_with("~/")))
    {
        return None;
    }
    let (program, args) = words.split_first()?;
    if program.tilde {
        return None;
    }
    let copy = match program.text.as_str() {
        "scp" => scp(args),
        "rsync" => rsync(args),
        p if SFTP_SERVERS.contains(&p) && args.is_empty() => Some(FileCopy::SftpServer),
        _ => None,
    }?;
    Some(CopyCommand {
        copy,
        words: words.into_iter().map(|w| (w.text, w.tilde)).collect(),
    })
}

fn scp(args: &[Word]) -> Option<FileCopy> {
    let mut direction = None;
    let mut rest = args;
    while let Some((w, tail)) = rest.split_first() {
        let t = w.text.as_str();
        if t == "--" {
            rest = tail;
            break;
        }
        let Some(flags) = t.strip_prefix('-') else {
            break;
        };
        if flags.is_empty() {
            return None;
        }
        for f in flags.chars() {
            match f {
                'r' | 'p' | 'd' | 'v' | 'q' => {}
                't' | 'f' if direction.is_none() => {
                    direction = Some(if f == 't' {
                        Direction::Upload
                    } else {
                        Direction::Download
                    });
                }
                _ => return None,
            }
        }
        rest = tail;
    }
    match (direction, rest) {
        (Some(direction), [path]) if !path.text.is_empty() => Some(FileCopy::Scp {
            direction,
            path: path.text.clone(),
        }),
        _ => None,
    }
}

/// rsync server options that turn it into something other than a copy of the named paths.
const RSYNC_REFUSED: &[&str] = &[
    "--daemon",
    "--config",
    "--dparam",
    "--rsh",
    "--rsync-path",
    "--remote-option",
];

fn rsync(args: &[Word]) -> Option<FileCopy> {
    let (first, rest) = args.split_first()?;
    if first.text != "--server" {
        return None;
    }
    let dot = rest.iter().position(|w| w.text == ".")?;
    let (options, paths) = (&rest[..dot], &rest[dot + 1..]);
    let mut direction = Direction::Upload;
    for o in options {
        let t = o.text.as_str();
        if t == "--sender" {
            direction = Direction::Download;
        } else if let Some(long) = t.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or(long);
            if RSYNC_REFUSED
                .iter()
                .any(|r| r.strip_prefix("--") == Some(name))
            {
                return None;
            }
        } else if let Some(short) = t.strip_prefix('-') {
            // `e` takes the rest of the word as its value (the protocol's capabilities).
            let flags = short.split('e').next().unwrap_or(short);
            if short.is_empty() || flags.contains('M') {
                return None;
            }
        } else {
            return None;
        }
    }
    if paths.is_empty() || paths.iter().any(|p| p.text.starts_with('-')) {
        return None;
    }
    Some(FileCopy::Rsync {
        direction,
        path: paths.last().map(|p| p.text.clone()).unwrap_or_default(),
    })
}

/// Whether `command` mentions a copy program with its server-side flags anywhere: not enough
/// to be a copy (that is [`classify`]), but enough to refuse under `ssh_file_copy: false`, so a
/// copy wrapped in a little shell (`cd /tmp && scp -t .`) stays refused.
pub fn mentions_copy(command: &str) -> bool {
    let words: Vec<&str> = command
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '(' | ')' | '`'))
        .filter(|w| !w.is_empty())
        .collect();
    words.iter().enumerate().any(|(i, w)| {
        let w = w.trim_matches(|c| c == '\'' || c == '"');
        let rest = &words[i + 1..];
        match w.rsplit('/').next().unwrap_or(w) {
            "scp" => rest
                .iter()
                .take_while(|w| **w != "--")
                .any(|w| w.starts_with('-') && !w.starts_with("--") && w[1..].contains(['t', 'f'])),
            "rsync" => rest
                .iter()
                .any(|w| w.trim_matches(['\'', '"']) == "--server"),
            "sftp-server" => true,
            _ => false,
        }
    })
}

/// One file carried by legacy scp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScpFile {
    /// The file's name, under the directories sent before it (`dir/sub/name`).
    pub name: String,
    pub size: u64,
}

#[derive(Debug)]
enum State {
    Line,
    Content {
        left: u64,
    },
    Trailer,
    /// The stream stopped making sense; nothing more is read.
    Lost,
}

/// A legacy scp stream that is not one (a shell's output, a wrong header, an endless line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the stream is not the legacy scp protocol")]
pub struct NotScp;

/// The receiving side of a legacy scp stream: nothing but answers, a NUL for yes, or 1 or 2
/// followed by a message line for a warning or an error.
#[derive(Debug, Default)]
pub struct ScpAnswers {
    /// Inside a message: its length so far.
    message: Option<usize>,
}

impl ScpAnswers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn feed(&mut self, data: &[u8]) -> Result<(), NotScp> {
        for &b in data {
            match (self.message, b) {
                (Some(_), b'\n') => self.message = None,
                (Some(n), _) if n >= 64 * 1024 => return Err(NotScp),
                (Some(n), _) => self.message = Some(n + 1),
                (None, 0) => {}
                (None, 1 | 2) => self.message = Some(0),
                (None, _) => return Err(NotScp),
            }
        }
        Ok(())
    }
}

/// The deepest directory nesting a legacy scp stream may open (`D` lines not yet closed by
/// `E`); deeper, it is not a copy this proxy follows (each level is held in memory).
pub const MAX_SCP_DEPTH: usize = 64;

/// A file or directory name as scp sends it: one path component (no `/`, not `..`, as real
/// scp itself refuses on the receiving side) of at most 255 bytes (NAME_MAX), or `None`.
fn file_name(name: &[u8]) -> Option<String> {
    (!name.is_empty() && name.len() <= 255 && !name.contains(&b'/') && name != b"..")
        .then(|| String::from_utf8_lossy(name).into_owned())
}

/// The sending side of a legacy scp stream: `T`, `C`, `D` and `E` lines, file contents, and
/// the NUL after each file.
#[derive(Debug)]
pub struct ScpStream {
    state: State,
    line: Vec<u8>,
    dirs: Vec<String>,
    current: Option<ScpFile>,
    done: Vec<ScpFile>,
}

impl Default for ScpStream {
    fn default() -> Self {
        ScpStream {
            state: State::Line,
            line: Vec::new(),
            dirs: Vec::new(),
            current: None,
            done: Vec::new(),
        }
    }
}

impl ScpStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the next bytes of the stream; an error once they stop being scp (the channel is
    /// then ended: what passes unaudited as a copy must at least be a copy).
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), NotScp> {
        while !data.is_empty() {
            match &mut self.state {
                State::Lost => return Err(NotScp),
                State::Content { left } => {
                    let n = (*left).min(data.len() as u64) as usize;
                    *left -= n as u64;
                    data = &data[n..];
                    if *left == 0 {
                        self.state = State::Trailer;
                    }
                }
                State::Trailer => {
                    data = &data[1..];
                    if let Some(f) = self.current.take() {
                        self.done.push(f);
                    }
                    self.state = State::Line;
                }
                State::Line => {
                    let (chunk, rest, complete) = match data.iter().position(|&b| b == b'\n') {
                        Some(i) => (&data[..i], &data[i + 1..], true),
                        None => (data, &data[data.len()..], false),
                    };
                    data = rest;
                    // Known at a line's first byte, not its last: a shell's prompt has no end.
                    let first = self.line.first().or(chunk.first());
                    if self.line.len() + chunk.len() > 64 * 1024
                        || first.is_some_and(|b| !matches!(b, b'C' | b'D' | b'E' | b'T' | 1 | 2))
                    {
                        self.state = State::Lost;
                        return Err(NotScp);
                    }
                    self.line.extend_from_slice(chunk);
                    if complete {
                        let line = std::mem::take(&mut self.line);
                        self.header(&line);
                    }
                }
            }
        }
        match self.state {
            State::Lost => Err(NotScp),
            _ => Ok(()),
        }
    }

    fn header(&mut self, line: &[u8]) {
        let mut parts = line.get(1..).unwrap_or_default().splitn(3, |b| *b == b' ');
        match line.first() {
            Some(b'C') => {
                let (_mode, size, name) = (parts.next(), parts.next(), parts.next());
                let size = size
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .and_then(|s| s.parse::<u64>().ok());
                match (size, name.and_then(file_name)) {
                    (Some(size), Some(name)) => {
                        let mut path = self.dirs.join("/");
                        if !path.is_empty() {
                            path.push('/');
                        }
                        path.push_str(&name);
                        self.current = Some(ScpFile { name: path, size });
                        self.state = if size == 0 {
                            State::Trailer
                        } else {
                            State::Content { left: size }
                        };
                    }
                    _ => self.state = State::Lost,
                }
            }
            Some(b'D') => match parts.nth(2).and_then(file_name) {
                // Directories opened and never closed are held, so their depth is bounded.
                Some(name) if self.dirs.len() < MAX_SCP_DEPTH => self.dirs.push(name),
                _ => self.state = State::Lost,
            },
            Some(b'E') => {
                self.dirs.pop();
            }
            // Times, warnings and errors carry no file.
            Some(b'T' | 1 | 2) | None => {}
            Some(_) => self.state = State::Lost,
        }
    }

    /// Files completely sent since the last call.
    pub fn take(&mut self) -> Vec<ScpFile> {
        std::mem::take(&mut self.done)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn scp(direction: Direction, path: &str) -> Option<FileCopy> {
        Some(FileCopy::Scp {
            direction,
            path: path.into(),
        })
    }

    fn rsync(direction: Direction, path: &str) -> Option<FileCopy> {
        Some(FileCopy::Rsync {
            direction,
            path: path.into(),
        })
    }

    /// What OpenSSH 9.2's `scp -O`, rsync 3.2 and `sftp -s` send (seen with `-S`/`-e` set
    /// to a script that prints its arguments), and what only looks like them.
    #[test]
    fn only_what_the_real_clients_send_is_a_copy() {
        use Direction::{Download, Upload};
        let table: &[(&str, Option<FileCopy>)] = &[
            ("scp -t /tmp/x", scp(Upload, "/tmp/x")),
            ("scp -r -p -t /tmp/x", scp(Upload, "/tmp/x")),
            ("scp -d -t /tmp/", scp(Upload, "/tmp/")),
            ("scp -v -t /tmp/x", scp(Upload, "/tmp/x")),
            ("scp -r -d -t /tmp", scp(Upload, "/tmp")),
            ("scp -f /tmp/x", scp(Download, "/tmp/x")),
            ("scp -r -f /srv/logs", scp(Download, "/srv/logs")),
            // A glob is the shell's to expand: not a copy, a recorded session.
            ("scp -f /var/log/*.log", None),
            ("scp -f '/var/log/*.log'", scp(Download, "/var/log/*.log")),
            ("scp -f /var/log/\\*.log", scp(Download, "/var/log/*.log")),
            ("scp -t ~", scp(Upload, "~")),
            ("scp -t ~bob/x", None),
            ("scp -t ~+/x", None),
            ("scp -t '~bob'", scp(Upload, "~bob")),
            ("rsync --server -e.LsfxC . x=~/y", None),
            ("rsync --server -e.LsfxC . x:~/y", None),
            ("rsync --server -e.LsfxC . x~/y", rsync(Upload, "x~/y")),
            ("~/scp -t x", None),
            ("scp -t ~/x", scp(Upload, "~/x")),
            ("scp -t -- -dash", scp(Upload, "-dash")),
            ("scp -vt .", scp(Upload, ".")),
            (
                "rsync --server -vlogDtpre.iLsfxCIvu . /tmp/x",
                rsync(Upload, "/tmp/x"),
            ),
            (
                "rsync --server -e.LsfxCIvu . /tmp/x",
                rsync(Upload, "/tmp/x"),
            ),
            (
                "rsync --server --sender -logDtpre.iLsfxCIvu . /etc/hosts",
                rsync(Download, "/etc/hosts"),
            ),
            (
                "rsync --server --sender -e.LsfxCIvu . /a /b",
                rsync(Download, "/b"),
            ),
            (
                "rsync --server -vlogDtpre.iLsfxCIvu . /tmp/with\\ space",
                rsync(Upload, "/tmp/with space"),
            ),
            (
                "rsync --server -logDtprze.iLsfxCIvu --delete . /tmp/it\\'s\\$x",
                rsync(Upload, "/tmp/it's$x"),
            ),
            ("/usr/lib/openssh/sftp-server", Some(FileCopy::SftpServer)),
            // Commands that merely contain a copy are sessions, recorded.
            ("echo x; : rsync --server", None),
            ("echo x; : rsync --server . /tmp", None),
            ("rsync --server . /tmp; sh", None),
            ("scp -t /tmp/x && sh", None),
            ("scp -t /tmp/x | sh", None),
            ("scp -t /tmp/x & sh", None),
            ("scp -t /tmp/x\nsh", None),
            ("scp -t /tmp/x\rsh", None),
            ("scp -t $(sh)", None),
            ("scp -t `sh`", None),
            ("scp -t \"$(sh)\"", None),
            ("scp -t '/tmp/x' > /tmp/y", None),
            ("scp -t /tmp/x #", None),
            ("scp -t /tmp/{a,b}", None),
            ("cd /tmp && /usr/bin/scp -vt .", None),
            ("/usr/bin/scp -t /tmp/x", None),
            ("./scp -t /tmp/x", None),
            ("sh -c 'scp -t /tmp/x'", None),
            ("FOO=1 scp -t /tmp/x", None),
            ("scp -t", None),
            ("scp -t a b", None),
            ("scp -t -f /tmp/x", None),
            ("scp -t -S/tmp/evil /tmp/x", None),
            ("scp --help", None),
            ("scp -t 'x\\' y", None),
            ("scp -t 'unclosed", None),
            ("scp -f *", None),
            ("scp -f -*", None),
            ("rsync --server --daemon --config=/tmp/c . /tmp", None),
            ("rsync --server --config /tmp/c . /tmp", None),
            ("rsync --server -M--foo . /tmp", None),
            ("rsync --server . -x", None),
            ("rsync --server -vlogDtpre.iLsfxCIvu . *", None),
            ("rsync --server --da* . /tmp", None),
            ("rsync --version", None),
            ("rsync --server", None),
            ("/usr/lib/openssh/sftp-server -d /", None),
            ("/tmp/sftp-server", None),
            ("uname -a", None),
            ("", None),
        ];
        for (command, expect) in table {
            assert_eq!(&classify(command), expect, "{command:?}");
        }
    }

    /// What an agent node runs for a copy: the words as the shell would pass them, `~` as the
    /// login's home, nothing a shell would have to do.
    #[test]
    fn a_copy_runs_by_its_words() {
        let c = parse("rsync --server -vlogDtpre.iLsfxCIvu . ~/with\\ space").unwrap();
        assert_eq!(c.program(), "rsync");
        assert_eq!(
            c.args("/home/u"),
            [
                "--server",
                "-vlogDtpre.iLsfxCIvu",
                ".",
                "/home/u/with space"
            ]
        );
        // A quoted `~` stays a `~`.
        let c = parse("scp -r -t -- '~/x'").unwrap();
        assert_eq!(c.args("/home/u"), ["-r", "-t", "--", "~/x"]);
        let c = parse("scp -f ~").unwrap();
        assert_eq!(c.args("/root"), ["-f", "/root"]);
        let c = parse("/usr/lib/openssh/sftp-server").unwrap();
        assert_eq!(c.program(), "/usr/lib/openssh/sftp-server");
        assert!(c.args("/root").is_empty());
        assert_eq!(c.copy, FileCopy::SftpServer);
    }

    #[test]
    fn copies_wrapped_in_shell_are_still_seen_for_refusal() {
        for cmd in [
            "scp -t /tmp/x",
            "cd /tmp && /usr/bin/scp -vt .",
            "echo x; : rsync --server",
            "sh -c 'rsync --server . /tmp'",
            "exec /usr/lib/openssh/sftp-server",
            "true;scp -f /etc/passwd",
        ] {
            assert!(mentions_copy(cmd), "{cmd:?}");
        }
        for cmd in ["uname -a", "scp --help", "rsync --version", "which scp"] {
            assert!(!mentions_copy(cmd), "{cmd:?}");
        }
    }

    #[test]
    fn files_are_read_from_the_sending_side_however_it_is_cut() {
        let stream =
            b"T1 0 1 0\nD0755 0 dir\nC0644 5 a.txt\nhello\0C0600 0 empty\n\0E\nC0644 3 top\nabc\0";
        let expect = vec![
            ScpFile {
                name: "dir/a.txt".into(),
                size: 5,
            },
            ScpFile {
                name: "dir/empty".into(),
                size: 0,
            },
            ScpFile {
                name: "top".into(),
                size: 3,
            },
        ];
        let mut whole = ScpStream::new();
        assert_eq!(whole.feed(stream), Ok(()));
        assert_eq!(whole.take(), expect);
        let mut bytewise = ScpStream::new();
        for b in stream {
            assert_eq!(bytewise.feed(std::slice::from_ref(b)), Ok(()));
        }
        assert_eq!(bytewise.take(), expect);
    }

    #[test]
    fn a_file_cut_short_is_not_reported_and_nonsense_stops_reading() {
        let mut s = ScpStream::new();
        assert_eq!(s.feed(b"C0644 10 big\nonly5"), Ok(()));
        assert!(s.take().is_empty());
        let mut s = ScpStream::new();
        assert_eq!(s.feed(b"Xgarbage\nC0644 1 a\nz\0"), Err(NotScp));
        assert_eq!(s.feed(b"C0644 1 a\nz\0"), Err(NotScp));
        assert!(s.take().is_empty());
        // A line that starts with a multi-byte character is nonsense, not a panic.
        let mut s = ScpStream::new();
        assert_eq!(s.feed("éC0644 1 a\n".as_bytes()), Err(NotScp));
        assert_eq!(s.feed("\u{1F600}\n".as_bytes()), Err(NotScp));
        assert!(s.take().is_empty());
        // A shell's prompt is refused at its first byte, though it never ends its line.
        let mut s = ScpStream::new();
        assert_eq!(s.feed(b"T1 0 1 0\n"), Ok(()));
        assert_eq!(s.feed(b"$"), Err(NotScp));
        // A header line with no end is refused at 64 KiB.
        let mut s = ScpStream::new();
        assert_eq!(s.feed(b"C0644 1 "), Ok(()));
        assert_eq!(s.feed(&[b'a'; 70 * 1024]), Err(NotScp));
    }

    /// Directories opened and never closed cost memory for as long as the stream lasts, and
    /// each file's name joins them all: the depth and each name are bounded.
    #[test]
    fn directory_depth_and_names_are_bounded() {
        let mut s = ScpStream::new();
        for _ in 0..MAX_SCP_DEPTH {
            assert_eq!(s.feed(b"D0755 0 d\n"), Ok(()));
        }
        assert_eq!(s.feed(b"C0644 1 f\nx\0"), Ok(()));
        let deep = s.take();
        assert_eq!(deep.len(), 1);
        assert_eq!(deep[0].name.len(), MAX_SCP_DEPTH * 2 + 1);
        assert_eq!(s.feed(b"D0755 0 d\n"), Err(NotScp));
        assert_eq!(s.feed(b"E\n"), Err(NotScp));
        // Closed directories make room again.
        let mut s = ScpStream::new();
        for _ in 0..3 * MAX_SCP_DEPTH {
            assert_eq!(s.feed(b"D0755 0 d\nE\n"), Ok(()));
        }
        let long = format!("D0755 0 {}\n", "n".repeat(256));
        for bad in [
            long.as_bytes(),
            b"D0755 0 a/b\n",
            b"D0755 0 ..\n",
            b"D0755 0 \n",
            b"C0644 1 ../x\nx\0",
            b"C0644 1 /etc/x\nx\0",
        ] {
            let mut s = ScpStream::new();
            assert_eq!(
                s.feed(bad),
                Err(NotScp),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(s.take().is_empty());
        }
        let mut s = ScpStream::new();
        let most = format!("D0755 0 {}\nC0644 0 .\n\0", "n".repeat(255));
        assert_eq!(s.feed(most.as_bytes()), Ok(()));
        assert_eq!(s.take().len(), 1);
    }

    #[test]
    fn the_receiving_side_sends_only_answers() {
        let mut a = ScpAnswers::new();
        assert_eq!(
            a.feed(b"\0\0\x01scp: warning\n\0\x02scp: /x: No space left\n"),
            Ok(())
        );
        for b in b"\0\x01split\n\0" {
            assert_eq!(a.feed(std::slice::from_ref(b)), Ok(()));
        }
        let mut a = ScpAnswers::new();
        assert_eq!(a.feed(b"\0root@node:~# "), Err(NotScp));
        let mut a = ScpAnswers::new();
        assert_eq!(a.feed(b"\x01"), Ok(()));
        assert_eq!(a.feed(&[b'm'; 70 * 1024]), Err(NotScp));
    }
}
