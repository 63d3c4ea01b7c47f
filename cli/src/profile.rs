//! The logged-in profile under `$SALLY_HOME` (default `~/.sally`):
//!
//! ```text
//! profile.json             who, where, until when; the cluster's host TLS CA
//! known_hosts              @cert-authority lines for the host SSH CA
//! keys/<proxy>/<user>      Ed25519 private key, OpenSSH format (0600)
//! keys/<proxy>/<user>.pub
//! keys/<proxy>/<user>-cert.pub     SSH user certificate
//! keys/<proxy>/<user>.key.pem      the same key, PKCS#8 PEM for TLS and kubectl (0600)
//! keys/<proxy>/<user>-x509.pem     X.509 client certificate
//! keys/<proxy>/<user>-kube/<cluster>-x509.pem   kubeconfig certificate, one per Kubernetes
//!                          cluster, cached by `sally kube credentials` (0600)
//! keys/<proxy>/ca-pin      the CA pin a sign-up verified, trusted until a login saves the CA
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    pub proxy: String,
    pub user: String,
    pub cluster: String,
    pub roles: Vec<String>,
    pub logins: Vec<String>,
    pub valid_until: String,
    pub tls_host_ca_pem: String,
}

/// The profile directory a program using this library chose ([`use_home`]).
static HOME: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Makes `dir` this process's profile directory, before `SALLY_HOME` and `~/.sally`: for a
/// program that links this library and cannot set the environment safely (its threads may be
/// reading it). Once per process; false if it was already chosen.
pub fn use_home(dir: PathBuf) -> bool {
    HOME.set(dir).is_ok()
}

pub fn home() -> PathBuf {
    if let Some(h) = HOME.get() {
        return h.clone();
    }
    if let Some(h) = std::env::var_os("SALLY_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".sally")
}

/// Paths of one profile's files.
pub struct Paths {
    pub dir: PathBuf,
    pub key: PathBuf,
    pub public: PathBuf,
    pub ssh_cert: PathBuf,
    pub tls_key: PathBuf,
    pub tls_cert: PathBuf,
}

/// The proxy to talk to now: `proxy` itself, or when it lists several (`sally login --proxy
/// a:3080,b:3080`), the first that accepts a connection, in order (a proxy that is gone costs
/// one refused or timed-out connect, then the next is used). With none reachable, the first,
/// so the error names it.
pub fn reachable(proxy: &str) -> String {
    let list: Vec<&str> = proxy
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if list.len() <= 1 {
        return list.first().unwrap_or(&proxy).to_string();
    }
    let probe = || {
        for addr in &list {
            let Ok(addrs) = std::net::ToSocketAddrs::to_socket_addrs(addr) else {
                continue;
            };
            for a in addrs {
                if std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(3))
                    .is_ok()
                {
                    return addr.to_string();
                }
            }
        }
        list[0].to_string()
    };
    // The probe blocks (name lookups, connects of up to 3 s): called from async code, it tells
    // the runtime so, which hands this worker's other tasks on meanwhile.
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(probe)
        }
        _ => probe(),
    }
}

/// A file name for the proxy address (`127.0.0.1:3080` → `127.0.0.1_3080`).
fn dir_name(proxy: &str) -> String {
    proxy
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Profile {
    /// The proxy to connect to now (see [`reachable`]).
    pub fn addr(&self) -> String {
        reachable(&self.proxy)
    }

    pub fn paths(&self) -> Paths {
        paths_for(&home(), &self.proxy, &self.user)
    }

    pub fn load() -> Result<Option<Profile>> {
        let p = home().join("profile.json");
        match std::fs::read(&p) {
            Ok(bytes) => {
                Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                    format!("{} is unreadable", p.display())
                })?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow!("cannot read {}: {e}", p.display())),
        }
    }

    pub fn require() -> Result<Profile> {
        Self::load()?.ok_or_else(|| {
            anyhow!("not logged in; run `sally login --proxy HOST:3080 --user NAME`")
        })
    }

    pub fn save(&self) -> Result<()> {
        let h = home();
        ensure_private_dir(&h)?;
        write_file(
            &h.join("profile.json"),
            serde_json::to_string_pretty(self)?.as_bytes(),
            0o600,
        )
    }

    /// Unix seconds of `valid_until`.
    pub fn expires(&self) -> Option<i64> {
        time::OffsetDateTime::parse(
            &self.valid_until,
            &time::format_description::well_known::Rfc3339,
        )
        .ok()
        .map(|t| t.unix_timestamp())
    }
}

pub fn paths_for(home: &Path, proxy: &str, user: &str) -> Paths {
    let dir = home.join("keys").join(dir_name(proxy));
    Paths {
        key: dir.join(user),
        public: dir.join(format!("{user}.pub")),
        ssh_cert: dir.join(format!("{user}-cert.pub")),
        tls_key: dir.join(format!("{user}.key.pem")),
        tls_cert: dir.join(format!("{user}-x509.pem")),
        dir,
    }
}

/// Remembers the CA pin a sign-up verified `proxy` with, so that the `sally login` it prints
/// works without `--ca-pin` (a login then saves the CA itself in the profile).
pub fn save_pin(proxy: &str, pin: &str) -> Result<()> {
    let h = home();
    ensure_private_dir(&h)?;
    let dir = h.join("keys").join(dir_name(proxy));
    ensure_private_dir(&h.join("keys"))?;
    ensure_private_dir(&dir)?;
    write_file(&dir.join("ca-pin"), format!("{pin}\n").as_bytes(), 0o600)
}

/// The pin [`save_pin`] kept for `proxy`.
pub fn saved_pin(proxy: &str) -> Result<Option<String>> {
    let p = home().join("keys").join(dir_name(proxy)).join("ca-pin");
    match std::fs::read_to_string(&p) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow!("cannot read {}: {e}", p.display())),
    }
}

pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set permissions on {}", dir.display()))
}

/// Writes atomically with `mode` from the moment the file exists.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    sallyport_core::files::replace(path, data, mode)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Removes the profile and every key; returns whether there was anything to remove.
pub fn remove_all() -> Result<bool> {
    let h = home();
    let mut removed = false;
    for p in [h.join("profile.json"), h.join("known_hosts")] {
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("cannot remove {}", p.display()))?;
            removed = true;
        }
    }
    let keys = h.join("keys");
    if keys.exists() {
        std::fs::remove_dir_all(&keys)
            .with_context(|| format!("cannot remove {}", keys.display()))?;
        removed = true;
    }
    Ok(removed)
}
