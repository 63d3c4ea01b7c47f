//! `sallyport storage migrate`: the all-in-one's embedded SQLite database copied into an empty
//! PostgreSQL database, the step from one box to several auth instances (README, "Running more
//! than one"). The copy itself is `sallyport_auth::backend::Backend::copy_into`.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use sallyport_auth::backend::{Backend, Kind, redact};

pub async fn migrate(config: Option<PathBuf>, data_dir: Option<PathBuf>, to: String) -> Result<()> {
    let cfg = crate::start::config_of(config.as_deref(), data_dir)?;
    if Kind::of(&to) != Some(Kind::Postgres) {
        // Not echoed: it may hold a password in another form.
        bail!(
            "--to: give the PostgreSQL database to copy into as a URL, postgres://USER@HOST:5432/DB (the password in PGPASSWORD)"
        );
    }
    let db = cfg.sallyport.data_dir.join("sallyport.db");
    if !db.is_file() {
        bail!(
            "no SQLite database at {}: give the all-in-one's data directory (--data-dir or the config's sallyport.data_dir)",
            db.display()
        );
    }
    // Whatever a running daemon wrote after the copy began would be missing from PostgreSQL.
    let _stopped = crate::start::lock_data_dir(&cfg.sallyport.data_dir)?;
    // `mode=rw`: an existing database only, never a new empty one.
    let source = Backend::open(&format!("sqlite:{}?mode=rw", db.display()))
        .await
        .map_err(|e| anyhow!("{e}"))?;
    sallyport_auth::backend::refuse_foreign(&to)
        .await
        .map_err(|e| anyhow!("nothing was copied: {e}"))?;
    let target = Backend::open(&to).await.map_err(|e| anyhow!("{e}"))?;
    // Anything but an unconfirmed commit (which says so) leaves the target's tables empty.
    let copied = source
        .copy_into(&target)
        .await
        .map_err(|e| anyhow!("the copy failed: {e}"))?;
    let mut out = format!("copied {} into {}:\n", db.display(), redact(&to));
    for (table, rows) in &copied {
        out.push_str(&format!("  {table:<24} {rows:>8} rows\n"));
    }
    out.push_str(&format!(
        "next: set `storage: {{type: postgres, conn_string: ...}}` under `sallyport` in the config, \
         keep the data directory (its audit-checkpoint.key signs the chain's checkpoints; \
         copy it to every other auth) and start sallyport. {} is no longer read, yet still holds \
         the CA keys and password hashes: move it somewhere only root reads, or delete it, and \
         never start the old config again (the cluster would split in two).\n",
        db.display()
    ));
    print!("{out}");
    Ok(())
}
