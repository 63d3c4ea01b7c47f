//! `sally kube`: Kubernetes clusters through the proxy, with plain kubectl. `ls` lists the
//! clusters the roles reach; `login` checks one, fetches its certificate (so a refusal shows
//! now, not inside kubectl) and writes a cluster, user and context into the kubeconfig whose
//! user runs `credentials`, which kubectl calls before every request (`credentials`); `sally
//! logout` removes those entries again (`kubeconfig`).
//!
//! All of it calls auth as the logged-in user (mutual TLS through the proxy's passthrough);
//! `credentials` must print nothing on stdout but the credential, since kubectl reads it.

mod credentials;
mod kubeconfig;

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::Subcommand;
use sallyport_core::api::{KubeClusterInfo, path_segment};
use sallyport_core::routes;

use super::Format;
use crate::println;
use crate::profile::{self, Profile};

#[derive(Subcommand)]
pub(super) enum KubeCommand {
    /// List the Kubernetes clusters your roles reach.
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Point kubectl at a cluster: add it to your kubeconfig as the current context.
    ///
    /// Checks that your roles reach CLUSTER and fetches its certificate, then writes a cluster,
    /// a user and a context, all named <sallyport-cluster>-CLUSTER, into the first file of
    /// $KUBECONFIG, else ~/.kube/config (created if missing; every other entry kept). The user
    /// runs `sally kube credentials`, so kubectl needs nothing else. `sally logout` removes them.
    Login {
        /// The cluster's name, as `sally kube ls` shows it.
        cluster: String,
    },
    /// Plumbing for kubectl: print an ExecCredential for a cluster.
    ///
    /// kubectl runs this before every request, as the kubeconfig `sally kube login` wrote says.
    /// The certificate is cached under $SALLY_HOME and served without the network until a
    /// minute before it expires. Not logged in to PROXY (or the login expired): nothing on
    /// stdout, exit status 1, and a line on stderr naming `sally login`.
    Credentials {
        /// The proxy you are logged in to (HOST:PORT).
        #[arg(long)]
        proxy: String,
        /// The Kubernetes cluster.
        #[arg(long)]
        cluster: String,
    },
}

pub(super) async fn run(command: KubeCommand) -> Result<()> {
    match command {
        KubeCommand::Ls { format } => ls(format).await,
        KubeCommand::Login { cluster } => login(&cluster).await,
        KubeCommand::Credentials { proxy, cluster } => print_credentials(&proxy, &cluster).await,
    }
}

async fn clusters(p: &Profile) -> Result<Vec<KubeClusterInfo>> {
    crate::http::user_api(p)?
        .get(routes::auth::KUBE_CLUSTERS)
        .await
}

async fn ls(format: Format) -> Result<()> {
    let p = Profile::require()?;
    let list = clusters(&p).await?;
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let rows: Vec<[String; 3]> = list
        .iter()
        .map(|c| {
            let labels: Vec<String> = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let status = if c.online { "online" } else { "offline" };
            [c.name.clone(), labels.join(","), status.into()]
        })
        .collect();
    let header = ["Cluster", "Labels", "Status"].map(String::from);
    let width = |i: usize| {
        std::iter::once(&header)
            .chain(&rows)
            .map(|r| r[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let (w0, w1) = (width(0), width(1));
    for [name, labels, status] in std::iter::once(&header).chain(&rows) {
        println!("{name:<w0$}  {labels:<w1$}  {status}");
    }
    Ok(())
}

async fn login(cluster: &str) -> Result<()> {
    let p = Profile::require()?;
    if !clusters(&p).await?.iter().any(|c| c.name == cluster) {
        bail!(
            "no Kubernetes cluster named {cluster:?} among those your roles reach; `sally kube ls` lists them"
        );
    }
    // A refusal (or an unreachable auth) shows here rather than inside kubectl.
    credentials::credential(&p, cluster).await?;
    let kube_port = kube_port(&p).await?;
    let name = context_name(&p, cluster);
    let entry = kubeconfig::Entry {
        name: name.clone(),
        server: format!(
            "https://{}:{kube_port}/kube/{}",
            proxy_host(&p.addr())?,
            path_segment(cluster)
        ),
        ca_pem: p.tls_host_ca_pem.clone(),
        command: absolute(std::env::current_exe().context("cannot find this program's path")?)?
            .to_string_lossy()
            .into_owned(),
        args: [
            "kube",
            "credentials",
            "--proxy",
            p.proxy.as_str(),
            "--cluster",
            cluster,
        ]
        .map(String::from)
        .to_vec(),
        sally_home: absolute(profile::home())?.to_string_lossy().into_owned(),
    };
    let path = kubeconfig::path()?;
    let mut config = kubeconfig::load(&path)?;
    config
        .merge(&entry)
        .with_context(|| path.display().to_string())?;
    kubeconfig::save(&path, &config)?;
    println!("Logged in to Kubernetes cluster {cluster}. kubectl now uses context {name}.");
    Ok(())
}

/// The name of a cluster's kubeconfig cluster, user and context: `<sallyport-cluster>-CLUSTER`.
fn context_name(p: &Profile, cluster: &str) -> String {
    format!("{}-{cluster}", p.cluster)
}

/// The proxy's Kubernetes port, from its ping.
async fn kube_port(p: &Profile) -> Result<u16> {
    let ping: serde_json::Value = crate::http::proxy_api(p)?.get(routes::web::PING).await?;
    ping["kube_port"]
        .as_u64()
        .and_then(|v| u16::try_from(v).ok())
        .ok_or_else(|| {
            anyhow!("this proxy does not serve Kubernetes (its ping names no kube_port)")
        })
}

/// The host part of a proxy address (`proxy.example.com:3080`, `[::1]:3080`), as it goes in a
/// URL.
fn proxy_host(proxy: &str) -> Result<String> {
    url::Url::parse(&format!("https://{proxy}"))
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .ok_or_else(|| anyhow!("{proxy:?} is not a proxy address HOST:PORT"))
}

fn absolute(path: PathBuf) -> Result<PathBuf> {
    std::path::absolute(&path).with_context(|| format!("cannot make {} absolute", path.display()))
}

async fn print_credentials(proxy: &str, cluster: &str) -> Result<()> {
    let p = credentials::logged_in_to(proxy)?;
    let key_path = p.paths().tls_key;
    let key = std::fs::read_to_string(&key_path).map_err(|e| {
        anyhow!(
            "cannot read {} ({e}): run `sally login --proxy {proxy}`",
            key_path.display()
        )
    })?;
    let c = credentials::credential(&p, cluster).await?;
    let out = credentials::exec_credential(&c, &key)?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// For `sally logout`, before the profile goes: removes from the kubeconfig what `sally kube
/// login` wrote for this profile's cluster. Returns the file and the names removed, if any.
pub(super) fn forget(p: &Profile) -> Result<Option<(PathBuf, Vec<String>)>> {
    let path = kubeconfig::path()?;
    if !path.exists() {
        return Ok(None);
    }
    let mut config = kubeconfig::load(&path)?;
    let removed = config.remove_ours(&format!("{}-", p.cluster), &p.proxy);
    if removed.is_empty() {
        return Ok(None);
    }
    kubeconfig::save(&path, &config)?;
    Ok(Some((path, removed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_host_is_the_host_part_of_the_address() {
        for (proxy, host) in [
            ("127.0.0.1:3080", "127.0.0.1"),
            ("proxy.example.com:3080", "proxy.example.com"),
            ("proxy.example.com", "proxy.example.com"),
            ("[::1]:3080", "[::1]"),
        ] {
            assert_eq!(proxy_host(proxy).ok().as_deref(), Some(host), "{proxy}");
        }
        assert!(proxy_host("a b:3080").is_err());
    }
}
