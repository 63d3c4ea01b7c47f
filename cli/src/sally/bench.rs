//! `sally bench ssh`: sessions per second through the proxy and their latency, like Teleport's
//! `tsh bench ssh`. From this one process, sessions start on an open-loop schedule (session i at
//! `i / rate` seconds) and each one's latency is measured from its *scheduled* start, so a
//! proxy that falls behind shows as latency rather than as a slower schedule (no coordinated
//! omission). Every session is a new SSH connection to the proxy, as every `sally ssh` and
//! `tsh bench` is: TCP, key exchange and certificate authentication at the proxy, a channel to
//! the node, the inner connection's key exchange and authentication, a command, its output
//! and exit status, and the close. `--concurrency` caps the sessions in flight: a session whose
//! time comes while the cap is reached is not started and is counted as *skipped* (apart from
//! errors, and not in the latencies).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::Subcommand;
use russh::ChannelMsg;

use super::Format;
use crate::println;
use crate::profile::Profile;

/// A session that has not ended this long after its start is an error, so a run always ends.
const SESSION_TIMEOUT: Duration = Duration::from_secs(30);
/// Distinct error messages shown (each with its count).
const SHOWN_ERRORS: usize = 5;

#[derive(Subcommand)]
pub(super) enum BenchCommand {
    /// Start SSH sessions at a fixed rate (each a new connection through the proxy), run a
    /// command in each, and report sessions per second, errors and latency percentiles.
    Ssh {
        /// Sessions started per second (open loop: on schedule whatever the answers).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        rate: u32,
        /// How long to start sessions for, e.g. 10s, 1m.
        #[arg(long, default_value = "10s")]
        duration: String,
        /// Sessions in flight at most; one due while this many run is skipped and counted.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        concurrency: u32,
        #[arg(short = 'l')]
        login: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// [LOGIN@]NODE
        target: String,
        /// The command each session runs.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

pub(super) async fn run(command: BenchCommand) -> Result<()> {
    let BenchCommand::Ssh {
        rate,
        duration,
        concurrency,
        login,
        format,
        target,
        command,
    } = command;
    let duration = sallyport_core::duration::parse(&duration)
        .map_err(|e| anyhow!("--duration: {e} (e.g. 10s, 1m)"))?;
    if duration.is_zero() {
        bail!("--duration: must be more than 0s");
    }
    let p = Profile::require()?;
    let keys = Arc::new(crate::ssh::Keys::load(&p)?);
    let (login, node) = match target.split_once('@') {
        Some((l, t)) => (l.to_string(), t.to_string()),
        None => (
            match login {
                Some(l) => l,
                None => super::ssh::default_login(&p)?,
            },
            target,
        ),
    };
    if node.is_empty() || login.is_empty() {
        bail!("the target is [LOGIN@]NODE");
    }
    let port = super::ssh::ssh_port(&p).await?;
    let job = Arc::new(Job {
        profile: p,
        keys,
        port,
        login,
        node,
        command: command.join(" "),
    });
    let report = schedule(job, rate, duration, concurrency).await;
    if format == Format::Json {
        println!("{}", serde_json::to_string(&report.json(rate, duration))?);
    } else {
        report.print(rate, duration);
    }
    Ok(())
}

/// What every session does.
struct Job {
    profile: Profile,
    keys: Arc<crate::ssh::Keys>,
    port: u16,
    login: String,
    node: String,
    command: String,
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    errors: u64,
    /// Distinct messages in the order first seen, with their counts.
    messages: Vec<(String, u64)>,
    /// When the last session ended (ok or not).
    last_end: Option<Instant>,
}

struct Report {
    scheduled: u64,
    skipped: u64,
    concurrency: u32,
    elapsed: Duration,
    tally: Tally,
}

async fn schedule(job: Arc<Job>, rate: u32, duration: Duration, concurrency: u32) -> Report {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let cap = Arc::new(tokio::sync::Semaphore::new(concurrency as usize));
    let period = Duration::from_secs(1).div_f64(f64::from(rate));
    let start = Instant::now();
    let mut scheduled = 0u64;
    let mut skipped = 0u64;
    let mut running = tokio::task::JoinSet::new();
    loop {
        let due = start + period.mul_f64(scheduled as f64);
        if due >= start + duration {
            break;
        }
        scheduled += 1;
        tokio::time::sleep_until(due.into()).await;
        let Ok(permit) = cap.clone().try_acquire_owned() else {
            skipped += 1;
            continue;
        };
        let (job, tally) = (job.clone(), tally.clone());
        running.spawn(async move {
            let r = match tokio::time::timeout(SESSION_TIMEOUT, session(&job)).await {
                Ok(r) => r,
                Err(_) => Err(anyhow!(
                    "no exit status within {}s",
                    SESSION_TIMEOUT.as_secs()
                )),
            };
            let end = Instant::now();
            drop(permit);
            if let Ok(mut t) = tally.lock() {
                t.last_end = Some(t.last_end.map_or(end, |l| l.max(end)));
                match r {
                    Ok(()) => t.latencies.push(end - due),
                    Err(e) => {
                        t.errors += 1;
                        let msg = format!("{e:#}");
                        match t.messages.iter_mut().find(|(m, _)| *m == msg) {
                            Some((_, n)) => *n += 1,
                            None => t.messages.push((msg, 1)),
                        }
                    }
                }
            }
        });
        // Reap what has finished, so a long run holds no finished tasks.
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
    let tally = match Arc::try_unwrap(tally) {
        Ok(m) => m.into_inner().unwrap_or_default(),
        Err(shared) => shared
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default(),
    };
    let elapsed = tally.last_end.map_or(start.elapsed(), |e| e - start);
    Report {
        scheduled,
        skipped,
        concurrency,
        elapsed,
        tally,
    }
}

/// One session, start to close, on a connection of its own.
async fn session(job: &Job) -> Result<()> {
    let proxy = crate::ssh::connect_proxy(&job.profile, &job.keys, job.port).await?;
    let (node, failure) =
        crate::ssh::connect_node(&proxy, &job.keys, &job.node, &job.login, Default::default())
            .await?;
    let mut channel = match node.channel_open_session().await {
        Ok(c) => c,
        Err(e) => {
            return Err(anyhow!(
                "{}",
                sallyport_core::flow::open_failure_reason(&failure, e).await
            ));
        }
    };
    channel.exec(true, job.command.as_bytes().to_vec()).await?;
    channel.eof().await?;
    let mut status = None;
    while let Some(msg) = channel.wait().await {
        match msg {
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            ChannelMsg::ExitSignal { signal_name, .. } => {
                bail!("the command was killed by signal {signal_name:?}")
            }
            ChannelMsg::Failure => bail!("the node refused to run the command"),
            ChannelMsg::Close => break,
            // Output is read and dropped.
            _ => {}
        }
    }
    let _ = node
        .disconnect(russh::Disconnect::ByApplication, "", "en")
        .await;
    proxy.disconnect().await;
    match status {
        Some(0) => Ok(()),
        Some(code) => bail!("the command exited with status {code}"),
        None => bail!("the session ended without an exit status"),
    }
}

/// Nearest-rank percentile of sorted latencies, in milliseconds.
fn percentile(sorted: &[Duration], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1].as_secs_f64() * 1000.0)
}

impl Report {
    fn ok(&self) -> u64 {
        self.tally.latencies.len() as u64
    }

    fn per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ok() as f64 / secs
        } else {
            0.0
        }
    }

    fn latencies(&self) -> [(&'static str, Option<f64>); 4] {
        let mut sorted = self.tally.latencies.clone();
        sorted.sort_unstable();
        [
            ("p50", percentile(&sorted, 0.50)),
            ("p90", percentile(&sorted, 0.90)),
            ("p99", percentile(&sorted, 0.99)),
            ("max", percentile(&sorted, 1.0)),
        ]
    }

    fn json(&self, rate: u32, duration: Duration) -> serde_json::Value {
        let latency: serde_json::Map<String, serde_json::Value> = self
            .latencies()
            .into_iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        let messages: Vec<serde_json::Value> = self
            .tally
            .messages
            .iter()
            .take(SHOWN_ERRORS)
            .map(|(m, n)| serde_json::json!({"message": m, "count": n}))
            .collect();
        serde_json::json!({
            "rate": rate,
            "duration_secs": duration.as_secs_f64(),
            "concurrency": self.concurrency,
            "scheduled": self.scheduled,
            "ok": self.ok(),
            "errors": self.tally.errors,
            "skipped": self.skipped,
            "error_messages": messages,
            "elapsed_secs": self.elapsed.as_secs_f64(),
            "sessions_per_sec": self.per_sec(),
            "latency_ms": latency,
        })
    }

    fn print(&self, rate: u32, duration: Duration) {
        println!(
            "{:.1} sessions/s ({} ok in {:.2}s; asked {rate}/s for {}s, each a new connection)",
            self.per_sec(),
            self.ok(),
            self.elapsed.as_secs_f64(),
            duration.as_secs()
        );
        println!(
            "sessions: {} scheduled, {} ok, {} errors, {} skipped (concurrency cap {} reached)",
            self.scheduled,
            self.ok(),
            self.tally.errors,
            self.skipped,
            self.concurrency
        );
        for (m, n) in self.tally.messages.iter().take(SHOWN_ERRORS) {
            println!("  error ×{n}: {m}");
        }
        if self.tally.messages.len() > SHOWN_ERRORS {
            println!(
                "  ... and {} other distinct errors",
                self.tally.messages.len() - SHOWN_ERRORS
            );
        }
        let lat = self
            .latencies()
            .iter()
            .map(|(k, v)| match v {
                Some(ms) => format!("{k} {ms:.1} ms"),
                None => format!("{k} -"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        println!("latency from each session's scheduled start: {lat}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 1.0), Some(100.0));
        assert_eq!(percentile(&v[..1], 0.5), Some(1.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
