//! File copies read as they pass, for audit: the SFTP packets (`sftp` events per operation),
//! legacy scp headers (`scp` events per file) and rsync (one `scp` event with the bytes moved).
//! Their bytes are not put in the terminal recording; a stream that can no longer be audited
//! (a protocol violation, a flood) ends its channel, with the reason audited.

use sallyport_core::audit::EventType;
use sallyport_core::scp::{Direction, FileCopy, ScpAnswers, ScpStream};
use sallyport_core::sftp::SftpAudit;
use serde_json::json;

/// What a file copy's bytes are read for.
pub enum CopyAudit {
    Sftp(SftpAudit),
    Scp {
        stream: ScpStream,
        /// The other way: nothing but the receiver's answers.
        answers: ScpAnswers,
        direction: Direction,
        path: String,
    },
    Rsync {
        direction: Direction,
        path: String,
        bytes: u64,
    },
}

impl CopyAudit {
    pub fn new(copy: FileCopy) -> Self {
        match copy {
            FileCopy::Scp { direction, path } => CopyAudit::Scp {
                stream: ScpStream::new(),
                answers: ScpAnswers::new(),
                direction,
                path,
            },
            FileCopy::Rsync { direction, path } => CopyAudit::Rsync {
                direction,
                path,
                bytes: 0,
            },
            FileCopy::SftpServer => CopyAudit::Sftp(SftpAudit::new()),
        }
    }

    /// Reads bytes going `dir` (upload: from the person; download: from the node). Returns the
    /// events completed, or why the stream can no longer be audited.
    pub fn feed(
        &mut self,
        dir: Direction,
        data: &[u8],
    ) -> Result<Vec<(EventType, serde_json::Value)>, String> {
        match self {
            CopyAudit::Sftp(a) => {
                let r = match dir {
                    Direction::Upload => a.client(data),
                    Direction::Download => a.server(data),
                };
                r.map_err(|e| e.to_string())?;
                Ok(a.take().into_iter().map(sftp_event).collect())
            }
            CopyAudit::Scp {
                stream,
                direction,
                path,
                ..
            } if *direction == dir => {
                stream.feed(data).map_err(|e| e.to_string())?;
                Ok(stream
                    .take()
                    .into_iter()
                    .map(|f| {
                        let e = json!({"tool": "scp", "path": path, "file": f.name,
                            "direction": direction.as_str(), "size": f.size});
                        (EventType::Scp, e)
                    })
                    .collect())
            }
            // A command taken for a copy runs unrecorded, so both ways must be the protocol:
            // a shell answering in its place is cut off at its first byte.
            CopyAudit::Scp { answers, .. } => {
                answers.feed(data).map_err(|e| e.to_string())?;
                Ok(vec![])
            }
            CopyAudit::Rsync {
                direction, bytes, ..
            } if *direction == dir => {
                *bytes += data.len() as u64;
                Ok(vec![])
            }
            CopyAudit::Rsync { .. } => Ok(vec![]),
        }
    }

    /// The event that says why this copy's channel was ended: its stream could no longer be
    /// audited (a protocol violation, a flood), so nothing more of it may pass unaudited.
    pub fn aborted(&self, why: &str) -> (EventType, serde_json::Value) {
        match self {
            CopyAudit::Sftp(_) => copy_aborted(why),
            CopyAudit::Scp {
                direction, path, ..
            } => (
                EventType::Scp,
                json!({"tool": "scp", "path": path, "direction": direction.as_str(), "result": why}),
            ),
            CopyAudit::Rsync {
                direction, path, ..
            } => (
                EventType::Scp,
                json!({"tool": "rsync", "path": path, "direction": direction.as_str(), "result": why}),
            ),
        }
    }

    /// The event that says this copy's error output was cut (`why`); the copy itself goes on.
    pub fn stderr_cut(&self, why: &str) -> (EventType, serde_json::Value) {
        match self {
            CopyAudit::Sftp(_) => (
                EventType::Sftp,
                json!({"action": "stderr", "path": "", "bytes": 0, "result": why}),
            ),
            // scp and rsync say what happened in `result`, as when they end.
            _ => self.aborted(why),
        }
    }

    pub fn finish(&mut self, exit_code: Option<i64>) -> Vec<(EventType, serde_json::Value)> {
        match self {
            CopyAudit::Sftp(a) => a.finish().into_iter().map(sftp_event).collect(),
            CopyAudit::Scp { .. } => vec![],
            CopyAudit::Rsync {
                direction,
                path,
                bytes,
            } => vec![(
                EventType::Scp,
                json!({"tool": "rsync", "path": path, "direction": direction.as_str(),
                    "size": *bytes, "exit_code": exit_code}),
            )],
        }
    }
}

fn sftp_event(op: sallyport_core::sftp::Op) -> (EventType, serde_json::Value) {
    let mut e =
        json!({"action": op.action, "path": op.path, "bytes": op.bytes, "result": op.result});
    if let Some(t) = op.target {
        e["target"] = t.into();
    }
    if let Some(m) = op.mode {
        e["mode"] = m.into();
    }
    if let Some(x) = op.extension {
        e["extension"] = x.into();
    }
    (EventType::Sftp, e)
}

/// The event that says why an SFTP channel was ended: see [`CopyAudit::aborted`].
pub fn copy_aborted(why: &str) -> (EventType, serde_json::Value) {
    (
        EventType::Sftp,
        json!({"action": "abort", "path": "", "bytes": 0, "result": why}),
    )
}
