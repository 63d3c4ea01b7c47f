//! The `sallyport` configuration file: YAML shaped like Teleport's, every key checked. An
//! unknown key, a wrong type or a bad address stops the start with the file, line and key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sallyport_core::duration::HumanDuration;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub version: String,
    #[serde(default)]
    pub sallyport: Global,
    #[serde(default)]
    pub auth_service: AuthService,
    #[serde(default)]
    pub proxy_service: ProxyService,
    #[serde(default)]
    pub ssh_service: SshService,
    #[serde(default)]
    pub kube_service: KubeService,
    /// Where finished recordings are kept; absent: the data dir's `recordings/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recordings: Option<Recordings>,
}

/// `recordings:` — the recording store. Credentials come from the environment
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`), never from this file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recordings {
    /// `s3://bucket[/prefix]` or `file:///path`.
    pub uri: String,
    /// An S3-compatible service's URL (`http://127.0.0.1:9000`); absent: AWS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

impl Recordings {
    pub fn store_config(&self) -> sallyport_recordings::StoreConfig {
        sallyport_recordings::StoreConfig {
            uri: self.uri.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Global {
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// For an agent (`ssh_service` alone): the proxy's web address, HOST:3080.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_server: Option<String>,
    /// For a proxy without auth in its process: auth's address, HOST:3025 (several separated
    /// by commas: auth instances sharing one database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_server: Option<String>,
    /// For an agent's first start: the one-time join token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<String>,
    /// For an agent's first start: the cluster's CA pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pin: Option<String>,
    /// This host's node name (default: the system host name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodename: Option<String>,
    #[serde(default)]
    pub log: Log,
    #[serde(default)]
    pub storage: Storage,
    /// The diagnostics listener (plain HTTP: `/healthz`, `/readyz`, `/metrics`); off when
    /// unset. `--diag-addr` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diag_addr: Option<SocketAddr>,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            data_dir: default_data_dir(),
            proxy_server: None,
            auth_server: None,
            auth_token: None,
            ca_pin: None,
            nodename: None,
            log: Log::default(),
            storage: Storage::default(),
            diag_addr: None,
        }
    }
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("/var/lib/sallyport")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    #[serde(default = "default_severity")]
    pub severity: Severity,
    #[serde(default)]
    pub format: LogFormat,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            severity: default_severity(),
            format: LogFormat::Text,
        }
    }
}

fn default_severity() -> Severity {
    Severity::Info
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    #[serde(rename = "type", default)]
    pub kind: StorageKind,
    /// `postgres://user:pass@host/db` when `type: postgres`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn_string: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    #[default]
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthService {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_auth_addr")]
    pub listen_addr: SocketAddr,
    #[serde(default = "default_cluster")]
    pub cluster_name: String,
    #[serde(default)]
    pub authentication: Authentication,
    #[serde(default)]
    pub audit: AuditSettings,
    /// How long the certificates of agents and proxies last (at least 30s). Each renews its
    /// own at two thirds of that: an agent through its tunnel while it runs, a proxy at start.
    #[serde(default = "default_host_cert_ttl")]
    pub host_cert_ttl: HumanDuration,
}

fn default_host_cert_ttl() -> HumanDuration {
    HumanDuration(Duration::from_secs(365 * 86400))
}

impl Default for AuthService {
    fn default() -> Self {
        AuthService {
            enabled: true,
            listen_addr: default_auth_addr(),
            cluster_name: default_cluster(),
            authentication: Authentication::default(),
            audit: AuditSettings::default(),
            host_cert_ttl: default_host_cert_ttl(),
        }
    }
}

/// When auth signs a checkpoint of the audit chain (with `<data>/audit-checkpoint.key`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// Every this many records...
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// ...and at most this long after a record was written.
    #[serde(default = "default_checkpoint_interval")]
    pub checkpoint_interval: HumanDuration,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            checkpoint_every: default_checkpoint_every(),
            checkpoint_interval: default_checkpoint_interval(),
        }
    }
}

fn default_checkpoint_every() -> u64 {
    100
}
fn default_checkpoint_interval() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(60))
}

fn yes() -> bool {
    true
}
fn default_auth_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3025))
}
fn default_cluster() -> String {
    "sallyport".into()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authentication {
    #[serde(rename = "type", default)]
    pub kind: AuthKind,
    #[serde(default)]
    pub second_factor: SecondFactor,
    #[serde(default = "default_attempts")]
    pub max_login_attempts: u32,
    #[serde(default = "default_lock")]
    pub lockout_window: HumanDuration,
    #[serde(default = "default_lock")]
    pub lockout_duration: HumanDuration,
}

impl Default for Authentication {
    fn default() -> Self {
        Authentication {
            kind: AuthKind::Local,
            second_factor: SecondFactor::Otp,
            max_login_attempts: default_attempts(),
            lockout_window: default_lock(),
            lockout_duration: default_lock(),
        }
    }
}

fn default_attempts() -> u32 {
    5
}
fn default_lock() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(30 * 60))
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthKind {
    #[default]
    Local,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecondFactor {
    #[default]
    Otp,
    Off,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyService {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_web")]
    pub web_listen_addr: SocketAddr,
    #[serde(default = "default_ssh")]
    pub ssh_listen_addr: SocketAddr,
    #[serde(default = "default_tunnel")]
    pub tunnel_listen_addr: SocketAddr,
    #[serde(default = "default_kube")]
    pub kube_listen_addr: SocketAddr,
    /// Extra names (DNS or IP) clients use to reach the proxy, each with the port browsers
    /// use when it is not `web_listen_addr`'s (`proxy.example.com:443` behind a load
    /// balancer): the names go into its certificate, name and port into the web UI's origins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_addr: Vec<String>,
    /// Where agents reach this proxy's tunnel door (HOST:PORT), told to every agent so it keeps
    /// a tunnel here too; default: the first `public_addr` with `tunnel_listen_addr`'s port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_public_addr: Option<String>,
    /// How long an SSH connection on `ssh_listen_addr` may take to authenticate.
    #[serde(default = "default_login_grace")]
    pub ssh_login_grace: HumanDuration,
    /// Connections not yet authenticated, all addresses together, at each of the proxy's doors
    /// (SSH, web, tunnel).
    #[serde(default = "default_max_unauthenticated")]
    pub max_unauthenticated_connections: usize,
    /// The same from one address (an IPv6 /64 counts as one).
    #[serde(default = "default_max_unauthenticated_per_address")]
    pub max_unauthenticated_per_address: usize,
    /// New connections a second one address may open that do not log in, beyond a burst of
    /// `max_unauthenticated_per_address` (the DHEat throttle).
    #[serde(default = "default_connection_rate")]
    pub max_connection_rate_per_address: u32,
    /// Open connections to the web door (`web_listen_addr`), authenticated or not, all
    /// addresses together: any request takes a connection out of the unauthenticated caps.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// The same from one address (an IPv6 /64 counts as one).
    #[serde(default = "default_max_connections_per_address")]
    pub max_connections_per_address: usize,
    /// A web connection without a request (or a byte of one, or of a response) for this long
    /// is asked to close; HTTP/2 PINGs do not count.
    #[serde(default = "default_web_connection_idle_timeout")]
    pub web_connection_idle_timeout: HumanDuration,
    /// A browser's web session without input (terminal input, a request that changes
    /// something; not polling) for this long is signed out, its terminals ended.
    #[serde(default = "default_web_idle_timeout")]
    pub web_idle_timeout: HumanDuration,
    /// The largest a session recording may grow (`1GiB`, `64MiB`, or bytes): past it a
    /// `strict` session ends and a `best_effort` one goes on unrecorded, audited.
    #[serde(default = "default_max_recording_size")]
    pub max_recording_size: ByteSize,
    /// Connections to nodes (`ssh -J` jumps, direct-tcpip channels) one SSH connection to the
    /// proxy may carry at once; each costs a key exchange.
    #[serde(default = "default_max_jumps_per_connection")]
    pub max_jumps_per_connection: usize,
    /// Certificates for browsers on `web_listen_addr` (a public CA's), read again when the
    /// files change; Sallyport's own clients keep getting the cluster's (`core::webcert`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub https_keypairs: Vec<HttpsKeypair>,
}

/// One `https_keypairs` entry: a PEM certificate chain (leaf first) and its PEM key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpsKeypair {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A size in bytes, written as a number or with a unit: `512KiB`, `64MiB`, `1GiB` (or
/// `KB`/`MB`/`GB`, in powers of 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "u64")]
pub struct ByteSize(pub u64);

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> u64 {
        b.0
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (n, unit) = s.split_at(split);
        let n: u64 = n
            .parse()
            .map_err(|_| format!("{s:?} is not a size such as 1GiB, 64MiB or 1048576"))?;
        let mul: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            u => {
                return Err(format!(
                    "{u:?} is not a size unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
                ));
            }
        };
        n.checked_mul(mul)
            .map(ByteSize)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(ByteSize(n)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

fn default_max_jumps_per_connection() -> usize {
    sallyport_proxy::ssh::DEFAULT_MAX_JUMPS_PER_CONNECTION
}

fn default_max_recording_size() -> ByteSize {
    ByteSize(sallyport_proxy::session::record::DEFAULT_MAX_RECORDING_SIZE)
}

impl ProxyService {
    /// The limits every door of the proxy applies before a peer has authenticated.
    pub fn door_limits(&self) -> sallyport_core::door::Limits {
        sallyport_core::door::Limits {
            max_unauthenticated: self.max_unauthenticated_connections,
            per_address: Some(sallyport_core::door::PerAddress {
                max_unauthenticated: self.max_unauthenticated_per_address,
                new_per_second: self.max_connection_rate_per_address,
            }),
            open: None,
        }
    }

    /// The web door's limits: those of every door, and caps on all its open connections (never
    /// below the unauthenticated ones: a connection waiting for its first request is open too).
    pub fn web_door_limits(&self) -> sallyport_core::door::Limits {
        sallyport_core::door::Limits {
            open: Some(sallyport_core::door::OpenLimits {
                max_connections: self
                    .max_connections
                    .max(self.max_unauthenticated_connections),
                max_per_address: self
                    .max_connections_per_address
                    .max(self.max_unauthenticated_per_address),
                idle_timeout: self.web_connection_idle_timeout.0,
            }),
            ..self.door_limits()
        }
    }
}

fn default_max_connections() -> usize {
    sallyport_core::door::DEFAULT_MAX_CONNECTIONS
}
fn default_max_connections_per_address() -> usize {
    sallyport_core::door::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
}
fn default_web_connection_idle_timeout() -> HumanDuration {
    HumanDuration(sallyport_core::door::DEFAULT_IDLE_TIMEOUT)
}

fn default_web_idle_timeout() -> HumanDuration {
    HumanDuration(sallyport_proxy::web::sessions::DEFAULT_IDLE_TIMEOUT)
}

fn default_login_grace() -> HumanDuration {
    HumanDuration(sallyport_core::door::DEFAULT_LOGIN_GRACE)
}
fn default_max_unauthenticated() -> usize {
    sallyport_core::door::DEFAULT_MAX_UNAUTHENTICATED
}
fn default_max_unauthenticated_per_address() -> usize {
    sallyport_core::door::DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS
}
fn default_connection_rate() -> u32 {
    sallyport_core::door::DEFAULT_NEW_PER_SECOND_PER_ADDRESS
}

impl Default for ProxyService {
    fn default() -> Self {
        ProxyService {
            enabled: true,
            web_listen_addr: default_web(),
            ssh_listen_addr: default_ssh(),
            tunnel_listen_addr: default_tunnel(),
            kube_listen_addr: default_kube(),
            public_addr: vec![],
            tunnel_public_addr: None,
            ssh_login_grace: default_login_grace(),
            max_unauthenticated_connections: default_max_unauthenticated(),
            max_unauthenticated_per_address: default_max_unauthenticated_per_address(),
            max_connection_rate_per_address: default_connection_rate(),
            max_connections: default_max_connections(),
            max_connections_per_address: default_max_connections_per_address(),
            web_connection_idle_timeout: default_web_connection_idle_timeout(),
            web_idle_timeout: default_web_idle_timeout(),
            max_recording_size: default_max_recording_size(),
            max_jumps_per_connection: default_max_jumps_per_connection(),
            https_keypairs: vec![],
        }
    }
}

impl ProxyService {
    /// `public_addr` read as (name, port if given): `name`, `name:port`, `[v6]:port` or `v6`;
    /// names lowercase.
    pub fn public_hosts(&self) -> Vec<(String, Option<u16>)> {
        self.public_addr
            .iter()
            .map(|a| split_host_port(a))
            .collect()
    }
}

fn split_host_port(a: &str) -> (String, Option<u16>) {
    let a = a.trim();
    if let Some(rest) = a.strip_prefix('[')
        && let Some((host, tail)) = rest.split_once(']')
    {
        let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
        return (host.to_ascii_lowercase(), port);
    }
    match a.rsplit_once(':') {
        // One colon: name:port. More: a bare IPv6 address.
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host.to_ascii_lowercase(), Some(p)),
            Err(_) => (a.to_ascii_lowercase(), None),
        },
        _ => (a.to_ascii_lowercase(), None),
    }
}

fn default_web() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3080))
}
fn default_ssh() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3023))
}
fn default_tunnel() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3024))
}
fn default_kube() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3026))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshService {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<LabelCommand>,
    #[serde(default)]
    pub pam: Pam,
}

impl Default for SshService {
    fn default() -> Self {
        SshService {
            enabled: true,
            labels: BTreeMap::new(),
            commands: vec![],
            pam: Pam::default(),
        }
    }
}

/// `ssh_service.pam`, as Teleport names it: sessions run PAM's account and session stacks of
/// `/etc/pam.d/<service_name>` (never its authentication: the certificate proved who it is).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pam {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default = "default_pam_service")]
    pub service_name: String,
}

impl Default for Pam {
    fn default() -> Self {
        Pam {
            enabled: false,
            service_name: default_pam_service(),
        }
    }
}

fn default_pam_service() -> String {
    "sallyport".into()
}

impl Pam {
    /// The service sessions run through, when PAM is enabled.
    pub fn service(&self) -> Option<&str> {
        self.enabled.then_some(self.service_name.as_str())
    }
}

/// `kube_service`: a kube agent serving one Kubernetes cluster through the proxy (in-process in
/// an all-in-one daemon, or alone with `--roles=kube`). Off unless configured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeService {
    #[serde(default)]
    pub enabled: bool,
    /// The API server and the agent's credentials (its current context); without one, the
    /// pod's service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_file: Option<PathBuf>,
    /// The name people use for the cluster (`sally kube login NAME`); required when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_cluster_name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<LabelCommand>,
}

impl KubeService {
    /// The cluster's name, which an enabled kube service must have.
    pub fn cluster_name(&self) -> Result<&str, String> {
        let name = self.kube_cluster_name.as_deref().ok_or_else(|| {
            "kube_service.kube_cluster_name: required for a kube agent (or --kube-cluster NAME)"
                .to_string()
        })?;
        sallyport_core::names::validate("kube cluster", name)
            .map_err(|e| format!("kube_service.kube_cluster_name: {e}"))?;
        Ok(name)
    }
}

/// A dynamic label: `command` runs every `period` and its output becomes label `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelCommand {
    pub name: String,
    pub command: Vec<String>,
    pub period: HumanDuration,
}

impl Config {
    /// The all-in-one defaults (`sallyport start` with no config).
    pub fn all_in_one(data_dir: PathBuf) -> Self {
        Config {
            version: "v1".into(),
            sallyport: Global {
                data_dir,
                ..Global::default()
            },
            auth_service: AuthService::default(),
            proxy_service: ProxyService::default(),
            ssh_service: SshService::default(),
            kube_service: KubeService::default(),
            recordings: None,
        }
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let cfg: Config = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if cfg.version != "v1" {
            return Err(format!("version: expected v1, got {:?}", cfg.version));
        }
        if cfg.sallyport.storage.kind == StorageKind::Postgres
            && cfg.sallyport.storage.conn_string.is_none()
        {
            return Err(
                "sallyport.storage.conn_string: required when storage type is postgres".into(),
            );
        }
        sallyport_core::names::validate("cluster", &cfg.auth_service.cluster_name)
            .map_err(|e| format!("auth_service.cluster_name: {e}"))?;
        let p = &cfg.proxy_service;
        if p.ssh_login_grace.0.is_zero() || p.ssh_login_grace.0 > Duration::from_secs(3600) {
            return Err("proxy_service.ssh_login_grace: between 1s and 1h".into());
        }
        if p.max_unauthenticated_connections == 0 {
            return Err("proxy_service.max_unauthenticated_connections: at least 1".into());
        }
        if p.max_unauthenticated_per_address == 0
            || p.max_unauthenticated_per_address > p.max_unauthenticated_connections
        {
            return Err("proxy_service.max_unauthenticated_per_address: at least 1 and at most max_unauthenticated_connections".into());
        }
        if p.max_connection_rate_per_address == 0 {
            return Err("proxy_service.max_connection_rate_per_address: at least 1".into());
        }
        if p.max_connections == 0 {
            return Err("proxy_service.max_connections: at least 1".into());
        }
        if p.max_connections_per_address == 0 || p.max_connections_per_address > p.max_connections {
            return Err(
                "proxy_service.max_connections_per_address: at least 1 and at most max_connections"
                    .into(),
            );
        }
        if p.web_connection_idle_timeout.0 < Duration::from_secs(1)
            || p.web_connection_idle_timeout.0 > Duration::from_secs(3600)
        {
            return Err("proxy_service.web_connection_idle_timeout: between 1s and 1h".into());
        }
        if p.web_idle_timeout.0 < Duration::from_secs(1)
            || p.web_idle_timeout.0 > Duration::from_secs(86400)
        {
            return Err("proxy_service.web_idle_timeout: between 1s and 24h".into());
        }
        if p.max_recording_size.0 < 4096 {
            return Err("proxy_service.max_recording_size: at least 4KiB".into());
        }
        if p.max_jumps_per_connection == 0 {
            return Err("proxy_service.max_jumps_per_connection: at least 1".into());
        }
        let k = &cfg.kube_service;
        if k.enabled || k.kube_cluster_name.is_some() {
            k.cluster_name()?;
        }
        sallyport_core::names::validate_labels(&k.labels)
            .map_err(|e| format!("kube_service.labels: {e}"))?;
        // The store's shape now; its credentials and reachability at start.
        if let Some(r) = &cfg.recordings {
            r.store_config().check().map_err(|e| e.to_string())?;
        }
        let service = &cfg.ssh_service.pam.service_name;
        if service.is_empty()
            || service.starts_with('.')
            || !service
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(format!(
                "ssh_service.pam.service_name: {service:?} is not a file name in /etc/pam.d"
            ));
        }
        Ok(cfg)
    }

    pub fn storage_url(&self) -> String {
        match (
            &self.sallyport.storage.kind,
            &self.sallyport.storage.conn_string,
        ) {
            (StorageKind::Postgres, Some(url)) => url.clone(),
            _ => format!(
                "sqlite:{}?mode=rwc",
                self.sallyport.data_dir.join("sallyport.db").display()
            ),
        }
    }
}

/// What `sallyport configure` prints.
pub const DEFAULT_CONFIG: &str = r#"# Sallyport configuration. Every key is shown with its default.
version: v1
sallyport:
  # Where the embedded database, the CA-backed admin identity and recordings live.
  data_dir: /var/lib/sallyport
  log:
    severity: info        # debug | info | warn | error
    format: text          # text | json
  # nodename: web1        # this host's node name (default: the system host name)
  # For an agent on another host (ssh_service alone), instead of --proxy/--token/--ca-pin:
  # proxy_server: proxy.example.com:3080
  # auth_token: <from sallyctl tokens add --type=node>
  # ca_pin: sha256:...
  storage:
    type: sqlite          # sqlite (embedded, in data_dir) | postgres
    # conn_string: "postgres://sallyport:PASSWORD@db.example.com/sallyport?sslmode=verify-full&sslrootcert=/etc/sallyport/pg-ca.pem"   # with type: postgres
  # Diagnostics, plain HTTP (off unless set; keep it on a private address): /healthz,
  # /readyz (the database answers; auth, or the agent's tunnel, is reachable) and /metrics
  # (Prometheus text format).
  # diag_addr: 127.0.0.1:3000

auth_service:
  enabled: true
  # mutual-TLS API for the proxies, agents and sallyctl
  listen_addr: 127.0.0.1:3025
  # fixed at first start: it names the cluster in certificates and host names (node.CLUSTER)
  cluster_name: sallyport
  authentication:
    type: local
    second_factor: otp    # otp (password + TOTP authenticator) | off (password only)
    max_login_attempts: 5 # failed logins within lockout_window that lock an account
    lockout_window: 30m
    lockout_duration: 30m
  # The audit chain is anchored outside the database: auth signs a checkpoint of it with
  # <data_dir>/audit-checkpoint.key (made at first start; keep it out of database backups' reach,
  # and give every auth instance of a PostgreSQL cluster the same file).
  audit:
    checkpoint_every: 100     # records between signed checkpoints
    checkpoint_interval: 1m   # and at most this long before a record is anchored

proxy_service:
  enabled: true
  # Any listen address (auth's too) may use port 0: the kernel picks a free port, and
  # `sallyport start` prints the addresses it got.
  web_listen_addr: 127.0.0.1:3080     # HTTPS: login API, web UI
  ssh_listen_addr: 127.0.0.1:3023     # SSH for users (ProxyJump)
  tunnel_listen_addr: 127.0.0.1:3024  # reverse tunnels from agents
  kube_listen_addr: 127.0.0.1:3026    # Kubernetes API for kubectl
  # public_addr: [proxy.example.com]  # extra names clients use; added to the proxy's certificate
                                      # (name:443 when browsers reach it on another port)
  # Before a peer has authenticated (sized for a 2-core proxy; beyond them: 429, or an SSH
  # disconnect with the reason):
  ssh_login_grace: 30s                  # an SSH connection not authenticated by then is closed
  max_unauthenticated_connections: 256  # at each door (SSH, web, tunnel), all addresses together
  max_unauthenticated_per_address: 16   # the same from one address (an IPv6 /64)
  max_connection_rate_per_address: 5    # new connections a second that do not log in, beyond a
                                        # burst of max_unauthenticated_per_address
  # Every open web connection (any request, even anonymous, ends "unauthenticated"):
  max_connections: 4096                 # to web_listen_addr, all addresses together
  max_connections_per_address: 128      # the same from one address (an IPv6 /64); neither is
                                        # ever below its max_unauthenticated_ counterpart
  web_connection_idle_timeout: 60s      # a web connection without a request for this long is
                                        # asked to close (PINGs do not count)
  web_idle_timeout: 30m                 # a browser's web session without input for this long
                                        # is signed out (polling does not count)
  max_recording_size: 1GiB              # a session recording past this size ends the session
                                        # (record_session: strict) or stops, audited (best_effort)
  max_jumps_per_connection: 10          # connections to nodes one SSH connection to the proxy
                                        # carries at once (a ControlMaster's ssh -J / -W)
  # Certificates browsers trust (a public CA's) for web_listen_addr, chosen by name (SNI) and
  # read again within 5s of a change; sally, sallyctl and agents keep the cluster's:
  # https_keypairs:
  #   - {cert_file: /etc/letsencrypt/live/proxy.example.com/fullchain.pem,
  #      key_file: /etc/letsencrypt/live/proxy.example.com/privkey.pem}

ssh_service:
  enabled: true
  labels: {env: dev}
  # commands:             # dynamic labels, refreshed every period
  #   - {name: arch, command: [uname, -m], period: 1h}
  # PAM's account and session stacks for every session (pam_limits, pam_env, pam_systemd,
  # pam_motd, pam_mkhomedir), never its authentication; needs /etc/pam.d/<service_name>
  # (an example is config/pam.d/sallyport). An account refusal ends the session with PAM's
  # message. Off by default; libpam is loaded only when enabled.
  # pam:
  #   enabled: true
  #   service_name: sallyport

# Where finished session recordings are kept. Absent: <data_dir>/recordings. The proxy writes
# each one there while its session runs and uploads it whole when the session ends. The key
# comes from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never from this file.
# recordings:
#   uri: s3://my-bucket/sallyport     # s3://BUCKET[/PREFIX] | file:///PATH
#   endpoint: http://127.0.0.1:9000   # an S3-compatible service (MinIO); absent: AWS
#   region: us-east-1                 # default: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1

# A Kubernetes cluster served through the proxy's kube_listen_addr by a kube agent: in this
# process when auth and proxy run here, or alone with --roles=kube. Off by default.
# kube_service:
#   enabled: true
#   kube_cluster_name: prod     # required: the name `sally kube login` takes
#   # The API server and the agent's own credentials (client certificate or token) from the
#   # kubeconfig's current context; without it, the pod's service account. The agent's user
#   # must be allowed to impersonate users and groups.
#   kubeconfig_file: /etc/sallyport/kubeconfig
#   labels: {env: prod}
#   # commands:
#   #   - {name: k8s, command: [kubectl, version, --client], period: 1h}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_addr_takes_a_port_for_the_origin_and_not_for_the_certificate() {
        let p = ProxyService {
            public_addr: vec![
                "Proxy.Example.com".into(),
                "lb.example.com:443".into(),
                "[2001:db8::1]:8443".into(),
                "2001:db8::2".into(),
                "odd:port".into(),
            ],
            ..Default::default()
        };
        assert_eq!(
            p.public_hosts(),
            vec![
                ("proxy.example.com".to_string(), None),
                ("lb.example.com".to_string(), Some(443)),
                ("2001:db8::1".to_string(), Some(8443)),
                ("2001:db8::2".to_string(), None),
                ("odd:port".to_string(), None),
            ]
        );
    }

    #[test]
    fn default_config_parses() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.auth_service.listen_addr.port(), 3025);
        assert_eq!(c.proxy_service.kube_listen_addr.port(), 3026);
        assert_eq!(
            c.ssh_service.labels.get("env").map(String::as_str),
            Some("dev")
        );
    }

    #[test]
    fn pam_is_off_by_default_and_its_service_is_a_file_name() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ssh_service.pam.service(), None);
        let on = Config::parse("version: v1\nssh_service:\n  pam: {enabled: true}\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(on.ssh_service.pam.service(), Some("sallyport"));
        let named = Config::parse(
            "version: v1\nssh_service:\n  pam: {enabled: true, service_name: sshd}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(named.ssh_service.pam.service(), Some("sshd"));
        // The commented example in `sallyport configure`, uncommented, is valid.
        let example = DEFAULT_CONFIG
            .replace("  # pam:\n", "  pam:\n")
            .replace("  #   enabled: true\n", "    enabled: true\n")
            .replace(
                "  #   service_name: sallyport\n",
                "    service_name: sallyport\n",
            );
        let c = Config::parse(&example).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.ssh_service.pam.service(), Some("sallyport"));
        for bad in ["../shadow", "", ".hidden", "a b"] {
            let e = Config::parse(&format!(
                "version: v1\nssh_service:\n  pam: {{enabled: true, service_name: \"{bad}\"}}\n"
            ))
            .err()
            .unwrap_or_default();
            assert!(e.contains("ssh_service.pam.service_name"), "{bad}: {e}");
        }
        let e = Config::parse(
            "version: v1\nssh_service:\n  pam: {enabled: true, use_pam_auth: true}\n",
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("use_pam_auth"), "{e}");
    }

    #[test]
    fn door_limits_default_and_are_checked() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proxy_service.ssh_login_grace.0, Duration::from_secs(30));
        let l = c.proxy_service.door_limits();
        assert_eq!(l.max_unauthenticated, 256);
        let per = l
            .per_address
            .unwrap_or_else(|| panic!("per-address limits"));
        assert_eq!((per.max_unauthenticated, per.new_per_second), (16, 5));
        assert!(
            l.open.is_none(),
            "the SSH and tunnel doors have no open caps"
        );
        let open = c
            .proxy_service
            .web_door_limits()
            .open
            .unwrap_or_else(|| panic!("the web door's open caps"));
        assert_eq!((open.max_connections, open.max_per_address), (4096, 128));
        assert_eq!(open.idle_timeout, Duration::from_secs(60));
        // Two different idles: the HTTP connection's, and a browser's web session's.
        assert_eq!(
            c.proxy_service.web_idle_timeout.0,
            Duration::from_secs(30 * 60)
        );
        assert_eq!(
            Config::parse("version: v1\n")
                .unwrap_or_else(|e| panic!("{e}"))
                .proxy_service
                .web_idle_timeout
                .0,
            Duration::from_secs(30 * 60)
        );
        let cases = [
            ("max_connections: 0", "max_connections"),
            (
                "max_connections_per_address: 5000",
                "max_connections_per_address",
            ),
            (
                "web_connection_idle_timeout: 0s",
                "web_connection_idle_timeout",
            ),
            ("web_idle_timeout: 0s", "web_idle_timeout"),
            ("web_idle_timeout: 25h", "web_idle_timeout"),
            ("ssh_login_grace: 0s", "ssh_login_grace"),
            (
                "max_unauthenticated_connections: 0",
                "max_unauthenticated_connections",
            ),
            (
                "max_unauthenticated_per_address: 300",
                "max_unauthenticated_per_address",
            ),
            (
                "max_connection_rate_per_address: 0",
                "max_connection_rate_per_address",
            ),
        ];
        for (line, key) in cases {
            let text = format!("version: v1\nproxy_service:\n  {line}\n");
            let e = Config::parse(&text).err().unwrap_or_default();
            assert!(e.contains(key), "{text:?} gave {e:?}");
        }
    }

    #[test]
    fn max_recording_size_takes_units_and_defaults_to_a_gibibyte() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proxy_service.max_recording_size.0, 1 << 30);
        for (text, bytes) in [("64KiB", 65536), ("2MB", 2_000_000), ("100000", 100_000)] {
            let c = Config::parse(&format!(
                "version: v1\nproxy_service:\n  max_recording_size: {text}\n"
            ))
            .unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(c.proxy_service.max_recording_size.0, bytes, "{text}");
        }
        for bad in ["12 parsecs", "1KiB", "-5", "99999999999999GiB"] {
            let e = Config::parse(&format!(
                "version: v1\nproxy_service:\n  max_recording_size: {bad}\n"
            ))
            .err()
            .unwrap_or_default();
            assert!(
                e.contains("max_recording_size") || e.contains("size"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn max_jumps_per_connection_defaults_to_ten_and_is_at_least_one() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proxy_service.max_jumps_per_connection, 10);
        let c = Config::parse("version: v1\nproxy_service: {}\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proxy_service.max_jumps_per_connection, 10);
        let c = Config::parse("version: v1\nproxy_service:\n  max_jumps_per_connection: 3\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proxy_service.max_jumps_per_connection, 3);
        let e = Config::parse("version: v1\nproxy_service:\n  max_jumps_per_connection: 0\n")
            .err()
            .unwrap_or_default();
        assert_eq!(e, "proxy_service.max_jumps_per_connection: at least 1");
    }

    #[test]
    fn errors_name_line_and_key() {
        let cases = [
            (
                "version: v1\nauth_service:\n  listen_adr: 127.0.0.1:1\n",
                "listen_adr",
                "line 3",
            ),
            (
                "version: v1\nproxy_service:\n  web_listen_addr: nonsense\n",
                "nonsense",
                "line 3",
            ),
            (
                "version: v1\nauth_service:\n  enabled: maybe\n",
                "enabled",
                "line 3",
            ),
        ];
        for (text, key, line) in cases {
            let e = Config::parse(text).err().unwrap_or_default();
            assert!(e.contains(key) && e.contains(line), "{text:?} gave {e:?}");
        }
    }

    #[test]
    fn diag_addr_is_off_by_default_and_an_address_when_set() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.sallyport.diag_addr, None);
        let c = Config::parse("version: v1\nsallyport:\n  diag_addr: 127.0.0.1:3000\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.sallyport.diag_addr, Some(([127, 0, 0, 1], 3000).into()));
        let e = Config::parse("version: v1\nsallyport:\n  diag_addr: localhost\n")
            .err()
            .unwrap_or_default();
        assert!(e.contains("diag_addr") && e.contains("line 3"), "{e}");
    }
}

#[cfg(test)]
mod kube_tests {
    use super::*;

    #[test]
    fn kube_service_is_off_by_default_and_its_example_parses() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.kube_service.enabled);
        assert!(!Config::all_in_one("/tmp/x".into()).kube_service.enabled);
        // The commented example in `sallyport configure`, uncommented, is valid.
        let start = DEFAULT_CONFIG
            .find("# kube_service:")
            .unwrap_or_else(|| panic!("no kube_service example"));
        let example: String = DEFAULT_CONFIG[start..]
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let c = Config::parse(&format!("version: v1\n{example}\n"))
            .unwrap_or_else(|e| panic!("{e}\n{example}"));
        let k = &c.kube_service;
        assert!(k.enabled);
        assert_eq!(k.cluster_name(), Ok("prod"));
        assert_eq!(
            k.kubeconfig_file.as_deref(),
            Some(Path::new("/etc/sallyport/kubeconfig"))
        );
        assert_eq!(k.labels.get("env").map(String::as_str), Some("prod"));
    }

    #[test]
    fn kube_service_needs_a_good_name_and_known_keys() {
        let cases = [
            (
                "kube_service: {enabled: true}",
                "kube_service.kube_cluster_name: required",
            ),
            (
                "kube_service: {enabled: true, kube_cluster_name: \"a b\"}",
                "kube_service.kube_cluster_name",
            ),
            (
                "kube_service:\n  enabled: true\n  kube_cluster_name: prod\n  kubeconfig: /x\n",
                "kubeconfig",
            ),
            (
                "kube_service: {enabled: true, kube_cluster_name: prod, labels: {kube_cluster: x}}",
                "kube_service.labels",
            ),
        ];
        for (text, needle) in cases {
            let e = Config::parse(&format!("version: v1\n{text}\n"))
                .err()
                .unwrap_or_default();
            assert!(e.contains(needle), "{text:?} gave {e:?}");
        }
        // An unknown key is named with its line, as everywhere in the file.
        let e =
            Config::parse("version: v1\nkube_service:\n  enabled: true\n  kube_cluster: prod\n")
                .err()
                .unwrap_or_default();
        assert!(e.contains("kube_cluster") && e.contains("line 4"), "{e}");
        let c = Config::parse(
            "version: v1\nkube_service:\n  enabled: true\n  kube_cluster_name: prod\n  commands:\n    - {name: v, command: [kubectl, version], period: 1h}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.kube_service.commands.len(), 1);
        assert_eq!(c.kube_service.kubeconfig_file, None);
    }
}

#[cfg(test)]
mod recordings_tests {
    use super::*;

    #[test]
    fn recordings_default_to_the_data_dir_and_name_s3_or_a_directory() {
        let base = "version: v1\n";
        let plain = Config::parse(base).unwrap_or_else(|e| panic!("{e}"));
        assert!(plain.recordings.is_none());
        let c = Config::parse(&format!(
            "{base}recordings: {{uri: s3://bucket/prefix, endpoint: http://127.0.0.1:9000, region: us-east-1}}\n"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let Some(r) = c.recordings else {
            panic!("no recordings section")
        };
        assert_eq!(r.uri, "s3://bucket/prefix");
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        Config::parse(&format!(
            "{base}recordings: {{uri: 'file:///srv/recordings'}}\n"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        // The commented example in `sallyport configure`, uncommented, is valid.
        let start = DEFAULT_CONFIG
            .find("# recordings:")
            .unwrap_or_else(|| panic!("no recordings example"));
        let end = DEFAULT_CONFIG
            .find("# A Kubernetes cluster")
            .unwrap_or_else(|| panic!("no kube_service example"));
        let example: String = DEFAULT_CONFIG[start..end]
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let c = Config::parse(&format!("{base}{example}\n"))
            .unwrap_or_else(|e| panic!("{e}\n{example}"));
        assert_eq!(
            c.recordings.map(|r| r.uri),
            Some("s3://my-bucket/sallyport".into())
        );
        for (yaml, said) in [
            (
                "recordings: {uri: 'gs://b'}",
                "recordings: uri \"gs://b\": unknown scheme",
            ),
            ("recordings: {uri: 's3://'}", "no bucket"),
            (
                "recordings: {uri: 's3://AKID:secret@b'}",
                "credentials do not go in the uri",
            ),
            (
                "recordings: {uri: 's3://b', endpoint: '127.0.0.1:9000'}",
                "use http(s)://HOST:PORT",
            ),
            (
                "recordings: {uri: 'file:///x', region: eu-west-1}",
                "for an s3:// store only",
            ),
            (
                "recordings: {uri: 's3://b', bucket: b}",
                "unknown field `bucket`",
            ),
            (
                "recordings: {endpoint: 'http://x:1'}",
                "missing field `uri`",
            ),
        ] {
            let Err(e) = Config::parse(&format!("{base}{yaml}\n")) else {
                panic!("{yaml} parsed")
            };
            assert!(e.contains(said), "{yaml}: {e}");
        }
    }
}

#[cfg(test)]
mod example_tests {
    #[test]
    fn shipped_example_parses() {
        let text = include_str!("../../config/sallyport.yaml");
        let c = super::Config::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.auth_service.cluster_name, "example");
    }
}
