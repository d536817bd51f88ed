//! Where a server's tenants come from: the rows of a query
//! ([`QueryTenants`]) or the schemas/databases holding an outbox
//! ([`CatalogTenants`]).

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_core::tenants::TenantId;

/// Tenant ids from text read off the database; a name that cannot be a
/// tenant id is refused loudly, not skipped.
fn tenant_ids(names: Vec<String>) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
    names
        .into_iter()
        .map(|name| TenantId::new(name).map_err(|e| StoreError::Config(e.to_string())))
        .collect()
}

/// The tenants a query returns, one text column a row (the rows of a
/// tenants table: `SELECT schema_name FROM tenants WHERE active`), on any
/// of the servers' pools.
#[derive(Clone, Debug)]
pub struct QueryTenants<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    query: String,
}

impl<DB: sqlx::Database> QueryTenants<DB> {
    /// Tenants as `query`'s rows.
    pub fn new(pool: sqlx::Pool<DB>, query: impl Into<String>) -> Self {
        Self {
            pool,
            query: query.into(),
        }
    }
}

#[async_trait]
impl<DB: TenantDatabase> outbox_core::tenants::TenantSource for QueryTenants<DB> {
    async fn tenants(&self) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
        use crate::error::ResultExt;
        let names = DB::fetch_texts(&self.pool, &self.query, Vec::new())
            .await
            .store()
            .map_err(|e| e.during("reading tenants", "the tenants query"))?;
        tenant_ids(names)
    }
}

/// Where a dialect lists its schemas or databases holding a table.
#[derive(Debug)]
pub(crate) struct Catalog {
    /// `$1`/`?` the name pattern, then the table; one text column a row.
    pub(crate) sql: &'static str,
    /// What the read is called in errors.
    pub(crate) during: &'static str,
    /// The catalog read.
    pub(crate) source: &'static str,
}

/// Every schema (PostgreSQL) or database (MySQL/MariaDB) of the server
/// whose name is `LIKE` a pattern and that holds an outbox (the events
/// table of `tables`' prefix): a tenant appears once `migrate()` has made
/// its tables there, and goes when it is dropped. Built by
/// `PgSchemaTenants::new` or `MySqlDatabaseTenants::new`.
#[derive(Clone, Debug)]
pub struct CatalogTenants<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    pattern: String,
    events_table: String,
    catalog: &'static Catalog,
}

impl<DB: sqlx::Database> CatalogTenants<DB> {
    pub(crate) fn in_catalog(
        pool: sqlx::Pool<DB>,
        pattern: String,
        catalog: &'static Catalog,
    ) -> Self {
        Self {
            pool,
            pattern,
            events_table: format!("{}_events", crate::TableNames::default().prefix()),
            catalog,
        }
    }

    /// Looks for the events table of `tables`' prefix instead of the
    /// default one (the schema in `tables` is not read).
    pub fn with_tables(mut self, tables: &crate::TableNames) -> Self {
        self.events_table = format!("{}_events", tables.prefix());
        self
    }
}

#[async_trait]
impl<DB: TenantDatabase> outbox_core::tenants::TenantSource for CatalogTenants<DB> {
    async fn tenants(&self) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
        use crate::error::ResultExt;
        let binds = vec![self.pattern.clone(), self.events_table.clone()];
        let names = DB::fetch_texts(&self.pool, self.catalog.sql, binds)
            .await
            .store()
            .map_err(|e| e.during(self.catalog.during, self.catalog.source))?;
        tenant_ids(names)
    }
}

/// An sqlx database the tenant sources can read their rows from: every
/// database of sqlx whose pool runs queries and decodes text (PostgreSQL,
/// MySQL/MariaDB). Implemented for each such database; its one method
/// carries the sqlx bounds so the sources need not repeat them.
#[async_trait]
pub trait TenantDatabase: sqlx::Database {
    /// The rows of `sql`, with `binds` bound in order, as text columns
    /// (`None` for SQL NULL).
    async fn fetch_texts_rows(
        pool: &sqlx::Pool<Self>,
        sql: &str,
        binds: Vec<String>,
    ) -> Result<Vec<Vec<Option<String>>>, sqlx::Error>;

    /// The first column of each row of `sql`, with `binds` bound in order.
    async fn fetch_texts(
        pool: &sqlx::Pool<Self>,
        sql: &str,
        binds: Vec<String>,
    ) -> Result<Vec<String>, sqlx::Error> {
        Self::fetch_texts_rows(pool, sql, binds)
            .await?
            .into_iter()
            .map(|row| match row.into_iter().next() {
                Some(Some(text)) => Ok(text),
                Some(None) => Err(sqlx::Error::Protocol(
                    "the tenants query returned NULL for a tenant".into(),
                )),
                None => Err(sqlx::Error::Protocol(
                    "the tenants query returned a row without columns".into(),
                )),
            })
            .collect()
    }
}

#[async_trait]
impl<DB> TenantDatabase for DB
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    async fn fetch_texts_rows(
        pool: &sqlx::Pool<Self>,
        sql: &str,
        binds: Vec<String>,
    ) -> Result<Vec<Vec<Option<String>>>, sqlx::Error> {
        use sqlx::Row;
        let mut query = sqlx::query(sql);
        for bind in binds {
            query = query.bind(bind);
        }
        let rows = query.fetch_all(pool).await?;
        rows.iter()
            .map(|row| (0..row.len()).map(|i| row.try_get(i)).collect())
            .collect()
    }
}
