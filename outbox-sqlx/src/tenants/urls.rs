//! Tenants spread over servers: each tenant's row names the URL of the
//! database holding its outbox (and, if it wants, the schema); the tenants
//! of one server share one pool, made when the first of them starts.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use outbox_core::tenants::{TenantId, TenantSource};
use outbox_core::{StoreError, WakeUp};

use super::TenantStores;
use super::sources::TenantDatabase;
use crate::without_password;

/// Where one tenant's outbox is, as its row says.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantPlace {
    /// The database's URL, credentials included (never logged nor shown:
    /// `Debug` hides the password).
    pub url: String,
    /// The schema (MySQL/MariaDB: the database) of its tables, when the
    /// row names one; else the URL's database (MySQL/MariaDB) or the
    /// configured tables' schema.
    pub schema: Option<String>,
}

impl fmt::Debug for TenantPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantPlace")
            .field("url", &without_password(&self.url))
            .field("schema", &self.schema)
            .finish()
    }
}

/// Each tenant's place as the last good read of a [`UrlTenants`] found
/// it, shared with the [`UrlTenantStores`] that open them (clones share).
#[derive(Clone, Default)]
pub struct TenantUrls(Arc<Mutex<HashMap<TenantId, TenantPlace>>>);

impl TenantUrls {
    fn edit<R>(&self, change: impl FnOnce(&mut HashMap<TenantId, TenantPlace>) -> R) -> R {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces every place by `places`.
    pub fn set(&self, places: HashMap<TenantId, TenantPlace>) {
        self.edit(|now| *now = places);
    }

    /// Where `tenant` is, if the last read listed it.
    pub fn place(&self, tenant: &TenantId) -> Option<TenantPlace> {
        self.edit(|now| now.get(tenant).cloned())
    }
}

impl fmt::Debug for TenantUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenants = self.edit(|now| now.len());
        f.debug_struct("TenantUrls")
            .field("tenants", &tenants)
            .finish()
    }
}

/// The tenants a query returns with where each one's outbox is: rows of
/// text columns `(tenant, url)` or `(tenant, url, schema)` (`SELECT id,
/// database_url FROM tenants WHERE active`). A tenant's URL is read when
/// its relay starts: a changed URL applies from its next start.
#[derive(Clone, Debug)]
pub struct UrlTenants<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    query: String,
    urls: TenantUrls,
}

impl<DB: sqlx::Database> UrlTenants<DB> {
    /// Tenants and their places as `query`'s rows, read on `pool` (the
    /// database of the tenants table).
    pub fn new(pool: sqlx::Pool<DB>, query: impl Into<String>) -> Self {
        Self {
            pool,
            query: query.into(),
            urls: TenantUrls::default(),
        }
    }

    /// The places this source reads, for [`UrlTenantStores::new`].
    pub fn urls(&self) -> TenantUrls {
        self.urls.clone()
    }
}

/// A row's place, or why the row is refused.
fn place(row: Vec<Option<String>>) -> Result<(String, TenantPlace), sqlx::Error> {
    let columns = row.len();
    let mut row = row.into_iter();
    match (row.next(), row.next(), row.next()) {
        (Some(Some(tenant)), Some(Some(url)), schema) if columns <= 3 => Ok((
            tenant,
            TenantPlace {
                url,
                schema: schema.flatten(),
            },
        )),
        (Some(_), Some(_), _) if columns <= 3 => Err(sqlx::Error::Protocol(
            "the tenants query returned NULL for a tenant or its URL".into(),
        )),
        _ => Err(sqlx::Error::Protocol(format!(
            "the tenants query returned {columns} columns; it must return (tenant, url) or (tenant, url, schema)"
        ))),
    }
}

#[async_trait]
impl<DB: TenantDatabase> TenantSource for UrlTenants<DB> {
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError> {
        use crate::error::ResultExt;
        let rows = DB::fetch_texts_rows(&self.pool, &self.query, Vec::new())
            .await
            .and_then(|rows| rows.into_iter().map(place).collect::<Result<Vec<_>, _>>())
            .store()
            .map_err(|e| e.during("reading tenants", "the tenants query"))?;
        let mut places = HashMap::with_capacity(rows.len());
        for (name, place) in rows {
            let tenant = TenantId::new(name).map_err(|e| StoreError::Config(e.to_string()))?;
            if places.insert(tenant.clone(), place).is_some() {
                return Err(StoreError::Config(format!(
                    "the tenants query lists tenant {tenant} twice"
                )));
            }
        }
        let tenants = places.keys().cloned().collect();
        self.urls.set(places);
        Ok(tenants)
    }
}

/// Which pool a URL's tenants share, and the schema the URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerPlace {
    /// The pool's URL: tenants whose URLs give the same one share a pool.
    pub server: String,
    /// The schema (MySQL/MariaDB: database) the URL names, if any.
    pub schema: Option<String>,
}

/// A dialect's [`TenantStores`] on one server's pool, which
/// [`UrlTenantStores`] makes once per server.
pub trait ServerStores: TenantStores + Clone {
    /// The pool `url`'s tenant shares and the schema the URL names
    /// (PostgreSQL: a pool per database, since a connection serves one;
    /// MySQL/MariaDB: a pool per server, the database being a schema).
    fn locate(url: &str) -> Result<ServerPlace, StoreError>;

    /// The store of the tables in `schema` (`None`: the configured
    /// tables' own).
    fn store_in(&self, schema: Option<&str>) -> Result<Self::Store, StoreError>;
}

/// Makes the stores of one server from its pool's URL.
type MakeServer<T> = Arc<dyn Fn(&str) -> Result<T, StoreError> + Send + Sync>;

/// Each tenant's store at the place its row names: the tenants of one
/// server (one database on PostgreSQL) share one pool, made when the first
/// of them starts. A tenant whose URL is bad, or whose server refuses it,
/// fails alone.
pub struct UrlTenantStores<T> {
    urls: TenantUrls,
    servers: Arc<Mutex<HashMap<String, T>>>,
    make: MakeServer<T>,
}

impl<T> Clone for UrlTenantStores<T> {
    fn clone(&self) -> Self {
        Self {
            urls: self.urls.clone(),
            servers: self.servers.clone(),
            make: self.make.clone(),
        }
    }
}

impl<T> fmt::Debug for UrlTenantStores<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UrlTenantStores")
            .field("urls", &self.urls)
            .field("servers", &self.servers().len())
            .finish()
    }
}

impl<T> UrlTenantStores<T> {
    /// The servers' pools made so far, by pool URL (passwords hidden).
    pub fn servers(&self) -> Vec<String> {
        let servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        let mut urls: Vec<String> = servers.keys().map(|url| without_password(url)).collect();
        urls.sort();
        urls
    }
}

impl<T: ServerStores> UrlTenantStores<T> {
    /// The stores at the places in `urls`, a server's made by `make` from
    /// its pool's URL (`PgTenantStores::lazy`, `MySqlTenantStores::lazy`:
    /// a pool that connects on first use, so that a server that is down
    /// fails only its tenants).
    pub fn new(
        urls: TenantUrls,
        make: impl Fn(&str) -> Result<T, StoreError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            urls,
            servers: Arc::default(),
            make: Arc::new(make),
        }
    }

    /// `tenant`'s server's stores and the schema of its tables.
    fn server(&self, tenant: &TenantId) -> Result<(T, Option<String>), StoreError> {
        let place = self.urls.place(tenant).ok_or_else(|| {
            StoreError::Config(format!(
                "tenant {tenant}: the tenants query has not listed it"
            ))
        })?;
        let located = T::locate(&place.url)
            .map_err(|e| StoreError::Config(format!("tenant {tenant}'s URL: {e}")))?;
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        let stores = match servers.get(&located.server) {
            Some(stores) => stores.clone(),
            None => {
                let stores = (self.make)(&located.server)?;
                servers.insert(located.server, stores.clone());
                stores
            }
        };
        Ok((stores, place.schema.or(located.schema)))
    }
}

#[async_trait]
impl<T: ServerStores> TenantStores for UrlTenantStores<T> {
    type Store = T::Store;

    fn store(&self, tenant: &TenantId) -> Result<T::Store, StoreError> {
        let (stores, schema) = self.server(tenant)?;
        stores.store_in(schema.as_deref())
    }

    async fn migrate(&self, tenant: &TenantId, store: &T::Store) -> Result<(), StoreError> {
        self.server(tenant)?.0.migrate(tenant, store).await
    }

    async fn check(&self, tenant: &TenantId, store: &T::Store) -> Result<(), StoreError> {
        self.server(tenant)?.0.check(tenant, store).await
    }

    async fn wake_up(
        &self,
        tenant: &TenantId,
        store: &T::Store,
    ) -> Result<Option<Box<dyn WakeUp>>, StoreError> {
        self.server(tenant)?.0.wake_up(tenant, store).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_never_shows_its_password() {
        let place = TenantPlace {
            url: "postgres://app:s3cret@db-eu:5432/acme".into(),
            schema: None,
        };
        let shown = format!("{place:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("postgres://app:***@db-eu:5432/acme"),
            "{shown}"
        );
    }
}
