//! `sally recordings ls` and `sally play`: recorded sessions, listed and replayed through one
//! `core::terminal::Filter` so a recording cannot act on its viewer's terminal.

use anyhow::Result;
use clap::Subcommand;
use sallyport_core::api::*;
use sallyport_core::routes;

use super::Format;
use crate::println;
use crate::profile::Profile;

#[derive(Subcommand)]
pub(super) enum RecordingsCommand {
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

pub(super) async fn recordings(format: Format) -> Result<()> {
    let p = Profile::require()?;
    let list: Vec<SessionInfo> = crate::http::user_api(&p)?
        .get(routes::auth::SESSIONS)
        .await?;
    if format == Format::Json {
        let v: Vec<serde_json::Value> = list
            .iter()
            .map(|s| {
                serde_json::json!({"session_id": s.session_id, "user": s.user, "login": s.login, "node": s.node,
                    "start": s.start, "end": s.end, "exit_code": s.exit_code, "status": s.status, "kind": s.kind, "command": s.command})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{:<36} {:<12} {:<10} {:<16} {:<20} {:<5} {:<10} COMMAND",
            "SESSION", "USER", "LOGIN", "NODE", "START", "EXIT", "STATUS"
        );
        for s in &list {
            let code = s
                .exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into());
            // Every field a user or a node chose is shown with its control bytes escaped: a
            // command such as `echo \e]52;…` must not act on the terminal listing it.
            let esc = sallyport_core::terminal::escape_controls;
            println!(
                "{:<36} {:<12} {:<10} {:<16} {:<20} {:<5} {:<10} {}",
                esc(&s.session_id),
                esc(&s.user),
                esc(&s.login),
                esc(&s.node),
                s.start,
                code,
                esc(s.status.as_str()),
                s.command.as_deref().map_or("(shell)".into(), esc)
            );
        }
    }
    Ok(())
}

pub(super) async fn play(id: &str, speed: f64, format: Option<&str>) -> Result<()> {
    let p = Profile::require()?;
    let api = crate::http::user_api(&p)?;
    // Read as it arrives, never whole: a recording may be a GiB.
    let mut body = api.get_body(&routes::auth::session_recording(id)).await?;
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    if format == Some("asciicast") {
        while let Some(chunk) = body.chunk().await? {
            out.write_all(&chunk)?;
        }
        out.flush()?;
        return Ok(());
    }
    let speed = if speed > 0.0 { speed } else { 1.0 };
    let mut last = 0.0f64;
    // One filter for the whole replay: a sequence split across two events is still caught.
    let mut filter = sallyport_core::terminal::Filter::new();
    let mut shown = String::new();
    let mut header = true;
    while let Some(line) = body.line().await? {
        if std::mem::take(&mut header) {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<(f64, String, String)>(&line) else {
            continue;
        };
        if ev.1 != "o" {
            continue;
        }
        if format.is_none() {
            let wait = ((ev.0 - last) / speed).clamp(0.0, 5.0);
            if wait > 0.0 {
                out.flush()?;
                std::thread::sleep(std::time::Duration::from_secs_f64(wait));
            }
            last = ev.0;
        }
        shown.clear();
        filter.feed(&ev.2, &mut shown);
        out.write_all(shown.as_bytes())?;
    }
    // A replay cut short may leave colours or a hidden cursor behind on the viewer's terminal.
    if format.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        out.write_all(sallyport_core::terminal::RESET.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}
