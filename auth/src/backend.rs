//! The one place that touches storage: SQLite embedded in the data dir, or PostgreSQL shared by
//! several auth instances. Queries use the runtime API over `sqlx::Any` with `$n` placeholders,
//! which both databases accept, and store times as Unix seconds.

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::AuthError;

/// Column `col` of `row` as one of the wire's words (`sallyport_core::api::NodeKind`, ...): a
/// word the database should never hold is an error that names it, not a string passed on.
pub(crate) fn word<T>(row: &AnyRow, col: &str) -> Result<T, AuthError>
where
    T: std::str::FromStr<Err = sallyport_core::api::UnknownValue>,
{
    let text: String = row.try_get(col)?;
    text.parse()
        .map_err(|e| AuthError::Internal(format!("column {col} in the database: {e}")))
}

/// Which database a backend speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone)]
pub struct Backend {
    pub pool: AnyPool,
    pub kind: Kind,
}

static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

impl Backend {
    /// Connects and runs the migrations of that database.
    pub async fn open(url: &str) -> Result<Self, AuthError> {
        sqlx::any::install_default_drivers();
        let kind = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Kind::Postgres
        } else if url.starts_with("sqlite:") {
            Kind::Sqlite
        } else {
            return Err(AuthError::BadRequest(format!(
                "unsupported storage URL {}: use sqlite:PATH or postgres://...",
                redact(url)
            )));
        };
        let max = if kind == Kind::Sqlite { 1 } else { 10 };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|e| AuthError::Storage(format!("cannot open storage {}: {e}", redact(url))))?;
        if kind == Kind::Sqlite {
            for pragma in [
                "PRAGMA journal_mode = WAL",
                "PRAGMA synchronous = NORMAL",
                "PRAGMA busy_timeout = 5000",
            ] {
                sqlx::query(pragma).execute(&pool).await?;
            }
        }
        let migrator = match kind {
            Kind::Sqlite => &SQLITE,
            Kind::Postgres => &POSTGRES,
        };
        migrator.run(&pool).await.map_err(|e| {
            AuthError::Storage(format!("migrations failed on {}: {e}", redact(url)))
        })?;
        Ok(Backend { pool, kind })
    }

    /// Whether the database answers now (`SELECT 1`), for readiness; the error says why not.
    pub async fn ping(&self) -> Result<(), AuthError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn get_state(&self, key: &str) -> Result<Option<String>, AuthError> {
        let row = sqlx::query("SELECT value FROM cluster_state WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r: AnyRow| r.try_get::<String, _>(0)).transpose()?)
    }

    /// Sets `key` only if it is not set yet; returns the value that is stored afterwards.
    pub async fn init_state(&self, key: &str, value: &str) -> Result<String, AuthError> {
        sqlx::query(
            "INSERT INTO cluster_state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(value)
        .execute(&self.pool)
        .await?;
        self.get_state(key)
            .await?
            .ok_or_else(|| AuthError::Storage(format!("state {key} vanished")))
    }
}

/// Hides the password of a connection string.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(
            super::redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(super::redact("sqlite:/x/y.db"), "sqlite:/x/y.db");
    }
}
