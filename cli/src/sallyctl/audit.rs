//! `sallyctl audit search` and `audit verify`: the audit log as JSON lines or a table, and the
//! check of its hash chain and signed checkpoints.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use crate::http::Api;
use crate::println;

#[derive(Subcommand)]
pub(super) enum AuditCommand {
    /// Audit events, oldest first, as JSON lines (or a table with --format text). Each result
    /// is checked against the signed chain first (a rewritten one fails the search); results
    /// no checkpoint covers yet are named in a warning on stderr.
    Search {
        /// Only events of this type (`user.login`, `session.start`, ...: every type and its
        /// fields are in docs/audit.md); a type's name from before it was renamed finds it too.
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        user: Option<String>,
        /// Only events naming this node.
        #[arg(long)]
        node: Option<String>,
        /// Only events of this session (its id).
        #[arg(long)]
        session: Option<String>,
        /// How far back, e.g. 1h or 7d.
        #[arg(long)]
        since: Option<String>,
        /// Up to when (inclusive): how long ago, e.g. 1h, or a time, e.g. 2026-01-31T09:00:00Z.
        #[arg(long)]
        until: Option<String>,
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
    },
    /// Check the hash chain and its signed checkpoints; names the first record that was edited
    /// or removed, and how many records are anchored. Anchored records cannot be rewritten by a
    /// database writer unseen; the ones after the last checkpoint (at most a minute's) can, and
    /// whoever holds the data dir's audit-checkpoint.key could sign a rewritten chain.
    Verify {
        /// The checkpoint key's fingerprint (SHA256:...) to insist on, e.g. from
        /// `ssh-keygen -lf <data>/audit-checkpoint.key` when the cluster was set up.
        #[arg(long)]
        key: Option<String>,
    },
}

pub(super) async fn audit(api: &Api, cmd: &AuditCommand) -> Result<ExitCode> {
    match cmd {
        AuditCommand::Search {
            event_type,
            user,
            node,
            session,
            since,
            until,
            limit,
            format,
        } => {
            let since = since
                .as_deref()
                .map(|s| {
                    sallyport_core::duration::parse(s)
                        .map(|d| sallyport_core::unix_now() - d.as_secs() as i64)
                })
                .transpose()
                .map_err(|e| anyhow!("--since: {e}"))?;
            let mut query = vec![format!("limit={limit}")];
            if let Some(t) = event_type {
                query.push(format!("type={}", urlencode(t)));
            }
            if let Some(u) = user {
                query.push(format!("user={}", urlencode(u)));
            }
            if let Some(s) = since {
                query.push(format!("since={s}"));
            }
            if let Some(n) = node {
                query.push(format!("node={}", urlencode(n)));
            }
            if let Some(s) = session {
                query.push(format!("session={}", urlencode(s)));
            }
            if let Some(u) = until {
                query.push(format!("until={}", until_secs(u)?));
            }
            let (events, unanchored_from): (Vec<serde_json::Value>, _) = api
                .get_with_header(
                    &format!("{}?{}", routes::auth::AUDIT, query.join("&")),
                    sallyport_core::audit::UNANCHORED_HEADER,
                )
                .await?;
            let unanchored = unanchored_from
                .and_then(|s| s.parse::<i64>().ok())
                .map(|from| {
                    let n = events
                        .iter()
                        .filter(|e| e["seq"].as_i64().is_some_and(|s| s >= from))
                        .count();
                    (from, n)
                });
            for e in events {
                if *format == Format::Json {
                    println!("{e}");
                } else {
                    let get =
                        |k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
                    let ok = match e.get("success").and_then(|v| v.as_bool()) {
                        Some(true) => "ok",
                        Some(false) => "FAILED",
                        None => "",
                    };
                    println!(
                        "{:>6} {} {:<16} {:<20} {}",
                        e["seq"],
                        get("time"),
                        get("event"),
                        get("user"),
                        ok
                    );
                }
            }
            // After the records (stdout stays what scripts parse), and only for what the
            // search returned: checked to link to the chain head, but no signature covers
            // them yet.
            if let Some((from, n)) = unanchored {
                eprintln!(
                    "warning: records from seq {from} on ({n} of these) are not yet anchored by a signed checkpoint: they link to the chain head, but a database writer could still rewrite them until auth signs one (within its checkpoint_interval)"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify { key } => {
            let v: AuditVerify = api.get(routes::auth::AUDIT_VERIFY).await?;
            if let Some(pin) = key
                && v.checkpoint_key.as_deref() != Some(pin.as_str())
            {
                println!(
                    "audit log NOT VERIFIED: its checkpoints are checked with key {}, not the pinned {pin}",
                    v.checkpoint_key.as_deref().unwrap_or("(none)")
                );
                return Ok(ExitCode::from(crate::EXIT_FAILURE));
            }
            if v.ok {
                println!("audit log intact: {}", v.message);
                Ok(ExitCode::SUCCESS)
            } else {
                println!(
                    "audit log TAMPERED: {} (first bad record: {})",
                    v.message,
                    v.first_bad_seq.unwrap_or(0)
                );
                Ok(ExitCode::from(crate::EXIT_FAILURE))
            }
        }
    }
}

/// `--until`: how long ago (`1h`), or an RFC 3339 time; Unix seconds.
fn until_secs(text: &str) -> Result<i64> {
    if let Ok(d) = sallyport_core::duration::parse(text) {
        return Ok(sallyport_core::unix_now() - d.as_secs() as i64);
    }
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|_| {
            anyhow!("--until: {text:?} is neither a duration such as 1h nor a time such as 2026-01-31T09:00:00Z")
        })
}

pub(super) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
