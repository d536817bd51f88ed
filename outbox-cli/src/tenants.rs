//! `outbox status --all-tenants PATTERN` / `--tenant-urls QUERY`: one
//! line per tenant (a PostgreSQL schema or a MySQL/MariaDB database `LIKE`
//! the pattern that holds an outbox, or a row of the query naming its URL),
//! and their sum. A tenant whose read fails gets its error on its line;
//! the others are still read.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::StoreError;
use outbox_core::store::EventTypeStats;
use outbox_core::tenants::TenantId;
use outbox_core::tenants::TenantSource;
use outbox_sqlx::StoreConfig;
use outbox_sqlx::TableNames;
use outbox_sqlx::mysql::{MySqlDatabaseTenants, MySqlTenantStores};
use outbox_sqlx::postgres::{PgSchemaTenants, PgTenantStores};
use outbox_sqlx::tenants::{
    CatalogTenants, ServerStores, TenantDatabase, TenantStores, UrlTenantStores, UrlTenants,
};
use serde_json::{Value, json};

use crate::args::Output;
use crate::error::CliError;
use crate::store::{Store, StoreOf, Tables};

/// One tenant's totals over its event types.
#[derive(Default)]
struct Totals {
    claimable: u64,
    oldest: Option<Duration>,
    parked: u64,
    in_flight: u64,
    failed: u64,
}

impl Totals {
    fn of(stats: &EventTypeStats) -> Self {
        Self {
            claimable: stats.claimable,
            oldest: stats.oldest_claimable_age,
            parked: stats.parked,
            in_flight: stats.in_flight,
            failed: stats.failed,
        }
    }

    fn sum(&mut self, other: &Totals) {
        self.claimable += other.claimable;
        self.oldest = self.oldest.max(other.oldest);
        self.parked += other.parked;
        self.in_flight += other.in_flight;
        self.failed += other.failed;
    }

    fn json(&self) -> Value {
        json!({
            "claimable": self.claimable,
            "oldest_claimable_age_seconds": self.oldest.map(|a| a.as_secs_f64()),
            "parked": self.parked,
            "in_flight": self.in_flight,
            "failed": self.failed,
        })
    }

    fn line(&self, name: &str) -> String {
        let oldest = self
            .oldest
            .map_or_else(|| "-".to_owned(), |a| format!("{:.1}", a.as_secs_f64()));
        format!(
            "{name:<40} {:>10} {oldest:>12} {:>8} {:>10} {:>8}",
            self.claimable, self.parked, self.in_flight, self.failed
        )
    }
}

/// Which tenants `status` reads.
pub enum Which {
    /// `--all-tenants PATTERN`.
    SchemasLike(String),
    /// `--tenant-urls QUERY`.
    Urls(String),
}

/// Connections of each tenant server's pool when tenants are named by URL.
const URL_CONNECTIONS: u32 = 2;

/// A tenant's store as `status` reads it.
fn store_of<T: TenantStores>(stores: T, wrap: fn(T::Store) -> Store) -> StoreOf {
    Arc::new(move |t| Ok(wrap(stores.store(t)?)))
}

/// How one dialect finds its tenants on a server and opens their stores.
struct Dialect<DB: sqlx::Database, T: ServerStores> {
    /// The tenants whose schema (database) is `LIKE` a pattern.
    catalog: fn(sqlx::Pool<DB>, String) -> CatalogTenants<DB>,
    /// Every tenant's store on the server's pool.
    stores: fn(sqlx::Pool<DB>, StoreConfig) -> T,
    /// The stores of a server named by a tenant's URL.
    lazy: fn(&str, u32, StoreConfig) -> Result<T, StoreError>,
    /// The store as `status` reads it.
    wrap: fn(T::Store) -> Store,
}

/// PostgreSQL: a schema per tenant.
const POSTGRES: Dialect<sqlx::Postgres, PgTenantStores> = Dialect {
    catalog: |pool, pattern| PgSchemaTenants::new(pool, pattern),
    stores: PgTenantStores::new,
    lazy: PgTenantStores::lazy,
    wrap: Store::Postgres,
};

/// MySQL/MariaDB: a database per tenant.
const MYSQL: Dialect<sqlx::MySql, MySqlTenantStores> = Dialect {
    catalog: |pool, pattern| MySqlDatabaseTenants::new(pool, pattern),
    stores: MySqlTenantStores::new,
    lazy: MySqlTenantStores::lazy,
    wrap: Store::MySql,
};

impl<DB: TenantDatabase, T: ServerStores> Dialect<DB, T> {
    /// The tenants `which` names on `pool`'s server, and how to open each
    /// one's store (with the tables named as `tables`).
    async fn tenants(
        self,
        pool: sqlx::Pool<DB>,
        tables: TableNames,
        which: Which,
    ) -> Result<(BTreeSet<TenantId>, StoreOf), CliError> {
        let config = StoreConfig::with_tables(tables.clone());
        match which {
            Which::SchemasLike(pattern) => {
                let tenants = (self.catalog)(pool.clone(), pattern).with_tables(&tables);
                let stores = (self.stores)(pool, config);
                Ok((tenants.tenants().await?, store_of(stores, self.wrap)))
            }
            Which::Urls(query) => {
                let tenants = UrlTenants::<DB>::new(pool, query);
                let lazy = self.lazy;
                let stores = UrlTenantStores::new(tenants.urls(), move |url| {
                    lazy(url, URL_CONNECTIONS, config.clone())
                });
                Ok((tenants.tenants().await?, store_of(stores, self.wrap)))
            }
        }
    }
}

/// Prints every tenant's line and the sum.
pub async fn status(
    store: &Store,
    tables: &Tables,
    which: Which,
    output: Output,
) -> Result<(), CliError> {
    if tables.schema.is_some() {
        return Err(CliError::usage(
            "--all-tenants and --tenant-urls read every tenant's schema: remove --schema",
        ));
    }
    let (tenants, stores) = match store {
        Store::Postgres(pg) => {
            let tables = pg.config().tables.clone();
            POSTGRES.tenants(pg.pool().clone(), tables, which).await?
        }
        Store::MySql(my) => {
            let tables = my.config().tables.clone();
            MYSQL.tenants(my.pool().clone(), tables, which).await?
        }
        Store::Sqlite(_) => {
            return Err(CliError::usage(
                "--all-tenants, --tenant-urls: PostgreSQL (a schema per tenant) or MySQL/MariaDB (a database per tenant) only",
            ));
        }
    };
    let mut all = Totals::default();
    let mut rows = Vec::new();
    for tenant in &tenants {
        let read = match stores(tenant) {
            Ok(store) => store.admin().stats().await,
            Err(error) => Err(error),
        };
        let row = match read {
            Ok(stats) => {
                let mut totals = Totals::default();
                stats.iter().for_each(|s| totals.sum(&Totals::of(s)));
                all.sum(&totals);
                Ok(totals)
            }
            Err(error) => Err(error.to_string()),
        };
        rows.push((tenant.to_string(), row));
    }
    if output == Output::Json {
        let tenants: Vec<Value> = rows
            .iter()
            .map(|(tenant, row)| match row {
                Ok(totals) => json!({ "tenant": tenant, "totals": totals.json() }),
                Err(error) => json!({ "tenant": tenant, "error": error }),
            })
            .collect();
        println!("{}", json!({ "tenants": tenants, "all": all.json() }));
        return Ok(());
    }
    println!(
        "{:<40} {:>10} {:>12} {:>8} {:>10} {:>8}",
        "tenant", "claimable", "oldest (s)", "parked", "in flight", "failed"
    );
    for (tenant, row) in &rows {
        match row {
            Ok(totals) => println!("{}", totals.line(tenant)),
            Err(error) => println!("{tenant:<40} error: {error}"),
        }
    }
    println!("{}", all.line(&format!("all {} tenants", rows.len())));
    Ok(())
}
