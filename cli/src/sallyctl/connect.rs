//! Who `sallyctl` acts as: the local admin identity in the daemon's data dir (`--data-dir`, or
//! `--config` naming it), talking mTLS to auth directly, or else the user `sally login` logged
//! in, reaching auth through the proxy's passthrough.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use sallyport_core::tls::{Trust, private_key_from_pem};
use sallyport_core::x509::pem_to_ders;
use serde::Deserialize;

use super::Cli;
use crate::http::Api;
use crate::profile::Profile;

#[derive(Deserialize)]
pub(super) struct AdminIdentity {
    auth_addr: String,
    cert_pem: String,
    key_pem: String,
    host_ca_pem: String,
}

#[derive(Deserialize)]
pub(super) struct LooseConfig {
    #[serde(default)]
    sallyport: LooseGlobal,
}

#[derive(Deserialize, Default)]
pub(super) struct LooseGlobal {
    data_dir: Option<PathBuf>,
}

/// Connects to auth as the local admin (data dir) or as the logged-in user (through the proxy).
pub(super) fn connect(cli: &Cli) -> Result<Api> {
    let dir = match (&cli.data_dir, &cli.config) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(c)) => {
            let text = std::fs::read_to_string(c)
                .with_context(|| format!("cannot read config {}", c.display()))?;
            let cfg: LooseConfig = serde_saphyr::from_str(&text)
                .map_err(|e| anyhow!("config {}: {e}", c.display()))?;
            Some(
                cfg.sallyport
                    .data_dir
                    .unwrap_or_else(|| PathBuf::from("/var/lib/sallyport")),
            )
        }
        (None, None) => None,
    };
    if let Some(dir) = dir {
        let path = dir.join("admin-identity.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            anyhow!("cannot read the admin identity {}: {e}; run sallyctl on the auth host as the user that runs `sallyport start`, after it started once", path.display())
        })?;
        let id: AdminIdentity = serde_json::from_str(&text)
            .with_context(|| format!("{} is unreadable", path.display()))?;
        let identity = (
            pem_to_ders(&id.cert_pem)?,
            private_key_from_pem(&id.key_pem)?,
        );
        return Api::new(
            &id.auth_addr,
            "the auth service",
            Trust::Roots(pem_to_ders(&id.host_ca_pem)?),
            Some(identity),
            None,
        );
    }
    let p = Profile::load()?.ok_or_else(|| {
        anyhow!("no identity: pass --data-dir DIR (or --config FILE) on the auth host, or log in with `sally login`")
    })?;
    crate::http::user_api(&p)
}
