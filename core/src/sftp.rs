//! Reads the SFTP packets passing through a session (draft-ietf-secsh-filexfer-02, which
//! OpenSSH speaks) to audit each file operation: opens for read or write with the bytes moved,
//! removes, renames, mkdir/rmdir, symlinks and attribute changes, each with its result. It does
//! not serve SFTP: the node's own server does, as the login.
//!
//! Every request id is tracked until its reply, so a client cannot make one reply answer two
//! requests: an id reused while its request is pending is a protocol violation, and the stream
//! is [`Broken`] (the caller ends the channel and audits why) rather than an operation lost.
//!
//! Memory is bounded whatever the peer sends: the payload of READ replies and WRITE requests is
//! skipped, never buffered; any other packet larger than [`MAX_PACKET`], or more than
//! [`MAX_PENDING`] unanswered requests, is a [`Broken`] stream, which the caller must treat as
//! "can no longer audit" and close the channel.

use std::collections::HashMap;

/// OpenSSH's sftp-server refuses packets over 256 KiB; allow headroom, no more.
pub const MAX_PACKET: usize = 1024 * 1024;
/// Unanswered requests tracked at once (OpenSSH's client keeps at most a few hundred).
pub const MAX_PENDING: usize = 16 * 1024;
/// Files held open at once.
const MAX_HANDLES: usize = 4096;
/// How much of a WRITE request or DATA reply is read: the fields before the payload.
const PREFIX: usize = 4 + 1 + 4 + (4 + 256) + 8 + 4;

const OPEN: u8 = 3;
const CLOSE: u8 = 4;
const READ: u8 = 5;
const WRITE: u8 = 6;
const SETSTAT: u8 = 9;
const FSETSTAT: u8 = 10;
const REMOVE: u8 = 13;
const MKDIR: u8 = 14;
const RMDIR: u8 = 15;
const RENAME: u8 = 18;
const SYMLINK: u8 = 20;
/// Draft 06 and later; OpenSSH speaks 3 and uses `hardlink@openssh.com`, but a server may not.
const LINK: u8 = 21;
const STATUS: u8 = 101;
const HANDLE: u8 = 102;
const DATA: u8 = 103;
const EXTENDED: u8 = 200;
const EXTENDED_REPLY: u8 = 201;

const FLAG_READ: u32 = 1;
const FLAG_WRITE: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken(pub String);

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unreadable SFTP stream: {}", self.0)
    }
}

/// One audited operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// `open`, `remove`, `rename`, `mkdir`, `rmdir`, `symlink`, `hardlink`, `setstat`, or
    /// `extended` (any other extension request, named in `extension`).
    pub action: &'static str,
    /// The file the operation is on; for `setstat` of an open file, the path it was opened as.
    pub path: String,
    /// The second path of `rename`, `symlink` and `hardlink`.
    pub target: Option<String>,
    /// For `open`: `read`, `write` or `read-write`.
    pub mode: Option<&'static str>,
    /// For `open`: bytes read plus bytes written through the handle.
    pub bytes: u64,
    /// `ok`, the server's error message, or `incomplete` (the session ended with it open).
    pub result: String,
    /// For `extended`: the extension's name as the client sent it (e.g. `fsync@openssh.com`).
    pub extension: Option<String>,
}

#[derive(Debug)]
enum Pending {
    Open {
        path: String,
        mode: &'static str,
    },
    Simple(Op),
    Read {
        handle: Vec<u8>,
    },
    Write {
        handle: Vec<u8>,
        len: u64,
    },
    Close {
        handle: Vec<u8>,
    },
    /// A request that is not audited (stat, readdir, …): tracked only so that its reply is
    /// matched to it and no other.
    Untracked,
}

#[derive(Debug)]
struct OpenFile {
    path: String,
    mode: &'static str,
    bytes: u64,
    /// The first failed read or write (a full disk, say): the file's result, whatever the
    /// close says.
    error: Option<String>,
}

/// Called with each packet's body (or its prefix) and full length.
type PacketFn<'a> = dyn FnMut(&[u8], usize) -> Result<(), Broken> + 'a;

/// Splits a byte stream into packets without buffering bulk payloads.
#[derive(Debug, Default)]
struct Framer {
    buf: Vec<u8>,
    skip: usize,
}

impl Framer {
    /// Feeds `data`; calls `each(body, full_len)` with each packet's body (after the length
    /// field; only its prefix for `bulk` types) and its full body length.
    fn feed(&mut self, mut data: &[u8], bulk: u8, each: &mut PacketFn<'_>) -> Result<(), Broken> {
        loop {
            if self.skip > 0 {
                if data.is_empty() {
                    break;
                }
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            if self.buf.len() < 5 {
                if data.is_empty() {
                    break;
                }
                let n = (5 - self.buf.len()).min(data.len());
                self.buf.extend_from_slice(&data[..n]);
                data = &data[n..];
                continue;
            }
            let len =
                u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            if len == 0 {
                return Err(Broken("empty packet".into()));
            }
            let total = 4 + len;
            let need = if self.buf[4] == bulk {
                total.min(PREFIX)
            } else if len > MAX_PACKET {
                return Err(Broken(format!("a {len}-byte packet")));
            } else {
                total
            };
            if self.buf.len() < need {
                if data.is_empty() {
                    break;
                }
                let n = (need - self.buf.len()).min(data.len());
                self.buf.extend_from_slice(&data[..n]);
                data = &data[n..];
                continue;
            }
            self.skip = total - need;
            let mut body = std::mem::take(&mut self.buf);
            let r = each(&body[4..], len);
            body.clear();
            self.buf = body;
            r?;
        }
        Ok(())
    }
}

/// A cursor over a packet body.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        let (b, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_be_bytes(*b))
    }
    fn u64(&mut self) -> Option<u64> {
        let (b, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_be_bytes(*b))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return None;
        }
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(b)
    }
    fn string(&mut self) -> Option<String> {
        self.bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// Both directions of one SFTP channel.
#[derive(Debug, Default)]
pub struct SftpAudit {
    from_client: Framer,
    from_server: Framer,
    pending: HashMap<u32, Pending>,
    handles: HashMap<Vec<u8>, OpenFile>,
    done: Vec<Op>,
}

impl Op {
    fn new(action: &'static str, path: String) -> Self {
        Op {
            action,
            path,
            target: None,
            mode: None,
            bytes: 0,
            result: String::new(),
            extension: None,
        }
    }
}

fn simple(action: &'static str, path: String, target: Option<String>) -> Pending {
    Pending::Simple(Op {
        target,
        ..Op::new(action, path)
    })
}

impl SftpAudit {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the client sent toward the server.
    pub fn client(&mut self, data: &[u8]) -> Result<(), Broken> {
        let mut framer = std::mem::take(&mut self.from_client);
        let r = framer.feed(data, WRITE, &mut |body, len| self.request(body, len));
        self.from_client = framer;
        r
    }

    /// Bytes the server sent toward the client.
    pub fn server(&mut self, data: &[u8]) -> Result<(), Broken> {
        let mut framer = std::mem::take(&mut self.from_server);
        let r = framer.feed(data, DATA, &mut |body, len| self.reply(body, len));
        self.from_server = framer;
        r
    }

    /// Operations completed since the last call.
    pub fn take(&mut self) -> Vec<Op> {
        std::mem::take(&mut self.done)
    }

    /// The session ended: files still open are reported as `incomplete`.
    pub fn finish(&mut self) -> Vec<Op> {
        let mut ops = self.take();
        for (_, f) in self.handles.drain() {
            ops.push(Op {
                action: "open",
                path: f.path,
                target: None,
                mode: Some(f.mode),
                bytes: f.bytes,
                result: f.error.unwrap_or_else(|| "incomplete".into()),
                extension: None,
            });
        }
        ops
    }

    fn request(&mut self, body: &[u8], full_len: usize) -> Result<(), Broken> {
        let mut c = Cur(body);
        let kind = c.u8().ok_or_else(|| Broken("truncated packet".into()))?;
        if kind == 1 {
            return Ok(()); // INIT
        }
        let id = c.u32().ok_or_else(|| Broken("truncated request".into()))?;
        let bad = || Broken(format!("malformed request of type {kind}"));
        let pending = match kind {
            OPEN => {
                let path = c.string().ok_or_else(bad)?;
                let flags = c.u32().ok_or_else(bad)?;
                let mode = match (flags & FLAG_READ != 0, flags & FLAG_WRITE != 0) {
                    (true, true) => "read-write",
                    (false, true) => "write",
                    _ => "read",
                };
                Some(Pending::Open { path, mode })
            }
            CLOSE => Some(Pending::Close {
                handle: c.bytes().ok_or_else(bad)?.to_vec(),
            }),
            READ => Some(Pending::Read {
                handle: c.bytes().ok_or_else(bad)?.to_vec(),
            }),
            WRITE => {
                let handle = c.bytes().ok_or_else(bad)?.to_vec();
                let _offset = c.u64().ok_or_else(bad)?;
                // The declared payload length, bounded by what the packet holds.
                let declared = c.u32().ok_or_else(bad)? as u64;
                let room = full_len.saturating_sub(1 + 4 + 4 + handle.len() + 8 + 4) as u64;
                Some(Pending::Write {
                    handle,
                    len: declared.min(room),
                })
            }
            SETSTAT => Some(simple("setstat", c.string().ok_or_else(bad)?, None)),
            FSETSTAT => {
                let handle = c.bytes().ok_or_else(bad)?;
                Some(simple("setstat", self.handle_path(handle), None))
            }
            REMOVE => Some(simple("remove", c.string().ok_or_else(bad)?, None)),
            MKDIR => Some(simple("mkdir", c.string().ok_or_else(bad)?, None)),
            RMDIR => Some(simple("rmdir", c.string().ok_or_else(bad)?, None)),
            RENAME => {
                let from = c.string().ok_or_else(bad)?;
                Some(simple("rename", from, Some(c.string().ok_or_else(bad)?)))
            }
            SYMLINK => {
                // OpenSSH sends (target, link) — the reverse of the draft; keep its order.
                let a = c.string().ok_or_else(bad)?;
                let b = c.string().ok_or_else(bad)?;
                Some(simple("symlink", b, Some(a)))
            }
            LINK => {
                let link = c.string().ok_or_else(bad)?;
                let existing = c.string().ok_or_else(bad)?;
                let symbolic = c.u8().ok_or_else(bad)? != 0;
                let action = if symbolic { "symlink" } else { "hardlink" };
                Some(simple(action, link, Some(existing)))
            }
            EXTENDED => {
                let name = c.string().ok_or_else(bad)?;
                match name.as_str() {
                    "posix-rename@openssh.com" => {
                        let from = c.string().ok_or_else(bad)?;
                        Some(simple("rename", from, Some(c.string().ok_or_else(bad)?)))
                    }
                    "hardlink@openssh.com" => {
                        let from = c.string().ok_or_else(bad)?;
                        Some(simple("hardlink", c.string().ok_or_else(bad)?, Some(from)))
                    }
                    "lsetstat@openssh.com" => {
                        Some(simple("setstat", c.string().ok_or_else(bad)?, None))
                    }
                    "fsetstat@openssh.com" => {
                        let handle = c.bytes().ok_or_else(bad)?;
                        Some(simple("setstat", self.handle_path(handle), None))
                    }
                    // Every other extension is audited by name, with its first argument: a
                    // path for most (statvfs, expand-path), a handle for some (fsync), shown as
                    // the path it was opened as.
                    _ => {
                        let path = match c.bytes() {
                            Some(b) if self.handles.contains_key(b) => self.handle_path(b),
                            Some(b) => String::from_utf8_lossy(b).into_owned(),
                            None => String::new(),
                        };
                        Some(Pending::Simple(Op {
                            extension: Some(name),
                            ..Op::new("extended", path)
                        }))
                    }
                }
            }
            _ => None,
        };
        if self.pending.contains_key(&id) {
            return Err(Broken(format!(
                "request id {id} reused while its request is pending"
            )));
        }
        if self.pending.len() >= MAX_PENDING {
            return Err(Broken("too many unanswered requests".into()));
        }
        self.pending
            .insert(id, pending.unwrap_or(Pending::Untracked));
        Ok(())
    }

    /// The path an open handle was opened as, or the handle itself (hex) if unknown.
    fn handle_path(&self, handle: &[u8]) -> String {
        match self.handles.get(handle) {
            Some(f) => f.path.clone(),
            None => handle.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    fn reply(&mut self, body: &[u8], full_len: usize) -> Result<(), Broken> {
        let mut c = Cur(body);
        let kind = c.u8().ok_or_else(|| Broken("truncated packet".into()))?;
        if kind == 2 {
            return Ok(()); // VERSION
        }
        let id = c.u32().ok_or_else(|| Broken("truncated reply".into()))?;
        let Some(pending) = self.pending.remove(&id) else {
            return Ok(());
        };
        let bad = || Broken(format!("malformed reply of type {kind}"));
        let mut eof = false;
        let status = if kind == STATUS {
            let code = c.u32().ok_or_else(bad)?;
            eof = code == 1;
            let message = c.string().unwrap_or_default();
            Some(if code == 0 {
                "ok".to_string()
            } else if message.is_empty() {
                format!("error {code}")
            } else {
                message
            })
        } else {
            None
        };
        match pending {
            Pending::Open { path, mode } => {
                if kind == HANDLE {
                    let handle = c.bytes().ok_or_else(bad)?.to_vec();
                    if self.handles.len() >= MAX_HANDLES {
                        return Err(Broken("too many open files".into()));
                    }
                    self.handles.insert(
                        handle,
                        OpenFile {
                            path,
                            mode,
                            bytes: 0,
                            error: None,
                        },
                    );
                } else {
                    self.done.push(Op {
                        action: "open",
                        path,
                        target: None,
                        mode: Some(mode),
                        bytes: 0,
                        result: status.unwrap_or_else(|| "unexpected reply".into()),
                        extension: None,
                    });
                }
            }
            Pending::Simple(mut op) => {
                op.result = match status {
                    Some(s) => s,
                    // Extensions that answer with data (statvfs, limits, …) succeeded.
                    None if kind == EXTENDED_REPLY => "ok".into(),
                    None => "unexpected reply".into(),
                };
                self.done.push(op);
            }
            Pending::Read { handle } => {
                // EOF is how every download ends; any other status is a failed read.
                if let (Some(s), Some(f)) = (&status, self.handles.get_mut(&handle))
                    && s != "ok"
                    && !eof
                {
                    f.error.get_or_insert(s.clone());
                }
                if kind == DATA {
                    let declared = c.u32().ok_or_else(bad)? as u64;
                    let room = full_len.saturating_sub(1 + 4 + 4) as u64;
                    if let Some(f) = self.handles.get_mut(&handle) {
                        f.bytes += declared.min(room);
                    }
                }
            }
            Pending::Write { handle, len } => {
                if let Some(f) = self.handles.get_mut(&handle) {
                    match status {
                        Some(s) if s == "ok" => f.bytes += len,
                        Some(s) => {
                            f.error.get_or_insert(s);
                        }
                        None => {
                            f.error.get_or_insert_with(|| "unexpected reply".into());
                        }
                    }
                }
            }
            Pending::Close { handle } => {
                if let Some(f) = self.handles.remove(&handle) {
                    let closed = status.unwrap_or_else(|| "unexpected reply".into());
                    self.done.push(Op {
                        action: "open",
                        path: f.path,
                        target: None,
                        mode: Some(f.mode),
                        bytes: f.bytes,
                        result: f.error.unwrap_or(closed),
                        extension: None,
                    });
                }
            }
            Pending::Untracked => {}
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn packet(kind: u8, id: Option<u32>, fields: &[&[u8]]) -> Vec<u8> {
        let mut body = vec![kind];
        if let Some(id) = id {
            body.extend_from_slice(&id.to_be_bytes());
        }
        for f in fields {
            body.extend_from_slice(f);
        }
        let mut p = (body.len() as u32).to_be_bytes().to_vec();
        p.extend(body);
        p
    }
    fn s(b: &[u8]) -> Vec<u8> {
        let mut v = (b.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(b);
        v
    }
    fn u32b(n: u32) -> Vec<u8> {
        n.to_be_bytes().to_vec()
    }

    /// Feeds `data` one byte at a time, then in one piece: the result must not depend on how
    /// the stream is cut.
    fn both_ways(client: &[Vec<u8>], server: &[Vec<u8>]) -> Vec<Op> {
        let mut results = vec![];
        for bytewise in [true, false] {
            let mut a = SftpAudit::new();
            for (c, sv) in client.iter().zip(server) {
                if bytewise {
                    for b in c {
                        a.client(std::slice::from_ref(b)).unwrap();
                    }
                    for b in sv {
                        a.server(std::slice::from_ref(b)).unwrap();
                    }
                } else {
                    a.client(c).unwrap();
                    a.server(sv).unwrap();
                }
            }
            results.push(a.finish());
        }
        assert_eq!(results[0], results[1]);
        results.pop().unwrap()
    }

    #[test]
    fn an_upload_is_one_open_for_write_with_its_bytes() {
        let h = b"h1";
        let payload = vec![7u8; 100_000];
        let mut write = s(h);
        write.extend_from_slice(&0u64.to_be_bytes());
        write.extend(s(&payload));
        let client = vec![
            packet(1, None, &[&u32b(3)]),
            packet(OPEN, Some(1), &[&s(b"/tmp/up"), &u32b(0x1a), &u32b(0)]),
            packet(WRITE, Some(2), &[&write]),
            packet(CLOSE, Some(3), &[&s(h)]),
        ];
        let server = vec![
            packet(2, None, &[&u32b(3)]),
            packet(HANDLE, Some(1), &[&s(h)]),
            packet(STATUS, Some(2), &[&u32b(0), &s(b"Success"), &s(b"")]),
            packet(STATUS, Some(3), &[&u32b(0), &s(b"Success"), &s(b"")]),
        ];
        let ops = both_ways(&client, &server);
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert_eq!(ops[0].action, "open");
        assert_eq!(ops[0].path, "/tmp/up");
        assert_eq!(ops[0].mode, Some("write"));
        assert_eq!(ops[0].bytes, 100_000);
        assert_eq!(ops[0].result, "ok");
    }

    #[test]
    fn a_download_counts_data_and_failures_keep_the_servers_message() {
        let h = b"hh";
        let client = vec![
            packet(OPEN, Some(1), &[&s(b"/etc/hostname"), &u32b(1), &u32b(0)]),
            packet(READ, Some(2), &[&s(h), &0u64.to_be_bytes(), &u32b(32768)]),
            packet(CLOSE, Some(3), &[&s(h)]),
            packet(REMOVE, Some(4), &[&s(b"/root/x")]),
            packet(
                EXTENDED,
                Some(5),
                &[&s(b"posix-rename@openssh.com"), &s(b"/a"), &s(b"/b")],
            ),
        ];
        let server = vec![
            packet(HANDLE, Some(1), &[&s(h)]),
            packet(DATA, Some(2), &[&s(&[1u8; 12])]),
            packet(STATUS, Some(3), &[&u32b(0), &s(b""), &s(b"")]),
            packet(
                STATUS,
                Some(4),
                &[&u32b(3), &s(b"Permission denied"), &s(b"")],
            ),
            packet(STATUS, Some(5), &[&u32b(0), &s(b""), &s(b"")]),
        ];
        let ops = both_ways(&client, &server);
        assert_eq!(ops.len(), 3, "{ops:?}");
        assert_eq!((ops[0].mode, ops[0].bytes), (Some("read"), 12));
        assert_eq!(
            (ops[1].action, ops[1].result.as_str()),
            ("remove", "Permission denied")
        );
        assert_eq!(ops[2].action, "rename");
        assert_eq!(ops[2].target.as_deref(), Some("/b"));
    }

    #[test]
    fn a_write_that_failed_makes_the_file_a_failure_whatever_close_says() {
        let h = b"h";
        let mut w = s(h);
        w.extend_from_slice(&0u64.to_be_bytes());
        w.extend(s(&[1u8; 10]));
        let client = vec![
            packet(OPEN, Some(1), &[&s(b"/full/x"), &u32b(0x1a), &u32b(0)]),
            packet(WRITE, Some(2), &[&w]),
            packet(WRITE, Some(3), &[&w]),
            packet(CLOSE, Some(4), &[&s(h)]),
        ];
        let server = vec![
            packet(HANDLE, Some(1), &[&s(h)]),
            packet(STATUS, Some(2), &[&u32b(0), &s(b""), &s(b"")]),
            packet(STATUS, Some(3), &[&u32b(4), &s(b"Failure"), &s(b"")]),
            packet(STATUS, Some(4), &[&u32b(0), &s(b""), &s(b"")]),
        ];
        let ops = both_ways(&client, &server);
        assert_eq!(ops[0].result, "Failure");
        assert_eq!(ops[0].bytes, 10);
    }

    #[test]
    fn a_file_left_open_is_incomplete_and_floods_are_refused() {
        let mut a = SftpAudit::new();
        a.client(&packet(OPEN, Some(1), &[&s(b"/x"), &u32b(2), &u32b(0)]))
            .unwrap();
        a.server(&packet(HANDLE, Some(1), &[&s(b"h")])).unwrap();
        let ops = a.finish();
        assert_eq!(ops[0].result, "incomplete");
        // A huge non-bulk packet is refused before it is buffered.
        let mut a = SftpAudit::new();
        let mut p = u32b(50_000_000);
        p.push(OPEN);
        assert!(a.client(&p).is_err());
        // A bulk packet of any size is skipped, not buffered.
        let mut a = SftpAudit::new();
        let mut p = u32b(50_000_000);
        p.push(WRITE);
        a.client(&p).unwrap();
        a.client(&vec![0u8; 1 << 20]).unwrap();
        assert!(a.from_client.buf.len() <= PREFIX);
        // Requests nobody answers cannot pile up without bound.
        let mut a = SftpAudit::new();
        let r = (0..=MAX_PENDING as u32)
            .try_for_each(|i| a.client(&packet(REMOVE, Some(i), &[&s(b"/f")])));
        assert!(r.is_err());
    }

    #[test]
    fn a_request_id_reused_while_pending_breaks_the_stream() {
        // The second request would otherwise take the first one's reply, and one of the two
        // operations would go unaudited.
        let mut a = SftpAudit::new();
        a.client(&packet(REMOVE, Some(7), &[&s(b"/etc/important")]))
            .unwrap();
        let e = a
            .client(&packet(MKDIR, Some(7), &[&s(b"/tmp/decoy"), &u32b(0)]))
            .unwrap_err();
        assert_eq!(e.0, "request id 7 reused while its request is pending");
        // Requests we do not audit (here STAT, 17) are tracked too: reusing their id is the
        // same violation.
        let mut a = SftpAudit::new();
        a.client(&packet(17, Some(1), &[&s(b"/x")])).unwrap();
        assert!(a.client(&packet(REMOVE, Some(1), &[&s(b"/y")])).is_err());
        // Once answered, an id may be used again, as clients do.
        let mut a = SftpAudit::new();
        a.client(&packet(17, Some(1), &[&s(b"/x")])).unwrap();
        a.server(&packet(STATUS, Some(1), &[&u32b(0), &s(b""), &s(b"")]))
            .unwrap();
        a.client(&packet(REMOVE, Some(1), &[&s(b"/y")])).unwrap();
        a.server(&packet(STATUS, Some(1), &[&u32b(0), &s(b""), &s(b"")]))
            .unwrap();
        let ops = a.finish();
        assert_eq!(
            (ops.len(), ops[0].action, ops[0].path.as_str()),
            (1, "remove", "/y")
        );
    }

    #[test]
    fn attribute_changes_links_and_extensions_are_audited_by_name() {
        let h = b"fh";
        let client = vec![
            packet(OPEN, Some(1), &[&s(b"/srv/app.sh"), &u32b(2), &u32b(0)]),
            // fsetstat on the open handle: reported with the path it was opened as.
            packet(FSETSTAT, Some(2), &[&s(h), &u32b(4), &u32b(0o4755)]),
            packet(SETSTAT, Some(3), &[&s(b"/srv/conf"), &u32b(0)]),
            packet(SYMLINK, Some(4), &[&s(b"/etc/shadow"), &s(b"/tmp/l")]),
            packet(LINK, Some(5), &[&s(b"/tmp/h"), &s(b"/etc/passwd"), &[0]]),
            packet(
                EXTENDED,
                Some(6),
                &[
                    &s(b"hardlink@openssh.com"),
                    &s(b"/etc/hosts"),
                    &s(b"/tmp/h2"),
                ],
            ),
            packet(
                EXTENDED,
                Some(7),
                &[&s(b"lsetstat@openssh.com"), &s(b"/tmp/l"), &u32b(0)],
            ),
            packet(
                EXTENDED,
                Some(8),
                &[&s(b"statvfs@openssh.com"), &s(b"/home")],
            ),
            packet(EXTENDED, Some(9), &[&s(b"fsync@openssh.com"), &s(h)]),
            packet(CLOSE, Some(10), &[&s(h)]),
        ];
        let ok = |id| packet(STATUS, Some(id), &[&u32b(0), &s(b""), &s(b"")]);
        let server = vec![
            packet(HANDLE, Some(1), &[&s(h)]),
            ok(2),
            ok(3),
            packet(
                STATUS,
                Some(4),
                &[&u32b(3), &s(b"Permission denied"), &s(b"")],
            ),
            ok(5),
            ok(6),
            ok(7),
            packet(EXTENDED_REPLY, Some(8), &[&[0u8; 88]]),
            ok(9),
            ok(10),
        ];
        let ops = both_ways(&client, &server);
        let seen: Vec<_> = ops
            .iter()
            .map(|o| {
                (
                    o.action,
                    o.path.as_str(),
                    o.target.as_deref(),
                    o.extension.as_deref(),
                    o.result.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                ("setstat", "/srv/app.sh", None, None, "ok"),
                ("setstat", "/srv/conf", None, None, "ok"),
                (
                    "symlink",
                    "/tmp/l",
                    Some("/etc/shadow"),
                    None,
                    "Permission denied"
                ),
                ("hardlink", "/tmp/h", Some("/etc/passwd"), None, "ok"),
                ("hardlink", "/tmp/h2", Some("/etc/hosts"), None, "ok"),
                ("setstat", "/tmp/l", None, None, "ok"),
                ("extended", "/home", None, Some("statvfs@openssh.com"), "ok"),
                (
                    "extended",
                    "/srv/app.sh",
                    None,
                    Some("fsync@openssh.com"),
                    "ok"
                ),
                ("open", "/srv/app.sh", None, None, "ok"),
            ]
        );
    }
}
