//! `sallyport storage migrate`: the all-in-one's embedded SQLite database copied into an empty
//! PostgreSQL database, the step from one box to several auth instances (README, "Running more
//! than one"). The copy itself is `sallyport_auth::backend::Backend::copy_into`.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use sallyport_auth::backend::{Backend, redact};

use crate::config::Config;

pub async fn migrate(config: Option<PathBuf>, data_dir: Option<PathBuf>, to: String) -> Result<()> {
    let mut cfg = match &config {
        Some(p) => Config::load(p).map_err(anyhow::Error::msg)?,
        None => Config::all_in_one(crate::start::default_data_dir()),
    };
    if let Some(d) = data_dir {
        cfg.sallyport.data_dir = d;
    }
    if !(to.starts_with("postgres://") || to.starts_with("postgresql://")) {
        bail!(
            "--to {}: give the PostgreSQL database to copy into, postgres://USER:PASSWORD@HOST:5432/DB",
            redact(&to)
        );
    }
    let db = cfg.sallyport.data_dir.join("sallyport.db");
    if !db.is_file() {
        bail!(
            "no SQLite database at {}: give the all-in-one's data directory (--data-dir or the config's sallyport.data_dir)",
            db.display()
        );
    }
    // `mode=rw`: an existing database only, never a new empty one.
    let source = Backend::open(&format!("sqlite:{}?mode=rw", db.display()))
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let target = Backend::open(&to).await.map_err(|e| anyhow!("{e}"))?;
    let copied = source
        .copy_into(&target)
        .await
        .map_err(|e| anyhow!("nothing was copied: {e}"))?;
    let mut out = format!("copied {} into {}:\n", db.display(), redact(&to));
    for (table, rows) in &copied {
        out.push_str(&format!("  {table:<24} {rows:>8} rows\n"));
    }
    out.push_str(&format!(
        "next: set `storage: {{type: postgres, conn_string: ...}}` under `sallyport` in the config, \
         keep the data directory (its audit-checkpoint.key signs the chain's checkpoints; \
         copy it to every other auth) and start sallyport; {} is no longer read.\n",
        db.display()
    ));
    print!("{out}");
    Ok(())
}
