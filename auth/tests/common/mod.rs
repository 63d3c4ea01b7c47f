//! A database of its own on the shared PostgreSQL server of the tests
//! (`SALLYPORT_TEST_POSTGRES`, which `scripts/test` sets after starting PostgreSQL), made fresh
//! and dropped again when done.

/// Runs `sql` on the server's `postgres` database through `psql`; true if it succeeded.
fn psql(admin: &str, sql: &str) -> bool {
    std::process::Command::new("psql")
        .arg(admin)
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub struct PgDatabase {
    admin: String,
    name: String,
    /// The connection string of the new database.
    pub url: String,
}

impl PgDatabase {
    /// A fresh, empty database named `name`, unique to this test process.
    pub fn create(name: &str) -> PgDatabase {
        let base = std::env::var("SALLYPORT_TEST_POSTGRES").expect(
            "set SALLYPORT_TEST_POSTGRES=postgres://user:pass@127.0.0.1:5432 (scripts/test does)",
        );
        let admin = format!("{base}/postgres");
        let name = format!("{name}_{}", std::process::id());
        assert!(psql(&admin, &format!("DROP DATABASE IF EXISTS {name}")));
        assert!(
            psql(&admin, &format!("CREATE DATABASE {name}")),
            "cannot create database {name}"
        );
        PgDatabase {
            url: format!("{base}/{name}"),
            admin,
            name,
        }
    }
}

impl Drop for PgDatabase {
    /// Best effort, retried: FORCE cannot end a backend of another role, and an autovacuum
    /// worker (the server's own) may be in the new database for a moment. A database left
    /// behind is harmless; a test failed by the server's housekeeping would not be.
    fn drop(&mut self) {
        for _ in 0..20 {
            if psql(
                &self.admin,
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
}
