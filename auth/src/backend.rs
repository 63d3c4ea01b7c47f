//! The one place that touches storage: SQLite embedded in the data dir, or PostgreSQL shared by
//! several auth instances. Queries use the runtime API over `sqlx::Any` with `$n` placeholders,
//! which both databases accept, and store times as Unix seconds.

use futures::TryStreamExt;
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
        let Some(kind) = Kind::of(url) else {
            return Err(AuthError::BadRequest(format!(
                "unsupported storage URL {}: use sqlite:PATH or postgres://...",
                redact(url)
            )));
        };
        if let Some(mode) = unverified(url) {
            tracing::warn!(
                storage = %redact(url),
                "PostgreSQL on another host is reached with sslmode={mode}: unencrypted or encrypted to a server nobody verified, the CA keys and the audit log travel over it; add sslmode=verify-full (and sslrootcert=CA.pem) to the connection string"
            );
        }
        let max = if kind == Kind::Sqlite { 1 } else { 10 };
        let pool = connect(url, max).await?;
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

impl Kind {
    /// The database a storage URL names: `sqlite:PATH`, `postgres://...`.
    pub fn of(url: &str) -> Option<Kind> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Kind::Postgres)
        } else if url.starts_with("sqlite:") {
            Some(Kind::Sqlite)
        } else {
            None
        }
    }
}

/// The `sslmode` of a PostgreSQL URL (or of `PGSSLMODE`, as sqlx reads it) that does not check
/// the server's certificate, when the server is not on this host (loopback or a Unix socket):
/// `disable`, `allow`, `prefer` (PostgreSQL's default, which encrypts when offered and checks
/// nothing) or `require`.
fn unverified(url: &str) -> Option<&'static str> {
    use sqlx::postgres::{PgConnectOptions, PgSslMode};
    if Kind::of(url) != Some(Kind::Postgres) {
        return None;
    }
    let o: PgConnectOptions = url.parse().ok()?;
    let host = o.get_host();
    let local = o.get_socket().is_some()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if local {
        return None;
    }
    match o.get_ssl_mode() {
        PgSslMode::VerifyFull | PgSslMode::VerifyCa => None,
        PgSslMode::Disable => Some("disable"),
        PgSslMode::Allow => Some("allow"),
        PgSslMode::Prefer => Some("prefer"),
        PgSslMode::Require => Some("require"),
    }
}

/// A pool of at most `max` connections to `url`, one of them opened now (so a wrong address,
/// password or certificate is the error here, its URL without the password).
async fn connect(url: &str, max: u32) -> Result<AnyPool, AuthError> {
    sqlx::any::install_default_drivers();
    AnyPoolOptions::new()
        .max_connections(max)
        // SQLite's connection is a file in this process: it cannot have gone away, and a ping
        // before every query (sqlx's default) is a round trip to its worker thread for
        // nothing — ~7 of them on a session's grant. PostgreSQL's connections are pinged, so
        // one the server (or a failover) dropped is replaced before a query fails on it.
        .test_before_acquire(Kind::of(url) != Some(Kind::Sqlite))
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| AuthError::Storage(format!("cannot open storage {}: {e}", redact(url))))
}

/// Refuses a PostgreSQL database that holds tables none of Sallyport's migrations made,
/// before anything runs on it (`sallyport storage migrate`: another application's database is
/// left as it was).
pub async fn refuse_foreign(url: &str) -> Result<(), AuthError> {
    let pool = connect(url, 1).await?;
    let tables: Vec<String> = sqlx::query(
        "SELECT table_name::text AS t FROM information_schema.tables WHERE table_schema = current_schema()",
    )
    .fetch_all(&pool)
    .await?
    .iter()
    .map(|r| r.try_get("t"))
    .collect::<Result<_, _>>()?;
    pool.close().await;
    if !tables.is_empty() && !tables.iter().any(|t| t == "_sqlx_migrations") {
        return Err(AuthError::Conflict(format!(
            "the target database holds tables that are not Sallyport's ({}): give an empty database",
            tables.join(", ")
        )));
    }
    Ok(())
}

/// A value on its way from one database to the other: the schema holds only these two types.
enum Value {
    Int(Option<i64>),
    Text(Option<String>),
}

/// Rows per `INSERT` when copying: PostgreSQL takes at most 65,535 parameters a statement.
fn rows_per_insert(columns: usize) -> usize {
    (60_000 / columns.max(1)).clamp(1, 1_000)
}

impl Backend {
    /// Copies every table of this SQLite database into `to`, an empty PostgreSQL database
    /// (`sallyport storage migrate`): users, roles, the certificate authorities, nodes, tokens,
    /// sessions and the audit chain, row for row, so the cluster keeps its CA pin and the chain
    /// still verifies. One read snapshot of the source, one transaction on the target (its
    /// tables locked): a failure leaves the target's tables empty. The tables and their column
    /// types are the target's (its migrations have run); a column either side lacks is an error
    /// that names it.
    /// Returns each table with the rows copied.
    pub async fn copy_into(&self, to: &Backend) -> Result<Vec<(String, u64)>, AuthError> {
        if self.kind != Kind::Sqlite || to.kind != Kind::Postgres {
            return Err(AuthError::BadRequest(
                "storage is copied from SQLite into PostgreSQL only".into(),
            ));
        }
        let columns = sqlx::query(
            "SELECT table_name::text AS t, column_name::text AS c, data_type::text AS ty
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name::text NOT LIKE '\\_sqlx%'
             ORDER BY table_name, ordinal_position",
        )
        .fetch_all(&to.pool)
        .await?;
        let mut tables: Vec<(String, Vec<(String, bool)>)> = Vec::new();
        for row in &columns {
            let (t, c, ty): (String, String, String) =
                (row.try_get("t")?, row.try_get("c")?, row.try_get("ty")?);
            let int = match ty.as_str() {
                "bigint" | "integer" | "smallint" => true,
                "text" | "character varying" => false,
                other => {
                    return Err(AuthError::Storage(format!(
                        "column {t}.{c} has type {other}, which the copy does not know"
                    )));
                }
            };
            match tables.last_mut() {
                Some((last, cols)) if *last == t => cols.push((c, int)),
                _ => tables.push((t, vec![(c, int)])),
            }
        }
        if tables.is_empty() {
            return Err(AuthError::Storage(
                "the target database has no tables after its migrations".into(),
            ));
        }
        // Names go into the statements quoted, never bound: only the plain ones the migrations
        // use.
        let plain = |n: &str| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if let Some(bad) = tables
            .iter()
            .flat_map(|(t, cols)| std::iter::once(t).chain(cols.iter().map(|(c, _)| c)))
            .find(|n| !plain(n))
        {
            return Err(AuthError::Storage(format!(
                "the target database has a table or column named {bad:?}, which no migration makes"
            )));
        }
        // Every column the source holds must have somewhere to go: nothing is left behind.
        let source_columns = sqlx::query(
            "SELECT m.name AS t, p.name AS c FROM sqlite_master m, pragma_table_info(m.name) p
             WHERE m.type = 'table' AND m.name NOT LIKE '\\_sqlx%' ESCAPE '\\' AND m.name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
        )
        .fetch_all(&self.pool)
        .await?;
        for row in &source_columns {
            let (t, c): (String, String) = (row.try_get("t")?, row.try_get("c")?);
            let known = tables
                .iter()
                .any(|(tt, cols)| *tt == t && cols.iter().any(|(cc, _)| *cc == c));
            if !known {
                return Err(AuthError::Storage(format!(
                    "the source's column {t}.{c} has no place in the target: its migrations differ"
                )));
            }
        }
        let mut target = to.pool.begin().await?;
        for (t, _) in &tables {
            // No auth may start on the target while it is being filled.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "LOCK TABLE \"{t}\" IN ACCESS EXCLUSIVE MODE"
            )))
            .execute(&mut *target)
            .await?;
            let n: i64 = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM \"{t}\"")))
                .fetch_one(&mut *target)
                .await?
                .try_get(0)?;
            if n > 0 {
                return Err(AuthError::Conflict(format!(
                    "the target database already holds data (table {t} has {n} rows): \
                     storage is migrated into an empty database only"
                )));
            }
        }
        // One snapshot of the source for every table (WAL: writers go on, unseen).
        let mut source = self.pool.begin().await?;
        let mut copied = Vec::with_capacity(tables.len());
        for (t, cols) in &tables {
            let names = cols
                .iter()
                .map(|(c, _)| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ");
            // Streamed, a batch at a time: an audit log of millions of records is never
            // held whole.
            let per = rows_per_insert(cols.len());
            let mut rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {names} FROM \"{t}\"")))
                .fetch(&mut *source);
            let mut batch = Vec::with_capacity(per);
            let mut n = 0u64;
            loop {
                let row = rows
                    .try_next()
                    .await
                    .map_err(|e| AuthError::Storage(format!("reading table {t}: {e}")))?;
                let last = row.is_none();
                batch.extend(row);
                if batch.len() == per || (last && !batch.is_empty()) {
                    insert_rows(&mut target, t, &names, cols, &batch).await?;
                    n += batch.len() as u64;
                    batch.clear();
                }
                if last {
                    break;
                }
            }
            drop(rows);
            copied.push((t.clone(), n));
        }
        source.rollback().await?;
        target.commit().await.map_err(|e| {
            AuthError::Storage(format!(
                "the target did not confirm the copy ({e}): look at it before copying again"
            ))
        })?;
        Ok(copied)
    }
}

/// One `INSERT` of `rows` (read from SQLite as `cols` say) into table `t` of the target.
async fn insert_rows(
    target: &mut sqlx::Transaction<'static, sqlx::Any>,
    t: &str,
    names: &str,
    cols: &[(String, bool)],
    rows: &[AnyRow],
) -> Result<(), AuthError> {
    let mut values = Vec::with_capacity(rows.len() * cols.len());
    for row in rows {
        for (i, (c, int)) in cols.iter().enumerate() {
            let v = if *int {
                row.try_get::<Option<i64>, _>(i).map(Value::Int)
            } else {
                row.try_get::<Option<String>, _>(i).map(Value::Text)
            };
            values.push(v.map_err(|e| AuthError::Storage(format!("reading {t}.{c}: {e}")))?);
        }
    }
    let tuples = (0..rows.len())
        .map(|r| {
            let marks = (1..=cols.len())
                .map(|i| format!("${}", r * cols.len() + i))
                .collect::<Vec<_>>()
                .join(", ");
            format!("({marks})")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{t}\" ({names}) VALUES {tuples}"
    )));
    for v in values {
        q = match v {
            Value::Int(i) => q.bind(i),
            Value::Text(s) => q.bind(s),
        };
    }
    q.execute(&mut **target)
        .await
        .map_err(|e| AuthError::Storage(format!("writing table {t}: {e}")))?;
    Ok(())
}

/// Hides the password of a connection string.
pub fn redact(url: &str) -> String {
    let mut hide = vec![false; url.len()];
    // The user-info's password: from its `:` to the last `@` anywhere — a password may hold a
    // raw `@`, `/`, `?` or `#`, so nothing else can say where it ends (an `@` in the query hides
    // the host and more too: more hidden than needed, never less). A URL without `//` (a
    // typo) hides all of it past the scheme.
    if let Some(at) = url.rfind('@') {
        let from = match url.find("://") {
            Some(s) if s + 3 <= at => url[s + 3..at].find(':').map_or(at, |c| s + 3 + c + 1),
            _ => url.find(':').map_or(0, |c| c + 1).min(at),
        };
        hide[from..at].iter_mut().for_each(|h| *h = true);
    }
    // Passwords in the query (`?password=...`, as PostgreSQL's URLs allow), the key read as
    // the URL's parser reads it (`pass%77ord`, any case): each value to its `&`, `#` or end.
    for (sep, _) in url.match_indices(['?', '&']) {
        let seg_end = url[sep + 1..]
            .find(['&', '#'])
            .map_or(url.len(), |e| sep + 1 + e);
        let seg = &url[sep + 1..seg_end];
        let Some(eq) = seg.find('=') else { continue };
        let key: String = url::form_urlencoded::parse(&seg.as_bytes()[..eq])
            .map(|(k, _)| k.into_owned())
            .collect();
        if key.trim().eq_ignore_ascii_case("password") {
            hide[sep + 1 + eq + 1..seg_end]
                .iter_mut()
                .for_each(|h| *h = true);
        }
    }
    // Each hidden run (its ends are ASCII delimiters, so char boundaries) becomes `***`.
    let mut out = String::with_capacity(url.len());
    let mut i = 0;
    while i < url.len() {
        let run = hide[i..].iter().take_while(|&&h| h == hide[i]).count();
        if hide[i] {
            out.push_str("***");
        } else {
            out.push_str(&url[i..i + run]);
        }
        i += run;
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_remote_server_whose_certificate_is_not_checked_is_named() {
        use super::unverified;
        // The default (prefer, unless PGSSLMODE says otherwise), and modes that do not check,
        // to another host.
        if std::env::var_os("PGSSLMODE").is_none() {
            assert_eq!(unverified("postgres://u@db.example.com/s"), Some("prefer"));
        }
        assert_eq!(
            unverified("postgres://u@db.example.com/s?sslmode=prefer"),
            Some("prefer")
        );
        assert_eq!(
            unverified("postgres://u:p@10.0.0.5:5432/s?sslmode=require"),
            Some("require")
        );
        assert_eq!(
            unverified("postgresql://u@db.example.com/s?sslmode=disable"),
            Some("disable")
        );
        // Checked, or on this host: nothing to say.
        assert_eq!(
            unverified("postgres://u@db.example.com/s?sslmode=verify-full&sslrootcert=/ca.pem"),
            None
        );
        assert_eq!(
            unverified("postgres://u@db.example.com/s?sslmode=verify-ca"),
            None
        );
        assert_eq!(unverified("postgres://u@127.0.0.1:5432/s"), None);
        assert_eq!(unverified("postgres://u@localhost/s"), None);
        assert_eq!(unverified("postgres://u@[::1]:5432/s"), None);
        assert_eq!(unverified("postgres://u@%2Fvar%2Frun%2Fpostgresql/s"), None);
        assert_eq!(unverified("sqlite:/x/y.db"), None);
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            super::redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(super::redact("sqlite:/x/y.db"), "sqlite:/x/y.db");
        assert_eq!(
            super::redact("postgres://u@h/db?sslmode=verify-full&password=secret"),
            "postgres://u@h/db?sslmode=verify-full&password=***"
        );
        // The key spelled as a URL parser still reads it.
        for key in ["pass%77ord", "PASSWORD", "pass%77ord ", "%70assword"] {
            let r = super::redact(&format!("postgres://u@h/db?{key}=secret&x=1"));
            assert!(!r.contains("secret"), "{key}: {r}");
            assert!(r.ends_with("=***&x=1"), "{key}: {r}");
        }
        // A raw `@`, `/`, `?` or `#` in the password.
        for url in [
            "postgres://u:se@cret@h/db",
            "postgres://u:se/cret@h/db",
            "postgres://u:se#cret@h/db",
            "postgres://u:se?cret@h/db",
            "postgres://u:12?cret@h/db?sslmode=require",
        ] {
            let r = super::redact(url);
            assert!(!r.contains("cret"), "{url}: {r}");
            assert!(r.starts_with("postgres://u:***@h/db"), "{url}: {r}");
        }
        // A raw `@` in a query password, a port before it; no `//`.
        for url in [
            "postgres://h:5432/db?password=se@cret",
            "postgres://u:pw@h/db?password=se@cret",
            "postgres:u:se@cret@h",
            "postgres:/u:secret@h",
        ] {
            let r = super::redact(url);
            assert!(!r.contains("cret"), "{url}: {r}");
        }
        // An `@` in the query: the host is hidden with the password.
        let r = super::redact("postgres://u:secret@h/db?application_name=a@b");
        assert!(!r.contains("secret"), "{r}");
        assert!(r.starts_with("postgres://u:***@"), "{r}");
    }
}
