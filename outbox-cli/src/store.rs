//! The store a URL names: PostgreSQL, MySQL/MariaDB or SQLite.

use std::time::Duration;

use outbox_core::store::OutboxAdmin;
use outbox_core::{InboxStore, StoreError};
use outbox_sqlx::mysql::MySqlStore;
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::sqlite::SqliteStore;
use outbox_sqlx::{Migrated, StoreConfig, TableNames, guard_cancelled_transactions};

use crate::error::CliError;

/// How long the command waits for a connection before it says the store is
/// unreachable (the default of sqlx's pools is 30 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One of the SQL stores, opened from a URL.
#[derive(Clone)]
pub enum Store {
    /// `postgres://` or `postgresql://`.
    Postgres(PgStore),
    /// `mysql://` or `mariadb://`.
    MySql(MySqlStore),
    /// `sqlite:PATH` or `sqlite://PATH`.
    Sqlite(SqliteStore),
}

/// A fleet tenant's store, from its id.
pub type StoreOf = std::sync::Arc<
    dyn Fn(&outbox_core::tenants::TenantId) -> Result<Store, StoreError> + Send + Sync,
>;

/// Where the tables are: a PostgreSQL schema, or a name prefix.
pub struct Tables {
    /// `--schema` (PostgreSQL only).
    pub schema: Option<String>,
    /// `--prefix` (default `outbox_`).
    pub prefix: Option<String>,
}

impl Tables {
    fn names(&self) -> Result<TableNames, CliError> {
        let names = match &self.prefix {
            Some(prefix) => TableNames::with_prefix(prefix).map_err(CliError::usage)?,
            None => TableNames::default(),
        };
        match &self.schema {
            Some(schema) => names.in_schema(schema).map_err(CliError::usage),
            None => Ok(names),
        }
    }
}

impl Store {
    /// Connects to the store `url` names. `create` lets a SQLite file be
    /// created (for `migrate`); every other command refuses a missing file
    /// rather than inspect an empty new one.
    pub async fn open(
        url: &str,
        tables: &Tables,
        create: bool,
        connections: u32,
    ) -> Result<Self, CliError> {
        let config = StoreConfig::with_tables(tables.names()?);
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => {
                let pool = guard_cancelled_transactions(sqlx::postgres::PgPoolOptions::new())
                    .max_connections(connections)
                    .acquire_timeout(CONNECT_TIMEOUT)
                    .connect(url)
                    .await
                    .map_err(|e| CliError::unreachable("PostgreSQL", e))?;
                Ok(Self::Postgres(PgStore::new(pool, config)))
            }
            "mysql" | "mariadb" => {
                let url = format!("mysql:{}", &url[scheme.len() + 1..]);
                let pool = guard_cancelled_transactions(sqlx::mysql::MySqlPoolOptions::new())
                    .max_connections(connections)
                    .acquire_timeout(CONNECT_TIMEOUT)
                    .connect(&url)
                    .await
                    .map_err(|e| CliError::unreachable("MySQL/MariaDB", e))?;
                Ok(Self::MySql(MySqlStore::new(pool, config)))
            }
            "sqlite" => {
                if tables.schema.is_some() {
                    return Err(CliError::usage(
                        "SQLite has no schemas; use --prefix for the table names",
                    ));
                }
                let path = url
                    .strip_prefix("sqlite://")
                    .or_else(|| url.strip_prefix("sqlite:"))
                    .unwrap_or_default();
                if path.is_empty() {
                    return Err(CliError::usage("a SQLite URL names a file: sqlite:PATH"));
                }
                if !create && !std::path::Path::new(path).exists() {
                    return Err(CliError::failure(format!(
                        "no SQLite database at {path} (run `outbox migrate` to create one)"
                    )));
                }
                let store = SqliteStore::open(path, config)
                    .await
                    .map_err(|e| CliError::unreachable("SQLite", e))?;
                Ok(Self::Sqlite(store))
            }
            _ => Err(CliError::usage(
                "the store URL must start with postgres://, postgresql://, mysql://, mariadb:// or sqlite:",
            )),
        }
    }

    /// The maintenance operations every store answers.
    pub fn admin(&self) -> &dyn OutboxAdmin {
        match self {
            Self::Postgres(store) => store,
            Self::MySql(store) => store,
            Self::Sqlite(store) => store,
        }
    }

    /// Creates or updates the tables (idempotent); refuses tables of
    /// another schema version.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        match self {
            Self::Postgres(store) => store.migrate().await,
            Self::MySql(store) => store.migrate().await,
            Self::Sqlite(store) => store.migrate().await,
        }
    }

    /// The tables' schema version (`None`: not migrated).
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        match self {
            Self::Postgres(store) => store.schema_version().await,
            Self::MySql(store) => store.schema_version().await,
            Self::Sqlite(store) => store.schema_version().await,
        }
    }

    /// Deletes at most `batch_size` inbox claims older than `older_than`.
    pub async fn purge_inbox(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        match self {
            Self::Postgres(store) => store.inbox().purge_older_than(older_than, batch_size).await,
            Self::MySql(store) => store.inbox().purge_older_than(older_than, batch_size).await,
            Self::Sqlite(store) => store.inbox().purge_older_than(older_than, batch_size).await,
        }
    }

    /// The database's name for the store kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "PostgreSQL",
            Self::MySql(_) => "MySQL/MariaDB",
            Self::Sqlite(_) => "SQLite",
        }
    }
}
