//! A database of its own on the shared PostgreSQL server of the tests
//! (`SALLYPORT_TEST_POSTGRES`, which `scripts/test` sets after starting PostgreSQL), made fresh
//! and dropped again when done.

use std::process::Command;
use std::time::Duration;

/// The test server's base URL, `postgres://user:password@host:port` (no database).
pub fn postgres_base() -> String {
    std::env::var("SALLYPORT_TEST_POSTGRES").expect(
        "set SALLYPORT_TEST_POSTGRES=postgres://user:pass@127.0.0.1:5432 (scripts/test does)",
    )
}

/// Runs `sql` on the server's `postgres` database through `psql`: Ok, or psql's complaint.
pub fn psql(base: &str, sql: &str) -> Result<(), String> {
    psql_on(&format!("{base}/postgres"), sql)
}

/// Runs `sql` on the database at `url` through `psql`.
fn psql_on(url: &str, sql: &str) -> Result<(), String> {
    let out = Command::new("psql")
        .arg(url)
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .map_err(|e| format!("psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("psql: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

pub struct PgDatabase {
    base: String,
    /// The database's name, unique to this test process.
    pub name: String,
    /// The connection string of the new database.
    pub url: String,
}

impl PgDatabase {
    /// A fresh, empty database named `prefix_PID`.
    pub fn create(prefix: &str) -> PgDatabase {
        let base = postgres_base();
        let name = format!("{prefix}_{}", std::process::id());
        if let Err(e) = psql(&base, &format!("DROP DATABASE IF EXISTS {name}"))
            .and_then(|()| psql(&base, &format!("CREATE DATABASE {name}")))
        {
            panic!("cannot make database {name}: {e}");
        }
        PgDatabase {
            url: format!("{base}/{name}"),
            base,
            name,
        }
    }

    /// Runs `sql` in this database.
    pub fn sql(&self, sql: &str) -> Result<(), String> {
        psql_on(&self.url, sql)
    }

    /// Drops it now, retried: FORCE cannot end an autovacuum worker (the server's own role)
    /// that may be in the database for a moment. True once it is gone.
    pub fn drop_now(&self) -> bool {
        crate::eventually(Duration::from_secs(20), || {
            psql(
                &self.base,
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            )
            .is_ok()
        })
    }
}

impl Drop for PgDatabase {
    /// Best effort: a database left behind is harmless; a test failed by the server's
    /// housekeeping would not be.
    fn drop(&mut self) {
        self.drop_now();
    }
}
