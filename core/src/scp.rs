//! File copies that run as commands: which commands are copies (legacy `scp -t/-f`,
//! `rsync --server`, a direct `sftp-server`), for the `ssh_file_copy` role option, and the
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

fn base(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn unquote(word: &str) -> String {
    word.trim_matches(|c| c == '\'' || c == '"').to_string()
}

/// Whether `command` is a file copy. Errs on the side of yes: any word that is one of the copy
/// programs with its server-side flags counts, wherever it stands in the command.
pub fn classify(command: &str) -> Option<FileCopy> {
    let words: Vec<&str> = command.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        let rest = &words[i + 1..];
        let path = || {
            rest.iter()
                .rev()
                .find(|w| !w.starts_with('-'))
                .map(|w| unquote(w))
                .unwrap_or_default()
        };
        match base(w) {
            "scp" => {
                let flag = |f: char| {
                    rest.iter()
                        .take_while(|w| **w != "--")
                        .any(|w| w.starts_with('-') && !w.starts_with("--") && w[1..].contains(f))
                };
                let direction = if flag('t') {
                    Direction::Upload
                } else if flag('f') {
                    Direction::Download
                } else {
                    continue;
                };
                return Some(FileCopy::Scp {
                    direction,
                    path: path(),
                });
            }
            "rsync" if rest.contains(&"--server") => {
                let direction = if rest.contains(&"--sender") {
                    Direction::Download
                } else {
                    Direction::Upload
                };
                return Some(FileCopy::Rsync {
                    direction,
                    path: path(),
                });
            }
            "sftp-server" => return Some(FileCopy::SftpServer),
            _ => {}
        }
    }
    None
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

    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match &mut self.state {
                State::Lost => return,
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
                    if self.line.len() + chunk.len() > 64 * 1024 {
                        self.state = State::Lost;
                        return;
                    }
                    self.line.extend_from_slice(chunk);
                    if complete {
                        let line =
                            String::from_utf8_lossy(&std::mem::take(&mut self.line)).into_owned();
                        self.header(&line);
                    }
                }
            }
        }
    }

    fn header(&mut self, line: &str) {
        // Not `line[1..]`: the first character may be more than one byte.
        let mut parts = line.get(1..).unwrap_or("").splitn(3, ' ');
        match line.as_bytes().first() {
            Some(b'C') => {
                let (_mode, size, name) = (parts.next(), parts.next(), parts.next());
                match (size.and_then(|s| s.parse::<u64>().ok()), name) {
                    (Some(size), Some(name)) => {
                        let mut path = self.dirs.join("/");
                        if !path.is_empty() {
                            path.push('/');
                        }
                        path.push_str(name);
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
            Some(b'D') => {
                let name = parts.nth(2).unwrap_or_default();
                self.dirs.push(name.to_string());
            }
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

    #[test]
    fn copies_are_recognised_wherever_they_stand() {
        assert_eq!(
            classify("scp -t -- /tmp/x"),
            Some(FileCopy::Scp {
                direction: Direction::Upload,
                path: "/tmp/x".into()
            })
        );
        assert_eq!(
            classify("scp -r -p -f -- /srv/logs"),
            Some(FileCopy::Scp {
                direction: Direction::Download,
                path: "/srv/logs".into()
            })
        );
        assert!(matches!(
            classify("cd /tmp && /usr/bin/scp -vt ."),
            Some(FileCopy::Scp {
                direction: Direction::Upload,
                ..
            })
        ));
        assert_eq!(
            classify("rsync --server --sender -vlogDtpre.iLsfxCIvu . /etc/hosts"),
            Some(FileCopy::Rsync {
                direction: Direction::Download,
                path: "/etc/hosts".into()
            })
        );
        assert!(matches!(
            classify("rsync --server -vlogDtpre.iLsfxCIvu . /tmp/d/"),
            Some(FileCopy::Rsync {
                direction: Direction::Upload,
                ..
            })
        ));
        assert_eq!(
            classify("/usr/lib/openssh/sftp-server"),
            Some(FileCopy::SftpServer)
        );
        assert_eq!(classify("scp --help"), None);
        assert_eq!(classify("uname -a"), None);
        assert_eq!(classify("rsync --version"), None);
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
        whole.feed(stream);
        assert_eq!(whole.take(), expect);
        let mut bytewise = ScpStream::new();
        for b in stream {
            bytewise.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytewise.take(), expect);
    }

    #[test]
    fn a_file_cut_short_is_not_reported_and_nonsense_stops_reading() {
        let mut s = ScpStream::new();
        s.feed(b"C0644 10 big\nonly5");
        assert!(s.take().is_empty());
        let mut s = ScpStream::new();
        s.feed(b"Xgarbage\nC0644 1 a\nz\0");
        assert!(s.take().is_empty());
        // A line that starts with a multi-byte character is nonsense, not a panic.
        let mut s = ScpStream::new();
        s.feed("éC0644 1 a\n".as_bytes());
        s.feed("\u{1F600}\n".as_bytes());
        assert!(s.take().is_empty());
    }
}
