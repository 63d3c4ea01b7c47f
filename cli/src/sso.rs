//! The loopback end of `sally login --auth=NAME`: a one-shot HTTP listener on 127.0.0.1 that
//! the browser reaches after signing in, carrying either a response code (redeemed with the
//! client key only this process knows) or the reason the login failed.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the browser brought back.
pub enum Outcome {
    Response(String),
    Error(String),
}

pub struct Listener {
    listener: TcpListener,
    pub redirect_url: String,
}

impl Listener {
    pub async fn bind() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen on 127.0.0.1 for the sign-in")?;
        let port = listener.local_addr()?.port();
        Ok(Listener {
            listener,
            redirect_url: format!("http://127.0.0.1:{port}/callback"),
        })
    }

    /// Waits (up to `timeout`) for the browser's request to `/callback`.
    pub async fn wait(self, timeout: Duration) -> Result<Outcome> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (mut tcp, _) = tokio::time::timeout_at(deadline, self.listener.accept())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "the sign-in did not come back within {} s; run `sally login` again",
                        timeout.as_secs()
                    )
                })??;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 2048];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
                let n = match tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut chunk))
                    .await
                {
                    Ok(Ok(n)) if n > 0 => n,
                    _ => break,
                };
                buf.extend_from_slice(&chunk[..n]);
            }
            let text = String::from_utf8_lossy(&buf);
            let target = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("GET "))
                .and_then(|l| l.split(' ').next())
                .unwrap_or("");
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            if path != "/callback" {
                let _ = tcp
                    .write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await;
                continue;
            }
            let params = parse_query(query);
            let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let (outcome, message) = match (get("response"), get("error")) {
                (Some(r), _) => (
                    Outcome::Response(r),
                    "You are signed in to Sallyport. You can close this tab and return to the terminal.".to_string(),
                ),
                (None, Some(e)) => (Outcome::Error(e.clone()), format!("Sign-in failed: {e}")),
                (None, None) => (
                    Outcome::Error("the sign-in came back with neither a response nor an error".into()),
                    "Sign-in failed.".into(),
                ),
            };
            let body = format!(
                "<!doctype html><meta charset=utf-8><title>Sallyport</title><p>{}</p>",
                html_escape(&message)
            );
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = tcp.write_all(head.as_bytes()).await;
            let _ = tcp.write_all(body.as_bytes()).await;
            let _ = tcp.shutdown().await;
            return Ok(outcome);
        }
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    url::form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Opens `url` in the person's browser, if there is one to open.
pub fn open_browser(url: &str) -> Result<()> {
    for opener in ["xdg-open", "open", "sensible-browser"] {
        if let Ok(child) = std::process::Command::new(opener)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            drop(child);
            return Ok(());
        }
    }
    bail!("no browser to open")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded() {
        let q = parse_query("response=ab12&error=the%20ID%20token+has%2");
        assert_eq!(q[0], ("response".into(), "ab12".into()));
        assert_eq!(q[1].1, "the ID token has%2");
    }
}
