//! `agent_sim`: many idle node agents in one process, for `bench/scale.sh`. Each simulated
//! agent is the real thing minus a shell: it joins through the proxy's web API with a one-time
//! token of its own (`agent::join`: its own TLS and SSH keys, certificates from auth), then
//! holds its tunnel with the agent's own loop (`agent::tunnel::run`: mutual TLS, yamux, a
//! heartbeat every 10 s, reconnection with jittered backoff when the proxy goes away). Streams
//! the proxy opens are closed at once (no SSH server behind them): these agents only idle.
//!
//! ```text
//! agent_sim --proxy HOST:PORT --ca-pin sha256:... --state FILE --count N [--tokens FILE]
//!           [--prefix sim] [--join-concurrency 16]
//! ```
//!
//! Identities are kept in `--state` (JSON lines, 0600) and reused: a second run with a larger
//! `--count` joins only the missing agents, each with the next unused line of `--tokens`
//! (tokens are one-time: `sallyctl tokens add --type=node` makes them). It prints how long the
//! joins took, then `holding N tunnels` and runs until killed.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use sallyport_agent::AgentIdentity;
use sallyport_agent::join::{JoinParams, join};
use sallyport_agent::tunnel::{self, StreamServer, TunnelStream};
use sallyport_core::api::TokenKind;
use sallyport_core::tls::Trust;

/// Serves nothing: a stream the proxy opens is closed at once.
struct Idle;

impl StreamServer for Idle {
    const KIND: sallyport_core::metrics::TunnelKind = sallyport_core::metrics::TunnelKind::Node;

    async fn serve(self: Arc<Self>, stream: TunnelStream, _local: Option<std::net::SocketAddr>) {
        drop(stream)
    }
}

struct Args {
    proxy: String,
    ca_pin: String,
    state: std::path::PathBuf,
    tokens: Option<std::path::PathBuf>,
    count: usize,
    prefix: String,
    join_concurrency: usize,
}

fn args() -> Result<Args> {
    let mut a = std::env::args().skip(1);
    let (mut proxy, mut ca_pin, mut state, mut tokens, mut count) = (None, None, None, None, None);
    let mut prefix = "sim".to_string();
    let mut join_concurrency = 16;
    while let Some(flag) = a.next() {
        let mut value = || a.next().ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--proxy" => proxy = Some(value()?),
            "--ca-pin" => ca_pin = Some(value()?),
            "--state" => state = Some(value()?.into()),
            "--tokens" => tokens = Some(value()?.into()),
            "--count" => {
                count = Some(
                    value()?
                        .parse::<usize>()
                        .context("--count: a number of agents")?,
                )
            }
            "--prefix" => prefix = value()?,
            "--join-concurrency" => {
                join_concurrency = value()?
                    .parse::<usize>()
                    .context("--join-concurrency: a number")?
                    .max(1)
            }
            other => bail!("unknown flag {other}; see the doc at the top of agent_sim.rs"),
        }
    }
    Ok(Args {
        proxy: proxy.ok_or_else(|| anyhow!("--proxy HOST:PORT is required"))?,
        ca_pin: ca_pin.ok_or_else(|| anyhow!("--ca-pin is required"))?,
        state: state.ok_or_else(|| anyhow!("--state FILE is required"))?,
        tokens,
        count: count.ok_or_else(|| anyhow!("--count N is required"))?,
        prefix,
        join_concurrency,
    })
}

fn load(state: &std::path::Path) -> Result<Vec<AgentIdentity>> {
    let text = match std::fs::read_to_string(state) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", state.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: bad line", state.display())))
        .collect()
}

async fn join_missing(a: &Args, have: &mut Vec<AgentIdentity>) -> Result<()> {
    let missing = a.count.saturating_sub(have.len());
    if missing == 0 {
        return Ok(());
    }
    let path = a
        .tokens
        .as_ref()
        .ok_or_else(|| anyhow!("{missing} agents to join: --tokens FILE is required"))?;
    let tokens: Vec<String> = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let wanted = have.len()..a.count;
    if tokens.len() < a.count {
        bail!(
            "{} has {} tokens; agents {}..{} need one each (line i for agent i)",
            path.display(),
            tokens.len(),
            wanted.start,
            wanted.end
        );
    }
    let started = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(a.join_concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in wanted {
        let permit = sem.clone().acquire_owned().await?;
        let p = JoinParams {
            proxy: a.proxy.clone(),
            token: tokens[i].clone(),
            kind: TokenKind::Node,
            nodename: format!("{}{i:05}", a.prefix),
            labels: BTreeMap::from([("env".to_string(), "sim".to_string())]),
            trust: Trust::Pin(a.ca_pin.clone()),
        };
        tasks.spawn(async move {
            let r = join(&p).await;
            drop(permit);
            (i, r)
        });
    }
    let mut joined = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (i, r) = r?;
        joined.push((i, r.map_err(|e| anyhow!("agent {i}: {e}"))?));
    }
    joined.sort_by_key(|(i, _)| *i);
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        // Private keys: 0600.
        .mode(0o600)
        .open(&a.state)
        .with_context(|| format!("cannot write {}", a.state.display()))?;
    for (_, id) in joined {
        writeln!(out, "{}", serde_json::to_string(&id)?)?;
        have.push(id);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "joined {missing} agents in {secs:.1}s ({:.0}/s)",
        missing as f64 / secs.max(1e-9)
    );
    Ok(())
}

async fn main_async() -> Result<()> {
    let a = args()?;
    let mut have = load(&a.state)?;
    join_missing(&a, &mut have).await?;
    have.truncate(a.count);
    let server = Arc::new(Idle);
    for id in have {
        let labels: tunnel::Labels = Arc::new(Mutex::new(BTreeMap::from([(
            "env".to_string(),
            "sim".to_string(),
        )])));
        // Renewed certificates are used, not kept: the simulator's state file keeps the
        // joined ones.
        let keep: tunnel::Keep = Arc::new(|_| Ok(()));
        tokio::spawn(tunnel::run(Arc::new(id), labels, server.clone(), keep));
    }
    println!("holding {} tunnels", a.count);
    std::io::stdout().flush()?;
    std::future::pending::<()>().await;
    Ok(())
}

fn main() -> std::process::ExitCode {
    sallyport_core::install_crypto_provider();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agent_sim: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_async()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent_sim: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
